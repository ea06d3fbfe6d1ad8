"""Inner-product test of Bollapragada, Byrd & Nocedal (2018): is -g a descent direction."""

from __future__ import annotations

from typing import Any

import torch

from cockpit_core import BATCH_L2, BATCH_PROJECTION, Quantity, Requirements, StepContext, layered
from cockpit_gradient_tests._common import gram_reductions


class InnerTest(Quantity):
    """Largest ``theta`` for which the inner-product test passes.

    The inner-product test of Bollapragada, Byrd & Nocedal (2018), "Adaptive sampling
    strategies for stochastic optimization", Eq. (2.6) and the line after it, accepts the
    batch if the projections of the per-sample gradients on the mini-batch gradient vary
    little: ``Var_n(g_n . g) / B <= theta^2 ||g||^4``, with the sample variance
    ``Var_n(g_n . g) = sum_n (g_n . g - ||g||^2)^2 / (B - 1)``. The value reported is

        theta_max = sqrt( sum_n (g_n . g - ||g||^2)^2 / (B (B - 1) ||g||^4) ).

    The projections ``g_n . g`` come from ``BATCH_PROJECTION`` (computed after backward,
    so they combine exactly across DDP processes). A small value means that
    ``-g`` is a descent direction with high probability; Bollapragada et al. use
    theta around 0.9.

    Output: ``{"total": theta_max, "per_param": [theta_max of each parameter]}`` (the test
    applied to each parameter's block of the gradient alone).
    """

    name = "inner_test"
    shards = True  # FSDP2: rows of ctx.grads; _common sums over processes
    REQUIREMENTS = Requirements(statistics=(BATCH_PROJECTION, BATCH_L2))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": float, "per_param": np.ndarray}`` of ``theta_max``."""
        batch_size, proj, _, grad_sq = gram_reductions(ctx, self.key)
        return layered(
            _theta_max(proj.sum(0), grad_sq.sum(), batch_size),
            _theta_max(proj, grad_sq, batch_size),
        )


def _theta_max(proj: torch.Tensor, grad_sq: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``sqrt(sum_n (proj_n - ||g||^2)^2 / (B (B-1) ||g||^4))`` along the last axis of ``proj``."""
    variance = (proj - grad_sq.unsqueeze(-1)).pow(2).sum(-1) / (batch_size - 1)
    return (variance / (batch_size * grad_sq.pow(2))).sqrt()
