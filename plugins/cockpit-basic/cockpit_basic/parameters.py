"""Snapshots of the parameter values."""

import numpy as np

from cockpit_core import Quantity, StepContext


class Parameters(Quantity):
    """Copies of all parameters, one numpy array per parameter (memory: the model size per step)."""

    name = "parameters"

    def compute(self, ctx: StepContext) -> list[np.ndarray]:
        """Return a numpy copy of each parameter."""
        return [p.detach().cpu().numpy().copy() for p in ctx.params]
