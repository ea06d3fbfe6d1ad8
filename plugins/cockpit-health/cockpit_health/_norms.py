"""L2 norms in float64 and the per-layer output format ``{"total", "per_param"}``."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
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


def layered(total: Tensor | float, per_param: Tensor) -> dict[str, float | np.ndarray]:
    """The output format ``{"total": float, "per_param": np.ndarray}`` (one entry per parameter)."""
    return {
        "total": float(total),
        "per_param": per_param.detach().to("cpu", torch.float64).numpy(),
    }
