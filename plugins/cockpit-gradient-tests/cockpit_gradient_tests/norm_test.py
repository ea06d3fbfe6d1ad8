"""Norm test of Byrd et al. (2012): is the mini-batch gradient accurate enough in norm."""

from __future__ import annotations

from typing import Any

import torch

from cockpit_core import BATCH_L2, Quantity, Requirements, StepContext, layered
from cockpit_gradient_tests._common import grad_squared_norms, per_sample64


class NormTest(Quantity):
    """Largest ``theta`` for which the norm test passes.

    The norm test of Byrd, Chin, Nocedal & Wu (2012), "Sample size selection in
    optimization methods for machine learning", Eq. (3.9), accepts the batch if the
    estimated variance of the mini-batch gradient is small relative to its norm:
    ``Var_n(g_n)_l1 / B <= theta^2 ||g||^2``, with the sample variance
    ``Var_n(g_n)_l1 = sum_n ||g_n - g||^2 / (B - 1)``. The value reported is

        theta_max = sqrt( sum_n ||g_n - g||^2 / (B (B - 1) ||g||^2) ),

    computed as ``sum_n ||g_n||^2 - B ||g||^2`` from the per-sample squared norms
    (``BATCH_L2``). Small values mean the gradient direction is reliable; Byrd et al.
    suggest theta around 0.5-0.9 and increasing the batch when theta_max exceeds it.

    Output: ``{"total": theta_max, "per_param": [theta_max of each parameter]}`` (the test
    applied to each parameter's block of the gradient alone).
    """

    name = "norm_test"
    shards = True  # FSDP2: rows of ctx.grads; _common sums over processes
    REQUIREMENTS = Requirements(statistics=(BATCH_L2,))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": float, "per_param": np.ndarray}`` of ``theta_max``."""
        batch_l2 = per_sample64(ctx, BATCH_L2, self.key)
        batch_size = batch_l2.shape[1]
        sum_sq, grad_sq = batch_l2.sum(1), grad_squared_norms(ctx)
        return layered(
            _theta_max(sum_sq.sum(), grad_sq.sum(), batch_size),
            _theta_max(sum_sq, grad_sq, batch_size),
        )


def _theta_max(sum_sq: torch.Tensor, grad_sq: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``sqrt(max(0, sum_n ||g_n||^2 - B ||g||^2) / (B (B-1) ||g||^2))``."""
    variance_l1 = (sum_sq - batch_size * grad_sq).clamp(min=0) / (batch_size - 1)
    return (variance_l1 / (batch_size * grad_sq)).sqrt()
