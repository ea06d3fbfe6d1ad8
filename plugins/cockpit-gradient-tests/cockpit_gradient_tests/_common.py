"""Helpers shared by the gradient-statistics quantities.

Every quantity of this plugin reduces per-sample statistics to a handful of numbers per
parameter. The reductions run in float64 (they are tiny: ``[B]``, ``[B, B]`` or one number
per parameter), so the only rounding left is the one in the statistics themselves.

Notation (also used in the docstrings of the quantities): ``g_n`` is the gradient of sample
``n``'s own loss, ``g = (1/B) sum_n g_n`` the mini-batch gradient (``p.grad``), ``B`` the
batch size, ``D`` the number of parameter entries. A subscript ``p`` restricts a vector to
the entries of one parameter (one "layer" of the per-parameter breakdown).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cockpit_core import (
    BATCH_L2,
    BATCH_PROJECTION,
    SUM_GRAD_SQUARED,
    MisuseError,
    Statistic,
    StepContext,
)


def stat64(ctx: StepContext, statistic: Statistic) -> list[Tensor | None]:
    """``ctx.stat(statistic)`` in float64; ``None`` for parameters that received no gradient."""
    return [None if v is None else v.detach().double() for v in ctx.stat(statistic)]


def grads64(ctx: StepContext) -> list[Tensor]:
    """The mini-batch gradient of each parameter in float64 (zeros where there is none)."""
    return [g.double() for g in ctx.grads]


def samples_in(values: Sequence[Tensor | None], ctx: StepContext) -> int:
    """Batch size ``B``: the leading dimension of a per-sample statistic (or ``ctx.batch_size``)."""
    for v in values:
        if v is not None:
            return int(v.shape[0])
    return ctx.batch_size


def require_samples(name: str, batch_size: int, minimum: int = 2) -> None:
    """Raise :class:`MisuseError` if the batch is too small for a sample variance."""
    if batch_size < minimum:
        raise MisuseError(
            f"'{name}' needs at least {minimum} samples per mini-batch (got {batch_size}): "
            "it estimates a sample variance over the batch. Use a larger batch, or do not "
            "track this quantity."
        )


def zeros_where_missing(
    values: Sequence[Tensor | None], shape_of: Sequence[torch.Size], like: Tensor
) -> list[Tensor]:
    """Replace ``None`` entries (parameters without gradient) by zeros of ``shape_of[i]``."""
    return [
        torch.zeros(shape, dtype=torch.float64, device=like.device) if v is None else v
        for v, shape in zip(values, shape_of)
    ]


def gram_reductions(ctx: StepContext, name: str) -> tuple[int, Tensor, Tensor, Tensor]:
    """Per-parameter projections on the mini-batch gradient (``BATCH_PROJECTION``, ``BATCH_L2``).

    The projections ``g_{n,p} . g_p`` equal the row sums ``(1/B) sum_m G_p[n, m]`` of the
    per-sample Gram matrices, but cost ``O(B D)`` instead of ``O(B^2 D)`` and, unlike the
    Gram matrix, combine exactly across ``torch.distributed`` processes.

    Returns:
        ``(B, proj, sum_sq, grad_sq)``: ``proj[p, n] = g_{n,p} . g_p``, the projection of each
        sample's gradient on the mini-batch gradient; ``sum_sq[p] = sum_n ||g_{n,p}||^2``;
        ``grad_sq[p] = ||g_p||^2`` from ``p.grad``.

    """
    projections = stat64(ctx, BATCH_PROJECTION)
    batch_size = samples_in(projections, ctx)
    require_samples(name, batch_size)
    grads = grads64(ctx)
    shapes = [torch.Size([batch_size])] * len(grads)
    proj = torch.stack(zeros_where_missing(projections, shapes, grads[0]))
    norms = zeros_where_missing(stat64(ctx, BATCH_L2), shapes, grads[0])
    sum_sq = torch.stack([v.sum() for v in norms])
    grad_sq = torch.stack([g.pow(2).sum() for g in grads])
    return batch_size, proj, sum_sq, grad_sq


def elementwise_variances(
    ctx: StepContext, name: str, unbiased: bool
) -> tuple[int, list[Tensor], list[Tensor]]:
    """Per-entry gradient variances from ``SUM_GRAD_SQUARED``.

    Args:
        ctx: The step context.
        name: Output key of the quantity (for error messages).
        unbiased: Divide by ``B - 1`` (sample variance) instead of ``B`` (population).

    Returns:
        ``(B, grad_sq, var)`` with, per parameter, ``grad_sq = g^2`` and
        ``var = max(0, sum_n g_n^2 - B g^2) / (B - 1 or B)`` entry-wise. The clamp only
        removes negative values that rounding can produce.

    """
    batch_size = ctx.batch_size
    require_samples(name, batch_size, minimum=2 if unbiased else 1)
    grads = grads64(ctx)
    sgs = zeros_where_missing(stat64(ctx, SUM_GRAD_SQUARED), [g.shape for g in grads], grads[0])
    grad_sq = [g.pow(2) for g in grads]
    divisor = batch_size - 1 if unbiased else batch_size
    var = [(s - batch_size * g2).clamp(min=0) / divisor for s, g2 in zip(sgs, grad_sq)]
    return batch_size, grad_sq, var


def epsilon_field_description(what: str) -> str:
    """Description of the ``epsilon`` option (shared by mean GSNR and early stopping)."""
    return (
        f"Added to the variance in the denominator of {what} to avoid division by zero "
        "(absolute, so it depends on the scale of the gradients). Cockpit 1.0.2 default: 1e-5."
    )
