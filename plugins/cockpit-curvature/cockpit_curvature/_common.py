"""Helpers shared by the curvature quantities: curvature statistics, flat vectors, errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from cockpit_core import (
    DIAG_GGN_EXACT,
    DIAG_HESSIAN,
    Statistic,
    StepContext,
    UnsupportedModelError,
    diag_ggn_mc,
)

DiagCurvature = Literal["diag_hessian", "diag_ggn_exact", "diag_ggn_mc"]

ALIASES = {"diag_h": "diag_hessian"}
"""Cockpit 1.0.2 spellings accepted for the curvature options."""


def normalize_curvature(value: Any) -> Any:
    """Map Cockpit 1.0.2's ``"diag_h"`` to ``"diag_hessian"``; leave everything else."""
    return ALIASES.get(value, value) if isinstance(value, str) else value


def curvature_statistic(curvature: str, mc_samples: int) -> Statistic:
    """The statistic holding the diagonal named by ``curvature``."""
    if curvature == "diag_hessian":
        return DIAG_HESSIAN
    if curvature == "diag_ggn_exact":
        return DIAG_GGN_EXACT
    if curvature == "diag_ggn_mc":
        return diag_ggn_mc(mc_samples)
    raise ValueError(f"unknown curvature {curvature!r}")


def read_diagonal(ctx: StepContext, stat: Statistic, owner: str, hint: str) -> list[Tensor]:
    """``ctx.stat(stat)``, with a hint of what to do if the model is unsupported."""
    try:
        return ctx.stat(stat)
    except UnsupportedModelError as err:
        raise UnsupportedModelError(f"{err} For '{owner}': {hint}") from None


def total_and_per_param(per_param: Sequence[Tensor | float]) -> dict[str, Any]:
    """``{"total": sum, "per_param": np.ndarray}`` in float64."""
    values = np.array([float(v) for v in per_param], dtype=np.float64)
    return {"total": float(values.sum()), "per_param": values}


def flatten(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenate flattened tensors into one vector."""
    return torch.cat([t.reshape(-1) for t in tensors])


def split_like(vector: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    """Split a flat vector into views shaped like ``like``."""
    parts = torch.split(vector, [t.numel() for t in like])
    return [p.view_as(t) for p, t in zip(parts, like)]


def step_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator whose stream depends on ``seed`` and ``step`` only."""
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(step)) % (2**63 - 1))
