"""Snapshots of the parameter values."""

import numpy as np

from cockpit_core import Quantity, StepContext


class Parameters(Quantity):
    """Copies of all parameters, one numpy array per parameter (memory: the model size per step).

    Not under FSDP2 (``fully_shard``): a copy of the whole parameters would gather them on
    one process, so it reads ``ctx.params`` without declaring shards and is refused there.
    """

    name = "parameters"

    def compute(self, ctx: StepContext) -> list[np.ndarray]:
        """Return a numpy copy of each parameter."""
        return [p.detach().cpu().numpy().copy() for p in ctx.params]
