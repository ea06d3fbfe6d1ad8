"""The mini-batch loss."""

from cockpit_core import Quantity, Requirements, StepContext


class Loss(Quantity):
    """Mini-batch loss ``info["loss"]`` as a float."""

    name = "loss"
    REQUIREMENTS = Requirements(info=frozenset({"loss"}))

    def compute(self, ctx: StepContext) -> float:
        """Return ``float(info["loss"])``."""
        return float(ctx.info["loss"].detach())
