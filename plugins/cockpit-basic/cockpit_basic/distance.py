"""Distance of the parameters from where tracking began."""

from typing import Any

import torch

from cockpit_basic._norms import norms
from cockpit_core import Quantity, StepContext


class Distance(Quantity):
    """L2 distance ``||theta_t - theta_0||`` from the parameters at the first tracked step.

    ``theta_0`` is copied at the first step this quantity is tracked, whatever its number,
    and kept in the core cache for the whole run (memory: one copy of the model; under
    FSDP2 each process keeps its own rows, one copy of its shard).
    """

    name = "distance"
    shards = True  # FSDP2: ctx.params are this process's rows; norms() sums over processes

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": ..., "per_param": [...]}``; zero at the first tracked step."""
        params: list[torch.Tensor] = list(ctx.params)
        with torch.no_grad():  # one fused operation for all parameters, no autograd graph
            start = ctx.cache.get("initial_params")
            if start is None:
                start = torch._foreach_clone(params)
                ctx.cache.put("initial_params", start)
            return norms(torch._foreach_sub(params, start))
