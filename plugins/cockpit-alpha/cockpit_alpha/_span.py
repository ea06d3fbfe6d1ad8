"""Each layer's update fitted in the span of its start-point directions, many layers at once.

At the start point every layer ``i`` projected its per-sample gradients onto three
directions ``b_i = (gradient, parameters, predicted update)``; at the end point its real
update ``d_i`` is known. Per layer, ``d_i = c_i . b_i + r_i`` with ``c_i`` the
least-squares coefficients: ``g_n . (c_i . b_i)`` follows exactly from the ``[B, 3]``
projections, and the residual ``r_i`` gets the diagonal approximation
``Var_n(g_n . r_i) ~ sum_j r_ij^2 Var_n(g_nj)`` (Mahsereci & Hennig, JMLR 2017, use the
exact slope variance; the diagonal is our approximation for the part the start point did
not see).

Layers are fitted together: a group of layers at most :data:`GROUP_ELEMENTS` elements long
(so the float64 temporaries stay bounded) is concatenated into one float64 ``5 x n`` block
(gradient, parameters, predicted update, update, end-point gradient); each layer's
``5 x 5`` Gram matrix, one product on a view of the block, holds its ``3 x 3`` system, the
right-hand side, ``||d||^2`` and both slopes, and the systems of all layers are solved in
one batched eigendecomposition. The cost is a few passes over the parameters instead of a
dozen small operations per layer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

GROUP_ELEMENTS = 1 << 21
"""Most elements of the layers fitted in one group (a large layer is a group alone)."""

MERGE_RTOL = 1e-12
"""Eigenvalues of the normalized Gram matrix below this share of the largest are dropped:
directions closer than ~1e-6 rad merge (plain SGD: update = -lr * gradient)."""


@dataclass
class SpanFit:
    """What the end point needs from the start point's projections.

    Attributes:
        in_span: ``[B]`` float64 on the CPU: ``sum_i g_n . (c_i . b_i)``, the per-sample
            slopes along the fitted update (not yet divided by the step length).
        diagonal: ``sum_i sum_j r_ij^2 Var_n(g_nj)`` over the layers whose residual is
            not rounding noise.
        exact: Whether every layer's residual is within ``rtol`` of its update (plus
            the rounding of its parameters).
        step_sq: ``||d||^2`` over all layers.
        start_dot: ``g_start . d``, the start point's mini-batch gradient on the update.
        end_dot: ``g_end . d``, the end point's.

    """

    in_span: Tensor
    diagonal: float
    exact: bool
    step_sq: float
    start_dot: float
    end_dot: float


def fit_updates_in_span(
    basis: Sequence[tuple[Tensor, Tensor, Tensor]],
    projections: Sequence[Tensor],
    sum_sq: Sequence[Tensor],
    params: Sequence[Tensor],
    end_grads: Sequence[Tensor],
    batch: int,
    rtol: float,
) -> SpanFit:
    """Fit every layer's update in the span of its three start-point directions.

    Args:
        basis: Per layer, the gradient, the parameters and the predicted update at the
            start point.
        projections: Per layer, ``[B, 3]``: each sample's gradient dotted with the basis.
        sum_sq: Per layer, ``sum_n g_n^2`` at the start point.
        params: The parameters at the end point: the update ``d`` is ``params`` minus
            the start point's parameters (``basis``), in float64.
        end_grads: Per layer, the mini-batch gradient at the end point.
        batch: ``B``, the start point's number of samples.
        rtol: A residual ``||r_i|| <= rtol ||d_i||`` (plus rounding) counts as exact.

    Returns:
        The in-span slopes, the diagonal variance of the residuals, exactness, and the
        dot products of the update with itself and with both gradients.

    """
    in_span = torch.zeros(batch, dtype=torch.float64)
    dots = torch.zeros(3, dtype=torch.float64)
    diagonal, exact = 0.0, True
    for group in _groups(params):
        part, group_dots, diag, ok = _fit_group(
            [basis[i] for i in group],
            [projections[i] for i in group],
            [sum_sq[i] for i in group],
            [params[i] for i in group],
            [end_grads[i] for i in group],
            batch,
            rtol,
        )
        in_span += part
        dots += group_dots
        diagonal += diag
        exact = exact and ok
    step_sq, start_dot, end_dot = (float(v) for v in dots)
    return SpanFit(in_span, diagonal, exact, step_sq, start_dot, end_dot)


def _groups(params: Sequence[Tensor]) -> Iterator[list[int]]:
    """Consecutive layers on one device, at most :data:`GROUP_ELEMENTS` elements together."""
    group: list[int] = []
    size = 0
    for i, d in enumerate(params):
        if group and (size + d.numel() > GROUP_ELEMENTS or d.device != params[group[0]].device):
            yield group
            group, size = [], 0
        group.append(i)
        size += d.numel()
    if group:
        yield group


def _fit_group(
    basis: list[tuple[Tensor, Tensor, Tensor]],
    projections: list[Tensor],
    sum_sq: list[Tensor],
    params: list[Tensor],
    end_grads: list[Tensor],
    batch: int,
    rtol: float,
) -> tuple[Tensor, Tensor, float, bool]:
    """One group: ``(in-span slopes [B], dots [3], diagonal, exact)``.

    ``dots``: ``(||d||^2, g_start . d, g_end . d)`` summed over the group's layers.
    """
    device = params[0].device
    sizes = [p.numel() for p in params]
    # columns: gradient, parameters, predicted update (the basis), update, end gradient;
    # per layer their Gram matrix holds the 3 x 3 system, its right-hand side and the dots
    columns = [[layer[k] for layer in basis] for k in range(3)] + [params, end_grads]
    x = torch.empty(5, sum(sizes), dtype=torch.float64, device=device)
    for row, column in zip(x, columns):  # concatenated straight into float64 rows
        torch.cat([t.detach().reshape(-1) for t in column], out=row)
    x[3] -= x[1]  # the update d = theta_end - theta_start
    layers = x.split(sizes, dim=1)  # [5, n_i] views
    gram = torch.stack([m @ m.T for m in layers]).cpu()  # [L, 5, 5]
    coeff = _solve(gram[:, :3, :3], gram[:, :3, 3])
    d_sq = gram[:, 3, 3]
    coeff[d_sq == 0] = 0.0
    dots = torch.stack([d_sq.sum(), gram[:, 0, 3].sum(), gram[:, 4, 3].sum()])
    # the residual r = d - c . b of each layer, formed explicitly: ||r|| from the Gram
    # matrix would cancel catastrophically exactly where it decides (r ~ rounding)
    weights = torch.cat([-coeff, torch.ones(len(sizes), 1, dtype=torch.float64)], dim=1)
    residuals = [w @ m[:4] for w, m in zip(weights.to(device), layers)]
    r_norm = torch.stack([r.norm() for r in residuals]).cpu()
    # ||theta_end||^2 = ||theta_start + d||^2 scales the rounding of the update
    theta_sq = (gram[:, 1, 1] + 2 * gram[:, 1, 3] + d_sq).clamp(min=0.0)
    eps = torch.tensor([torch.finfo(p.dtype).eps for p in params], dtype=torch.float64)
    outside = (d_sq > 0) & (r_norm > rtol * d_sq.sqrt() + eps * theta_sq.sqrt())

    proj = torch.stack(projections).to(device, torch.float64)  # [L, B, 3]
    in_span = torch.einsum("lbk,lk->b", proj, coeff.to(device)).cpu()
    diagonal = 0.0
    for i in outside.nonzero().flatten().tolist():
        r, g = residuals[i], layers[i][0]
        sq = sum_sq[i].reshape(-1).to(torch.float64)
        variance = ((sq - batch * g * g) / (batch - 1)).clamp(min=0.0)
        diagonal += float((r * r * variance).sum())
    return in_span, dots, diagonal, not bool(outside.any())


def _solve(gram: Tensor, along: Tensor) -> Tensor:
    """Least-squares coefficients per layer from ``[L, 3, 3]`` Gram matrices and ``[L, 3]``.

    The basis is normalized first (through the Gram matrix: no normalized copy of it is
    formed); directions closer than ~1e-6 rad are merged by a pseudo-inverse, so a
    parallel pair stays stable. A layer whose basis is zero gets zero coefficients.
    """
    norms = gram.diagonal(dim1=1, dim2=2).clamp(min=0.0).sqrt()
    scale = torch.where(norms > 0, 1.0 / norms, torch.zeros_like(norms))
    unit = gram * scale[:, :, None] * scale[:, None, :]
    evals, evecs = torch.linalg.eigh(unit)
    top = evals.max(dim=1, keepdim=True).values
    keep = evals > MERGE_RTOL * top
    inverse = torch.where(keep, 1.0 / evals.where(keep, torch.ones_like(evals)), 0.0)
    rhs = (along * scale).unsqueeze(-1)
    c_unit = evecs @ (inverse.unsqueeze(-1) * (evecs.transpose(1, 2) @ rhs))
    coeff: Tensor = c_unit.squeeze(-1) * scale
    coeff[top.squeeze(1) <= 0] = 0.0
    return coeff
