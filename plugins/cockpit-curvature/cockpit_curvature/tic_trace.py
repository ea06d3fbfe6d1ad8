"""Takeuchi information criterion with the traces of curvature and gradient second moment."""

from __future__ import annotations

from typing import Any

import torch

from cockpit_core import StepContext
from cockpit_curvature._tic import TICBase


class TICTrace(TICBase):
    """Takeuchi information criterion from traces (Thomas et al., 2020).

    Thomas et al. (2020), AISTATS, approximate ``tr(H^-1 C)`` by::

        TIC_trace = sum_j m_j / (sum_j h_j + epsilon),   m_j = (1/B) sum_n g_{n,j}^2

    i.e. ``tr(C) / (tr(H) + epsilon)``, with ``h`` the curvature diagonal (exact Hessian by
    default). ``total`` is Cockpit 1.0.2's ``TICTrace`` value (sums over all parameters);
    ``per_param`` holds the same ratio formed within each parameter block, so ``total`` is
    not their sum.
    """

    name = "tic_trace"

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": tr(C)/(tr(H)+eps), "per_param": [tr(C_i)/(tr(H_i)+eps)]}``."""
        eps = self.config.epsilon
        pairs = [(m.sum(), h.sum()) for m, h in self.moments_and_curvature(ctx)]
        moments = torch.stack([m for m, _ in pairs])
        curvatures = torch.stack([h for _, h in pairs])
        total = moments.sum() / (curvatures.sum() + eps)
        return self.as_output(total, list(moments / (curvatures + eps)))
