"""L2 norms of many tensors: a few fused reductions, float64 results."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cockpit_core import shard_sum


def groups(tensors: Sequence[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[int]]:
    """The positions of ``tensors`` grouped by device and dtype, in order of first appearance."""
    out: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        out.setdefault((t.device, t.dtype), []).append(i)
    return out


def whole_norms(tensors: Sequence[Tensor]) -> Tensor:
    """:func:`norms` of the whole parameters when ``tensors`` are FSDP2 rows.

    Under FSDP2 (a quantity that declares ``shards = True``) the tensors are this process's
    rows: their squared norms are summed over the processes
    (:func:`~cockpit_core.shard_sum`) before the square root. Elsewhere :func:`norms`.
    """
    per_param = norms(tensors)
    squares = per_param.square()
    summed = shard_sum(squares)
    return per_param if summed is squares else summed.sqrt()


def norms(tensors: Sequence[Tensor]) -> Tensor:
    """``[||t_i||]`` of each tensor, as a float64 CPU tensor.

    float64 tensors are reduced in float64, every other dtype in float32 (bfloat16 and
    float16 are upcast inside the reduction, never copied): torch's vectorized reductions
    keep the relative error near ``1e-6`` even for tens of millions of entries, three
    orders of magnitude below the precision the health signals are read at, and an
    explicit float64 copy of every weight costs about ten times as much. The tensors are
    grouped by device and dtype into one ``torch._foreach_norm`` call each (a handful of
    kernels for a whole model, as ``torch.nn.utils.clip_grad_norm_`` does), under
    ``torch.no_grad()`` (no per-tensor ``detach``); only the norms leave the device, one
    transfer per group.
    """
    if not tensors:
        return torch.zeros(0, dtype=torch.float64)
    parts, order = [], []
    with torch.no_grad():
        for (_, dtype), index in groups(tensors).items():
            acc = torch.float64 if dtype == torch.float64 else torch.float32
            group = [tensors[i] for i in index] if len(index) < len(tensors) else list(tensors)
            parts.append(torch.stack(torch._foreach_norm(group, 2, dtype=acc)).double().cpu())
            order.extend(index)
    if len(parts) == 1:
        return parts[0]
    out = torch.empty(len(tensors), dtype=torch.float64)
    out[torch.tensor(order)] = torch.cat(parts)
    return out
