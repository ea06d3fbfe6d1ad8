"""L2 norms in float64, one tensor at a time."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


def norms64(tensors: Iterable[Tensor]) -> Tensor:
    """``[||t_i||]`` of each tensor, computed in float64, as a float64 CPU tensor.

    One tensor at a time (``torch.linalg.vector_norm(t, dtype=float64)``): given a
    generator, each tensor can be freed before the next is made. Only the norms leave the
    device, in one transfer when all tensors share a device.
    """
    values = [torch.linalg.vector_norm(t.detach(), dtype=torch.float64) for t in tensors]
    if not values:
        return torch.zeros(0, dtype=torch.float64)
    if len({v.device for v in values}) > 1:
        values = [v.cpu() for v in values]
    return torch.stack(values).cpu()
