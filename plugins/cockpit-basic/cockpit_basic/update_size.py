"""Size of the optimizer's update."""

from typing import Any

import torch

from cockpit_basic._norms import norms
from cockpit_core import StepContext, TwoStepQuantity


class UpdateSize(TwoStepQuantity):
    """Update size ``||theta_{s+1} - theta_s||`` per parameter and in total.

    Two-step: the parameters are copied at a tracked step ``s`` and compared at the next
    step; the value is stored under ``s`` (the step whose update it measures), as in
    Cockpit 1.0.2. It measures whatever the optimizer did (momentum, Adam, weight decay).
    Under FSDP2 each process copies and compares its own rows.
    """

    name = "update_size"
    shards = True  # FSDP2: ctx.params are this process's rows; norms() sums over processes

    def compute_start(self, ctx: StepContext) -> Any:
        """Copy the parameters before the optimizer step (one fused copy of all of them)."""
        params: list[torch.Tensor] = list(ctx.params)
        with torch.no_grad():
            return torch._foreach_clone(params)

    def compute_end(self, ctx: StepContext, state: Any) -> dict[str, Any]:
        """Return ``{"total": ..., "per_param": [...]}`` of the parameter change."""
        params: list[torch.Tensor] = list(ctx.params)
        with torch.no_grad():
            return norms(torch._foreach_sub(params, state))
