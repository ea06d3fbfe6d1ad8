"""Takeuchi information criterion with a diagonal curvature approximation."""

from __future__ import annotations

from typing import Any

import torch

from cockpit_core import StepContext
from cockpit_curvature._tic import TICBase


class TICDiag(TICBase):
    """Takeuchi information criterion with a diagonal curvature (Thomas et al., 2020).

    Thomas et al. (2020), AISTATS, approximate ``tr(H^-1 C)`` by::

        TIC_diag = sum_j m_j / (h_j + epsilon),   m_j = (1/B) sum_n g_{n,j}^2

    with ``h`` the curvature diagonal (exact Hessian by default) and ``g_n`` the gradient of
    sample ``n``'s loss. Same value as Cockpit 1.0.2's ``TICDiag`` with the defaults.
    ``per_param`` holds the sum over each parameter's entries; ``total`` is their sum.
    """

    name = "tic_diag"

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": TIC, "per_param": [TIC of each parameter's entries]}``."""
        eps = self.config.epsilon
        per_param = [(m / (h + eps)).sum() for m, h in self.moments_and_curvature(ctx)]
        return self.as_output(torch.stack(per_param).sum(), per_param)
