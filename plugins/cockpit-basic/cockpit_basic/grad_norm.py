"""L2 norm of the mini-batch gradient."""

from typing import Any

from cockpit_basic._norms import norms
from cockpit_core import Quantity, StepContext


class GradNorm(Quantity):
    """Gradient norm ``||g||_2`` per parameter and over all parameters."""

    name = "grad_norm"
    shards = True  # FSDP2: ctx.grads are this process's rows; norms() sums over processes

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": ||g||, "per_param": [||g_i||]}``."""
        return norms(ctx.grads)
