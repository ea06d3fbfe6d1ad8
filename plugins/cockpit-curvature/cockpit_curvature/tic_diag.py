"""Takeuchi information criterion with a diagonal curvature approximation."""

from __future__ import annotations

import torch
from torch import Tensor

from cockpit_curvature._tic import TICBase


class TICDiag(TICBase):
    """Takeuchi information criterion with a diagonal curvature (Thomas et al., 2020).

    Thomas et al. (2020), AISTATS, approximate ``tr(H^-1 C)`` by::

        TIC_diag = sum_j m_j / (h_j + epsilon),   m_j = (1/B) sum_n g_{n,j}^2

    with ``h`` the curvature diagonal (exact Hessian by default, or estimated with error
    bars) and ``g_n`` the gradient of sample ``n``'s loss. Same value as Cockpit 1.0.2's
    ``TICDiag`` with the defaults. ``per_param`` holds the sum over each parameter's
    entries; ``total`` is their sum. With an estimated ``h`` the delta-method weights are
    ``w_j = -m_j / (h_j + epsilon)^2``: entries with small curvature dominate the error.
    """

    name = "tic_diag"

    def combine(self, pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, list[Tensor]]:
        """``sum_j m_j / (h_j + eps)`` per parameter, and their sum."""
        eps = self.config.epsilon
        per_param = [(m / (h + eps)).sum() for m, h in pairs]
        return torch.stack(per_param).sum(), per_param
