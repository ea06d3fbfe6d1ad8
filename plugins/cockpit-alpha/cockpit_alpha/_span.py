"""Each layer's update fitted in the span of its start-point directions, many layers at once.

At the start point every layer ``i`` projected its per-sample gradients onto three
directions ``b_i = (gradient, parameters, predicted update)``; at the end point its real
update ``d_i`` is known. Per layer, ``d_i = c_i . b_i + r_i`` with ``c_i`` the
least-squares coefficients: ``g_n . (c_i . b_i)`` follows exactly from the ``[B, 3]``
projections, and the residual ``r_i`` gets the diagonal approximation
``Var_n(g_n . r_i) ~ sum_j r_ij^2 Var_n(g_nj)`` (Mahsereci & Hennig, JMLR 2017, use the
exact slope variance; the diagonal is our approximation for the part the start point did
not see).

Layers are fitted together, by groups of same-shaped parameters (one dtype, one device;
:func:`same_shape_groups`) that the start point keeps stacked ``[L, *shape]``
(:class:`StartGroup`); a transformer's blocks share a handful of shapes. A chunk of a group
at most :data:`GROUP_ELEMENTS` elements long (so the float64 temporaries stay bounded) is
stacked into one float64 ``[l, 5, n]`` block (gradient, parameters, predicted update,
update, end-point gradient); one batched product gives each layer's ``5 x 5`` Gram matrix,
which holds its ``3 x 3`` system, the right-hand side, ``||d||^2`` and both slopes. The
systems of all layers are solved in one batched eigendecomposition, and one more batched
product per chunk forms the residuals. The cost is a few passes over the parameters and a
few dozen tensor operations per group, whatever the number of layers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

GROUP_ELEMENTS = 1 << 21
"""Most elements of the layers fitted in one chunk (a large layer is a chunk alone). The
float64 blocks of the first chunks, up to five times this many numbers, are kept for the
residuals; the others are formed again."""

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


@dataclass(eq=False)
class StartGroup:
    """Same-shaped parameters (one dtype, one device) at the start point.

    Attributes:
        indices: The ``L`` parameters' positions in the parameter list.
        theta: ``[L, *shape]``: the parameters (a copy).
        grad: ``[L, *shape]``: the mini-batch gradient ``g`` (a copy); with ``theta`` and
            ``direction`` the basis.
        direction: Per parameter, the predicted update.
        sum_sq: Per parameter, ``sum_n g_n^2``, for the diagonal approximation.

    """

    indices: list[int]
    theta: Tensor
    grad: Tensor
    direction: list[Tensor]
    sum_sq: list[Tensor]

    @property
    def tensors(self) -> list[Tensor]:
        """Every tensor the group holds."""
        return [self.theta, self.grad, *self.direction, *self.sum_sq]


def same_shape_groups(params: Sequence[Tensor]) -> list[list[int]]:
    """Positions of the parameters by shape, dtype and device, in order of first appearance."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault((tuple(p.shape), p.dtype, p.device), []).append(i)
    return list(groups.values())


def stack(tensors: Sequence[Tensor], indices: Sequence[int]) -> Tensor:
    """``[L, *shape]``: a copy of the tensors at ``indices`` (one operation, no graph)."""
    with torch.no_grad():
        return torch.stack([tensors[i] for i in indices])


def fit_updates_in_span(
    groups: Sequence[StartGroup],
    projections: Tensor,
    params: Sequence[Tensor],
    end_grads: Sequence[Tensor],
    batch: int,
    rtol: float,
) -> SpanFit:
    """Fit every layer's update in the span of its three start-point directions.

    Args:
        groups: The start point's same-shaped parameters: the basis (gradient, parameters,
            predicted update) and ``sum_n g_n^2``.
        projections: ``[P, B, 3]``: each sample's gradient dotted with the basis, one
            layer after the other in the order of ``groups``.
        params: The parameters at the end point (at the positions the groups name): the
            update ``d`` is ``params`` minus the start point's parameters, in float64.
        end_grads: Per parameter, the mini-batch gradient at the end point.
        batch: ``B``, the start point's number of samples.
        rtol: A residual ``||r_i|| <= rtol ||d_i||`` (plus rounding) counts as exact.

    Returns:
        The in-span slopes, the diagonal variance of the residuals, exactness, and the
        dot products of the update with itself and with both gradients.

    """
    chunks = [(group, rows) for group in groups for rows in _chunks(group)]
    if not chunks:
        return SpanFit(torch.zeros(batch, dtype=torch.float64), 0.0, True, 0.0, 0.0, 0.0)
    sizes = [len(group.indices[rows]) for group, rows in chunks]
    # first pass: each layer's Gram matrix of (gradient, parameters, predicted update,
    # update, end gradient): its 3 x 3 system, the right-hand side and the dots
    blocks: list[Tensor | None] = []
    grams: list[Tensor] = []
    kept = 0
    for group, rows in chunks:
        x = _block(group, rows, params, end_grads)
        grams.append(torch.bmm(x, x.mT))
        kept += x.numel()
        blocks.append(x if kept <= 5 * GROUP_ELEMENTS else None)
    del x  # the last block, unless kept: the second pass forms it again
    gram = _cat_cpu(grams)  # [P, 5, 5]
    coeff = _solve(gram[:, :3, :3], gram[:, :3, 3])  # zero where d = 0: so is b . d
    d_sq = gram[:, 3, 3]
    start_dot, _, _, step_sq, end_dot = gram[:, :, 3].sum(0).tolist()
    in_span = (projections * coeff.to(projections.device).unsqueeze(1)).sum((0, 2)).cpu()

    # second pass: the residual r = d - c . b of each layer, formed explicitly: ||r|| from
    # the Gram matrix would cancel catastrophically exactly where it decides (r ~ rounding)
    coeffs = coeff.unsqueeze(1).split(sizes)  # [l, 1, 3] per chunk
    norms: list[Tensor] = []
    for (group, rows), block, c in zip(chunks, blocks, coeffs):
        x = _block(group, rows, params, end_grads) if block is None else block
        norms.append(torch.linalg.vector_norm(_residual(x, c), dim=(1, 2)))
    # ||theta_end||^2 = ||theta_start + d||^2 scales the rounding of the update
    theta_sq = (gram[:, 1, 1] + 2 * gram[:, 1, 3] + d_sq).clamp(min=0.0)
    eps = [torch.finfo(g.theta.dtype).eps for g, rows in chunks for _ in g.indices[rows]]
    limit = rtol * d_sq.sqrt() + torch.tensor(eps, dtype=torch.float64) * theta_sq.sqrt()
    outside = _cat_cpu(norms) > limit
    if not outside.any():
        return SpanFit(in_span, 0.0, True, step_sq, start_dot, end_dot)

    # the layers outside the span: sum_j r_j^2 Var_n(g_nj), their residuals formed again
    diagonal = 0.0
    for (group, rows), block, c, out in zip(chunks, blocks, coeffs, outside.split(sizes)):
        if not out.any():
            continue
        x = _block(group, rows, params, end_grads) if block is None else block
        r = _residual(x, c)
        sq = torch.stack(group.sum_sq[rows]).reshape(r.shape).double()
        g = x[:, :1]
        variance = ((sq - batch * g * g) / (batch - 1)).clamp(min=0.0)
        per_layer = (r * r * variance).sum((1, 2))
        diagonal += float(per_layer[out.to(x.device)].sum())
    return SpanFit(in_span, diagonal, False, step_sq, start_dot, end_dot)


def _chunks(group: StartGroup) -> Iterator[slice]:
    """The group's rows in chunks of at most :data:`GROUP_ELEMENTS` elements (>= 1 layer)."""
    count, size = len(group.indices), math.prod(group.theta.shape[1:])
    step = max(1, GROUP_ELEMENTS // max(1, size))
    for start in range(0, count, step):
        yield slice(start, min(start + step, count))


def _rows(t: Tensor, rows: slice) -> Tensor:
    """``t[rows]``, without an operation when the rows are all of them."""
    return t if rows.indices(len(t)) == (0, len(t), 1) else t[rows]


def _cat_cpu(parts: Sequence[Tensor]) -> Tensor:
    """The parts concatenated on the CPU (moved once when they are on one device)."""
    return torch.cat([t.to(parts[0].device) for t in parts]).cpu()


def _block(
    group: StartGroup, rows: slice, params: Sequence[Tensor], end_grads: Sequence[Tensor]
) -> Tensor:
    """``[l, 5, n]`` float64: gradient, parameters, predicted update, update, end gradient."""
    indices = group.indices[rows]
    x = torch.empty(
        len(indices), 5, *group.theta.shape[1:], dtype=torch.float64, device=group.theta.device
    )
    grad, theta, direction, update, end_grad = x.unbind(1)
    with torch.no_grad():  # stacked in their dtype, then copied into float64 (a stack that
        # converts as it copies was 1.4-6x slower on the CPU)
        grad.copy_(_rows(group.grad, rows))
        theta.copy_(_rows(group.theta, rows))
        direction.copy_(torch.stack(group.direction[rows]))
        update.copy_(torch.stack([params[i] for i in indices]))
        end_grad.copy_(torch.stack([end_grads[i] for i in indices]))
    update.sub_(theta)  # the update d = theta_end - theta_start
    return x.view(len(indices), 5, -1)


def _residual(x: Tensor, coeff: Tensor) -> Tensor:
    """``[l, 1, n]``: each layer's ``r = d - c . b`` from its block and ``[l, 1, 3]`` ``c``."""
    basis, update, _ = x.split((3, 1, 1), dim=1)
    return torch.baddbmm(update, coeff.to(x.device), basis, alpha=-1.0)


def _solve(gram: Tensor, along: Tensor) -> Tensor:
    """Least-squares coefficients per layer from ``[L, 3, 3]`` Gram matrices and ``[L, 3]``.

    The basis is normalized first (through the Gram matrix: no normalized copy of it is
    formed); directions closer than ~1e-6 rad are merged by a pseudo-inverse, so a
    parallel pair stays stable. A layer whose basis is zero gets zero coefficients.
    """
    norms = gram.diagonal(dim1=1, dim2=2).clamp(min=0.0).sqrt()
    scale = torch.where(norms > 0, norms.reciprocal(), 0.0)
    unit = gram * scale.unsqueeze(2) * scale.unsqueeze(1)
    evals, evecs = torch.linalg.eigh(unit)
    top = evals.max(dim=1, keepdim=True).values
    # the reciprocals of the dropped eigenvalues (maybe infinite) are not used
    inverse = torch.where(evals > MERGE_RTOL * top, evals.reciprocal(), 0.0)
    rhs = (along * scale).unsqueeze(2)
    c_unit = torch.bmm(evecs, inverse.unsqueeze(2) * torch.bmm(evecs.mT, rhs))[:, :, 0]
    return torch.where(top <= 0, 0.0, c_unit * scale)
