"""The histograms of several small parameters at once (the transforms' ``pooled_fn``).

On transformer-sized models most parameters are small, and binning each on its own costs
the fixed overhead of ~10 tensor operations per parameter, not arithmetic. The core hands
small parameters with the same number of elements ``D`` over together as per-sample
gradients ``[P, B, D]`` (:class:`~cockpit_core.PooledGrads`). Here they
are binned in a few operations for all of them: one float32 copy of the pool, each row's
minimum and maximum read on the host (they decide finiteness and the clamp, and give each
parameter's largest ``|g|``), one clamp, and one quantization and ``torch.bincount``
whose indices are offset per parameter (:func:`~cockpit_histograms._fastbin.bin_rows`),
per group of about ``2**18`` values (one group for most pools: the values stay in the
cache across the passes).

Row ``p`` equals :func:`~cockpit_histograms._binning.hist1d_layer` (or ``hist2d_layer``)
of parameter ``p`` exactly: the same float32 element-wise operations give each element
the same bin. Where that cannot be guaranteed cheaply, parameter ``p`` is binned on its
own by the per-parameter kernel: gradients or parameters with NaN/inf, ranges whose
vectorized assignment is not proved equal to ``torch.histc`` (``exact_for``), accelerators
(whose kernels are not proved equal to the CPU's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from cockpit_histograms._binning import hist1d_layer, hist2d_layer, within
from cockpit_histograms._fastbin import COUNTERS, PIECE, bin_rows, exact_for, row_offsets

Range = tuple[float, float]


def hist1d_pool(grads: Tensor, lo: float, hi: float, bins: int) -> Tensor:
    """:func:`~cockpit_histograms._binning.hist1d_layer` of ``P`` parameters at once.

    Args:
        grads: Per-sample gradients ``[P, B, D]`` (``grads[p]``: parameter ``p``'s).
        lo: Lower end of the range.
        hi: Upper end of the range.
        bins: Number of bins.

    Returns:
        float64 ``[P, bins + 4]``: row ``p`` is ``hist1d_layer(grads[p], lo, hi, bins)``.

    """
    count = grads.shape[0]
    flat = grads.reshape(count, -1)
    if flat.device.type != "cpu" or flat.shape[1] == 0 or not exact_for(lo, hi, bins):
        return _each(count, lambda p: hist1d_layer(grads[p], lo, hi, bins))
    owned = flat.dtype != torch.float32  # a float32 copy we may overwrite
    v = flat.to(torch.float32)
    lows, highs = _row_extremes(v)
    finite = [math.isfinite(a) and math.isfinite(b) for a, b in zip(lows, highs)]
    if all(finite):
        return _finite_1d(v, lows, highs, lo, hi, bins, owned)
    # rare: a parameter with NaN/inf is binned on its own
    rows: list[Tensor | None] = [None] * count
    for p in (p for p in range(count) if not finite[p]):
        rows[p] = hist1d_layer(grads[p], lo, hi, bins)
    good = [p for p in range(count) if finite[p]]
    if good:
        sub = _finite_1d(
            v[good], [lows[p] for p in good], [highs[p] for p in good], lo, hi, bins, True
        )
        for p, row in zip(good, sub.unbind(0)):
            rows[p] = row
    return torch.stack([r for r in rows if r is not None])


def _finite_1d(
    v: Tensor,
    lows: list[float],
    highs: list[float],
    lo: float,
    hi: float,
    bins: int,
    owned: bool,
) -> Tensor:
    """Rows of finite float32 values ``[P, N]`` with their minima and maxima."""
    if not all(within(a, b, lo, hi) for a, b in zip(lows, highs)):
        # a no-op on the rows that lie inside (``within``), as hist1d_layer skips it there
        v = v.clamp_(lo, hi) if owned else v.clamp(lo, hi)
    counts = bin_rows(v, lo, hi, bins)
    tails = [[0.0, 0.0, 0.0, max(abs(a), abs(b))] for a, b in zip(lows, highs)]
    return torch.cat([counts, torch.tensor(tails, dtype=torch.float64)], dim=1)


def hist2d_pool(
    grads: Tensor,
    params: Sequence[Tensor],
    ranges: tuple[Range, Range],
    bins: tuple[int, int],
) -> Tensor:
    """:func:`~cockpit_histograms._binning.hist2d_layer` of ``P`` parameters at once.

    Args:
        grads: Per-sample gradients ``[P, B, D]`` (``grads[p]``: parameter ``p``'s).
        params: The ``P`` parameters (``D`` elements each), in the order of ``grads``.
        ranges: ``((x_low, x_high), (y_low, y_high))`` of the gradient and parameter axes.
        bins: ``(xbins, ybins)``.

    Returns:
        float64 ``[P, xbins * ybins + 6]``: row ``p`` is
        ``hist2d_layer(grads[p], params[p], ranges, bins)``.

    """
    count = grads.shape[0]

    def alone(p: int) -> Tensor:
        return hist2d_layer(grads[p], params[p], ranges, bins)

    flat = grads.reshape(count, -1)
    if flat.device.type != "cpu" or flat.shape[1] == 0:
        return _each(count, alone)
    owned = flat.dtype != torch.float32  # a float32 copy we may overwrite
    g = flat.to(torch.float32)
    theta = _stack_flat(params).to(torch.float32)
    g_lows, g_highs = _row_extremes(g)
    t_lows, t_highs = _row_extremes(theta)
    g_tops = [max(abs(a), abs(b)) for a, b in zip(g_lows, g_highs)]
    t_tops = [max(abs(a), abs(b)) for a, b in zip(t_lows, t_highs)]
    finite = [math.isfinite(a) and math.isfinite(b) for a, b in zip(g_tops, t_tops)]
    if all(finite):
        return _finite_2d(g, theta, g_tops, t_tops, ranges, bins, owned)
    # rare: a parameter with NaN/inf (in its gradients or its values) is binned on its own
    rows: list[Tensor | None] = [None] * count
    for p in (p for p in range(count) if not finite[p]):
        rows[p] = alone(p)
    good = [p for p in range(count) if finite[p]]
    if good:
        sub = _finite_2d(
            g[good],
            theta[good],
            [g_tops[p] for p in good],
            [t_tops[p] for p in good],
            ranges,
            bins,
            True,
        )
        for p, row in zip(good, sub.unbind(0)):
            rows[p] = row
    return torch.stack([r for r in rows if r is not None])


def _finite_2d(
    g: Tensor,
    theta: Tensor,
    g_tops: list[float],
    t_tops: list[float],
    ranges: tuple[Range, Range],
    bins: tuple[int, int],
    owned: bool,
) -> Tensor:
    """Rows of finite float32 gradients ``[P, B D]`` and parameters ``[P, D]``."""
    (xlo, xhi), (ylo, yhi) = ranges
    xbins, ybins = bins
    wx, wy = (xhi - xlo) / xbins, (yhi - ylo) / ybins
    count, n = theta.shape
    size = xbins * ybins
    low, high = xlo + wx / 2, xhi - wx / 2
    # the float32 quantizations of hist2d_layer, element by element
    iy = ((theta.clamp(ylo + wy / 2, yhi - wy / 2) - ylo) / wy).long().to(torch.int32)
    # groups of rows: at most COUNTERS counters, and about PIECE values (cached passes)
    group = max(1, min(COUNTERS // size, PIECE // g.shape[1]))
    parts = []
    for s in range(0, count, group):
        rows = min(group, count - s)
        whole = rows == count
        v = g if whole else g[s : s + rows]
        ix = v.clamp_(low, high) if owned else v.clamp(low, high)
        ix = ix.sub_(xlo).div_(wx).to(torch.int32).view(rows, -1, n)
        # parameter p counts into bins p * size + (ix * ybins + iy), as hist2d_layer's joint index
        iy_rows = iy if whole else iy[s : s + rows]
        if rows > 1:
            iy_rows = iy_rows + row_offsets(rows, size, torch.int32)
        joint = torch.add(iy_rows.view(rows, 1, n), ix, alpha=ybins)
        parts.append(torch.bincount(joint.view(-1), minlength=rows * size).view(rows, size))
    counts = (parts[0] if len(parts) == 1 else torch.cat(parts)).to(torch.float64)
    tails = [[0.0, 0.0, 0.0, 0.0, a, b] for a, b in zip(g_tops, t_tops)]
    return torch.cat([counts, torch.tensor(tails, dtype=torch.float64)], dim=1)


def _row_extremes(v: Tensor) -> tuple[list[float], list[float]]:
    """Each row's minimum and maximum (NaN if it holds one), read on the host.

    ``amin`` and ``amax`` along rows take a tenth of the time of ``aminmax(dim=1)`` here.
    """
    return v.amin(1).tolist(), v.amax(1).tolist()


def _stack_flat(params: Sequence[Tensor]) -> Tensor:
    """The parameters as ``[P, D]`` (one stack when they have the same shape)."""
    shape = params[0].shape
    with torch.no_grad():
        if all(p.shape == shape for p in params):
            return torch.stack(list(params)).reshape(len(params), -1)
        return torch.stack([p.reshape(-1) for p in params])


def _each(count: int, one: Callable[[int], Tensor]) -> Tensor:
    """The per-parameter kernel on each of ``count`` parameters, stacked."""
    return torch.stack([one(p) for p in range(count)])
