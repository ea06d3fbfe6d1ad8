"""L2 norm of the parameters."""

from __future__ import annotations

from typing import Any

from cockpit_core import Quantity, StepContext, layered
from cockpit_health._norms import whole_norms


class ParamNorm(Quantity):
    """Parameter norm ``||theta||_2`` per parameter and over all parameters.

    With ``theta_i`` the values of parameter ``i`` during the step (before the optimizer
    step that follows the backward pass),

        per_param[i] = ||theta_i||_2,    total = sqrt(sum_i ||theta_i||_2^2) = ||theta||_2.

    Megatron-LM logs the total as ``params-norm`` (``--log-params-norm``); a steady climb
    signals weight growth that weight decay does not hold back, a drop that decay (or a
    too-large update) shrinks the weights, and a jump the step that broke the run.
    Reduced in float32 (float64 for float64 weights), a few fused kernels for the whole
    model: relative error about ``1e-6`` (:func:`cockpit_health._norms.norms`). Under FSDP2
    each process reduces its rows and the squares are summed over the processes.

    Output: ``{"total": float, "per_param": np.ndarray}``, ``per_param`` in the order of
    the parameters the Cockpit tracks. Cost: one pass over the parameters.
    """

    name = "param_norm"
    shards = True  # FSDP2: rows of ctx.params; whole_norms sums over processes

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": ||theta||, "per_param": [||theta_i||]}``."""
        per_param = whole_norms(ctx.params)
        return layered(per_param.norm(), per_param)
