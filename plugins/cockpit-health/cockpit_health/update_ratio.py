"""Update-to-parameter ratio: the optimizer's step relative to the weights it moves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from cockpit_core import StepContext, TwoStepQuantity, layered
from cockpit_health._norms import whole_norms


class UpdateRatio(TwoStepQuantity):
    """Relative update size ``||theta_{s+1} - theta_s|| / ||theta_s||`` per parameter and total.

    With ``theta_{s,i}`` the values of parameter ``i`` during step ``s`` and
    ``Delta_i = theta_{s+1,i} - theta_{s,i}`` what the optimizer changed,

        per_param[i] = ||Delta_i||_2 / ||theta_{s,i}||_2,
        total        = ||Delta||_2 / ||theta_s||_2   (norms over all parameters).

    ``total`` is the ratio of the total norms, not a mean of the per-parameter ratios.
    It measures the real change, so it is exact under any optimizer (momentum, Adam,
    weight decay, clipping, a scheduler). A ratio around ``1e-3`` per weight matrix is the
    usual healthy scale for Adam-type training (the "update/weight ratio" rule of thumb of
    CS231n's training notes; LLM trainers log it per parameter, e.g. OLMo-core's
    optimization diagnostics option ``track_update_param_ratio``, and the muP literature,
    Yang et al. 2022, "Tensor Programs V", sets per-layer learning rates so that relative
    updates keep their scale as width grows). Much larger ratios (``>1e-2``) mean the
    optimizer rewrites a layer in a few steps (instability ahead); much smaller ones
    (``<1e-4``) a layer that barely learns.

    Two-step: the parameters are copied at a tracked step ``s`` and compared at the next
    step the Cockpit sees; the value is stored under ``s`` (as ``update_size``). A
    parameter with ``||theta_{s,i}|| = 0`` (e.g. a bias initialised to zero) has ratio
    ``inf`` if it moved and ``nan`` if it did not; the dashboard marks both. Norms as in
    :func:`cockpit_health._norms.norms` (float32 reductions, float64 for float64
    weights); the difference is taken in the parameters' dtype (at least float32, so
    bfloat16/float16 weights are subtracted exactly), in place in the copy.

    Output: ``{"total": float, "per_param": np.ndarray}``. Memory: one copy of the model
    between the two steps (under FSDP2 each process copies and compares its own rows).
    """

    name = "update_ratio"
    shards = True  # FSDP2: rows of ctx.params; whole_norms sums over processes

    def compute_start(self, ctx: StepContext) -> tuple[Tensor, list[Tensor]]:
        """``(||theta_s,i||, copies of the parameters)`` before the optimizer step."""
        with torch.no_grad():
            return whole_norms(ctx.params), list(torch._foreach_clone(list(ctx.params)))

    def compute_end(self, ctx: StepContext, state: tuple[Tensor, list[Tensor]]) -> dict[str, Any]:
        """Return ``{"total": ..., "per_param": [...]}`` of ``||Delta theta|| / ||theta_s||``."""
        before, copies = state
        with torch.no_grad():
            change = whole_norms(_changes(ctx.params, copies))
            per_param = change / before  # x / 0 = inf, 0 / 0 = nan, as documented
            total = change.norm() / before.norm()
        return layered(total, per_param)


EXACT = (torch.float32, torch.float64)
"""Dtypes whose copies become the difference in place (one fused subtraction per dtype)."""


def _changes(after: Sequence[Tensor], copies: list[Tensor]) -> list[Tensor]:
    """``copies - after`` (the update, negated: norms only), in place where exact.

    Call under ``torch.no_grad()``. A copy of float32 or float64 parameters becomes the
    difference itself (no new tensor; one ``torch._foreach_sub_`` per device and dtype);
    lower-precision parameters are subtracted in float32, where the difference of two
    bfloat16/float16 values is exact.
    """
    changes = list(copies)
    same: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, (a, c) in enumerate(zip(after, copies)):
        if a.dtype == c.dtype and c.dtype in EXACT and a.device == c.device:
            same.setdefault((c.device, c.dtype), []).append(i)
        else:
            dtype = torch.promote_types(torch.promote_types(a.dtype, c.dtype), torch.float32)
            changes[i] = c.to(dtype) - a.to(dtype)
    for index in same.values():
        torch._foreach_sub_([copies[i] for i in index], [after[i] for i in index])
    return changes
