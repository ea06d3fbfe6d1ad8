"""Takeuchi information criterion with the traces of curvature and gradient second moment."""

from __future__ import annotations

import torch
from torch import Tensor

from cockpit_curvature._tic import TICBase


class TICTrace(TICBase):
    """Takeuchi information criterion from traces (Thomas et al., 2020).

    Thomas et al. (2020), AISTATS, approximate ``tr(H^-1 C)`` by::

        TIC_trace = sum_j m_j / (sum_j h_j + epsilon),   m_j = (1/B) sum_n g_{n,j}^2

    i.e. ``tr(C) / (tr(H) + epsilon)``, with ``h`` the curvature diagonal (exact Hessian by
    default, or estimated with error bars). ``total`` is Cockpit 1.0.2's ``TICTrace`` value
    (sums over all parameters); ``per_param`` holds the same ratio formed within each
    parameter block, so ``total`` is not their sum. With an estimated ``h`` only its sum
    enters: the delta-method error is ``TIC_trace / (tr(H) + epsilon)`` times the
    standard error of the trace.
    """

    name = "tic_trace"

    def combine(self, pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, list[Tensor]]:
        """``tr(C) / (tr(H) + eps)`` over all parameters, and within each."""
        eps = self.config.epsilon
        moments = torch.stack([m.sum() for m, _ in pairs])
        curvatures = torch.stack([h.sum() for _, h in pairs])
        total = moments.sum() / (curvatures.sum() + eps)
        return total, list(moments / (curvatures + eps))
