"""Brute-force reference computations with plain autograd (loops over samples, explicit Hessians).

Use them in float64 to check a quantity against its definition, never against itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch.func import functional_call

from cockpit_core.testing.problems import Problem


def per_sample_gradients(
    model: torch.nn.Module, problem: Problem, x: torch.Tensor, y: torch.Tensor
) -> list[torch.Tensor]:
    """``g_n = grad l_n`` by one autograd call per sample; one ``[B, *p.shape]`` tensor per parameter."""
    params = [p for p in model.parameters() if p.requires_grad]
    losses = (
        problem.individual_losses(model(x[n : n + 1]), y[n : n + 1]).sum() for n in range(len(x))
    )
    return per_sample_gradients_from_losses(losses, params)


def per_sample_gradients_from_losses(
    losses: Iterable[torch.Tensor], params: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """``g_n = grad l_n`` of given per-sample losses, by one autograd call per sample.

    Use it when the losses come from one batched forward pass (a ``[B]`` tensor of
    ``reduction="none"`` losses, e.g. to keep a dropout mask or a batch-dependent layer):
    the graph is retained between the calls.

    Args:
        losses: The scalar loss of each sample (a ``[B]`` tensor iterates over them).
        params: The parameters to differentiate.

    Returns:
        One ``[B, *p.shape]`` tensor per parameter; zeros where a loss does not use it.

    """
    rows: list[list[torch.Tensor]] = [[] for _ in params]
    for loss in losses:
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        for i, (p, g) in enumerate(zip(params, grads)):
            rows[i].append(torch.zeros_like(p) if g is None else g.detach())
    return [torch.stack(r) for r in rows]


def flat(tensors: Sequence[torch.Tensor], start_dim: int = 0) -> torch.Tensor:
    """Concatenate tensors flattened from ``start_dim`` (``1`` keeps a leading batch axis)."""
    return torch.cat([t.flatten(start_dim) for t in tensors], dim=start_dim)


def explicit_hessian(
    model: torch.nn.Module, problem: Problem, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """The ``D x D`` Hessian of the mean mini-batch loss w.r.t. all parameters (in order)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    shapes = [p.shape for _, p in model.named_parameters() if p.requires_grad]
    sizes = [s.numel() for s in shapes]
    theta = flat([p.detach() for _, p in model.named_parameters() if p.requires_grad])

    def loss_of(vec: torch.Tensor) -> torch.Tensor:
        parts = torch.split(vec, sizes)
        params = {n: t.reshape(s) for n, t, s in zip(names, parts, shapes)}
        out = functional_call(model, params, (x,))
        return problem.individual_losses(out, y).mean()

    hessian: torch.Tensor = torch.autograd.functional.hessian(loss_of, theta)
    return hessian


def split_like(vec: torch.Tensor, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Split a flat vector into pieces shaped like ``tensors``."""
    parts = torch.split(vec, [t.numel() for t in tensors])
    return [p.reshape(t.shape) for p, t in zip(parts, tensors)]


def explicit_ggn(
    model: torch.nn.Module, problem: Problem, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """The ``D x D`` generalized Gauss-Newton matrix of the mean mini-batch loss.

    ``G = (1/B) sum_n J_n^T H_n J_n`` (Schraudolph, 2002, "Fast curvature matrix-vector
    products for second-order gradient descent"), where ``J_n = d f(x_n) / d theta`` is the
    ``[C, D]`` Jacobian of sample ``n``'s model output (one autograd call per output entry)
    and ``H_n = d^2 l_n / d f^2`` the ``[C, C]`` Hessian of its loss w.r.t. that output
    (``diag(p) - p p^T`` for cross-entropy). Its diagonal is what ``diag_ggn_exact``
    denotes. Parameters in the order of ``model.parameters()`` (those requiring gradients).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    dim = sum(p.numel() for p in params)
    ggn = torch.zeros(dim, dim, dtype=params[0].dtype)
    for n in range(len(x)):
        out = model(x[n : n + 1])
        entries = out.reshape(-1)
        rows = []
        for c in range(entries.numel()):
            grads = torch.autograd.grad(entries[c], params, retain_graph=True, allow_unused=True)
            rows.append(
                flat([torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)])
            )
        jac = torch.stack(rows)  # [C, D]
        target = y[n : n + 1]

        def loss_of(
            f: torch.Tensor, shape: torch.Size = out.shape, target: torch.Tensor = target
        ) -> torch.Tensor:
            return problem.individual_losses(f.reshape(shape), target).sum()

        loss_hessian = torch.autograd.functional.hessian(loss_of, entries.detach())
        ggn += jac.T @ loss_hessian.to(jac.dtype) @ jac
    return ggn / len(x)
