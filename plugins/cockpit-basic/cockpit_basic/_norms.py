"""Per-parameter and total L2 norms, the output format of the norm-like basic quantities."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from cockpit_core import layered


def norms(tensors: Sequence[torch.Tensor]) -> dict[str, float | np.ndarray]:
    """``{"total": ||concat(tensors)||, "per_param": [||t_i||]}`` computed without concatenating."""
    per_param = torch.stack([t.detach().double().norm() for t in tensors])
    return layered(per_param.norm(), per_param)
