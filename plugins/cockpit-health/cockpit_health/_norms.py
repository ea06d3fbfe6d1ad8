"""L2 norms of many tensors: a few fused reductions, float64 results."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def norms(tensors: Sequence[Tensor]) -> Tensor:
    """``[||t_i||]`` of each tensor, as a float64 CPU tensor.

    float64 tensors are reduced in float64, every other dtype in float32 (bfloat16 and
    float16 are upcast inside the reduction, never copied): torch's vectorized reductions
    keep the relative error near ``1e-6`` even for tens of millions of entries, three
    orders of magnitude below the precision the health signals are read at, and an
    explicit float64 copy of every weight costs about ten times as much. The tensors are
    grouped by device and dtype into one ``torch._foreach_norm`` call each (a handful of
    kernels for a whole model, as ``torch.nn.utils.clip_grad_norm_`` does); only the
    norms leave the device, one transfer per device.
    """
    if not tensors:
        return torch.zeros(0, dtype=torch.float64)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out = torch.empty(len(tensors), dtype=torch.float64)
    for (_, dtype), index in groups.items():
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        group = [tensors[i].detach() for i in index]
        values = torch.stack(torch._foreach_norm(group, 2, dtype=acc)).double().cpu()
        out[torch.tensor(index)] = values
    return out
