"""Brute-force references shared by the curvature tests (float64, autograd only)."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from cockpit_core.testing import Problem


def _explicit_ggn(
    model: torch.nn.Module, problem: Problem, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """``G = (1/B) sum_n J_n^T (d^2 l_n / d f_n^2) J_n``, the GGN of the mean loss, ``D x D``."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    shapes = [p.shape for _, p in named]
    theta = torch.cat([p.detach().reshape(-1) for _, p in named])

    def outputs_of(vec: torch.Tensor) -> torch.Tensor:
        parts = torch.split(vec, [s.numel() for s in shapes])
        params = {n: t.reshape(s) for (n, _), t, s in zip(named, parts, shapes)}
        return functional_call(model, params, (x,))

    out = outputs_of(theta).detach()
    jac = torch.autograd.functional.jacobian(outputs_of, theta)  # [B, C, D]
    ggn = torch.zeros(len(theta), len(theta), dtype=theta.dtype)
    for n in range(len(x)):

        def loss_n(f: torch.Tensor, n: int = n) -> torch.Tensor:
            return problem.individual_losses(f.unsqueeze(0), y[n : n + 1]).sum()

        hess_out = torch.autograd.functional.hessian(loss_n, out[n])
        ggn += jac[n].T @ hess_out @ jac[n]
    return ggn / len(x)


@pytest.fixture
def explicit_ggn():
    """The function ``explicit_ggn(model, problem, x, y) -> [D, D]``."""
    return _explicit_ggn
