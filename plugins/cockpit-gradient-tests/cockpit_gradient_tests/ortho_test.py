"""Orthogonality test of Bollapragada, Byrd & Nocedal (2018): is the direction of g reliable."""

from __future__ import annotations

from typing import Any

import torch

from cockpit_core import BATCH_L2, BATCH_PROJECTION, Quantity, Requirements, StepContext, layered
from cockpit_gradient_tests._common import gram_reductions


class OrthoTest(Quantity):
    """Largest ``nu`` for which the orthogonality test passes.

    The orthogonality test of Bollapragada, Byrd & Nocedal (2018), "Adaptive sampling
    strategies for stochastic optimization", Eq. (3.3), bounds the variance of the parts
    of the per-sample gradients orthogonal to the mini-batch gradient,
    ``r_n = g_n - (g_n . g / ||g||^2) g``:
    ``sum_n ||r_n||^2 / (B (B - 1)) <= nu^2 ||g||^2``. The value reported is

        nu_max = sqrt( (sum_n ||g_n||^2 - sum_n (g_n . g)^2 / ||g||^2) / (B (B - 1) ||g||^2) ),

    with ``||g_n||^2`` from ``BATCH_L2`` and the projections ``g_n . g`` from
    ``BATCH_PROJECTION`` (both combine exactly across DDP processes). A small value means the per-sample
    gradients agree on the direction of ``g``.

    Output: ``{"total": nu_max, "per_param": [nu_max of each parameter]}`` (the test
    applied to each parameter's block of the gradient alone).
    """

    name = "ortho_test"
    shards = True  # FSDP2: rows of ctx.grads; _common sums over processes
    REQUIREMENTS = Requirements(statistics=(BATCH_PROJECTION, BATCH_L2))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": float, "per_param": np.ndarray}`` of ``nu_max``."""
        batch_size, proj, sum_sq, grad_sq = gram_reductions(ctx, self.key)
        return layered(
            _nu_max(proj.sum(0), sum_sq.sum(), grad_sq.sum(), batch_size),
            _nu_max(proj, sum_sq, grad_sq, batch_size),
        )


def _nu_max(
    proj: torch.Tensor, sum_sq: torch.Tensor, grad_sq: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """``sqrt(max(0, sum_n ||g_n||^2 - sum_n proj_n^2 / ||g||^2) / (B (B-1) ||g||^2))``."""
    orthogonal = (sum_sq - proj.pow(2).sum(-1) / grad_sq).clamp(min=0) / (batch_size - 1)
    return (orthogonal / (batch_size * grad_sq)).sqrt()
