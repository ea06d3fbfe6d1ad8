"""Per-parameter and total L2 norms, the output format of the norm-like basic quantities."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from cockpit_core import layered, shard_sum


@torch.no_grad()
def norms(tensors: Sequence[torch.Tensor]) -> dict[str, float | np.ndarray]:
    """``{"total": ||concat(tensors)||, "per_param": [||t_i||]}`` computed without concatenating.

    One ``torch._foreach_norm`` for all tensors instead of a few operations per tensor,
    accumulated in float64 (the same kernel and values as ``t.double().norm()`` of each).
    Under FSDP2 ``tensors`` are this process's rows: the squared norms are summed over the
    processes (:func:`~cockpit_core.shard_sum`) before the square root; elsewhere the
    norms are used as they are.
    """
    per_param = torch.stack(torch._foreach_norm(list(tensors), 2, dtype=torch.float64))
    squares = per_param.square()
    summed = shard_sum(squares)
    if summed is not squares:  # sharded: the whole parameters' norms
        per_param = summed.sqrt()
    return layered(per_param.norm(), per_param)
