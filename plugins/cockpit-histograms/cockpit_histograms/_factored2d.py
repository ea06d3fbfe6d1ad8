"""2-D histogram of (per-sample gradient, parameter) pairs of a linear layer from its factors.

For a linear layer, ``g_n = d_n a_n^T`` (output gradients ``d_n`` ``[out]``, inputs
``a_n`` ``[in]``), and :func:`~cockpit_histograms._binning.hist2d_layer` counts the pairs
``([g_n]_ij, theta_ij)``. Forming all ``B x out x in`` products (75 M for the first dense
layer of the 3c3d network) and binning them dominates the cost. Here:

- the parameter's bin ``iy_ij`` is computed once per step (as in ``hist2d_layer``);
- products with a zero factor (common after ReLU) are exactly zero and all fall in the
  x-bin ``x0`` of ``0``; per element ``ij``, ``z_ij = B - #{n : product formed}`` of them
  are counted at once, ``bincount(iy, weights=z)`` in row ``x0`` of the histogram;
- the products formed are, per sample, the rows ``i`` with ``u_ni != 0`` of the factor
  ``u`` with more zeros (``d``, or ``a`` for the transposes ``g_n^T``), times either
  every ``v_nj`` (then ``z_ij = B - sum_n [u_ni != 0]``) or only the non-zero ones
  (``z_ij = B - sum_n [u_ni != 0][v_nj != 0] = B - (N_u^T N_v)_ij``, one product of the
  0/1 masks, exact in float32 below ``2**24``), whichever costs less: gathering the
  columns of ``iy`` costs more per product than gathering its rows;
- they are formed with their ``iy`` into small buffers that are binned whenever they
  are full (no ``B x out x in`` tensor; the buffers stay in the CPU cache);
- the x-bin of a product is computed with the same float32 operations as in
  ``hist2d_layer`` (clamp to the edge-bin centres, ``(v - low) / width``, truncation), so
  every pair gets the same joint bin ``ix * ybins + iy`` and the counts are identical;
- the clamp is skipped when the extreme products (from the extreme factor entries) lie
  inside the clamp bounds, and the largest ``|g|`` is ``max_n max|d_n| max|a_n|``
  (rounding is monotone, so this is the largest rounded product).

Non-finite factors or parameters, float32 overflow (NaN/inf bookkeeping), tiny layers
and accelerators take the materializing kernel.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from cockpit_histograms import _binning

BUFFER = 1 << 17
"""Products binned at a time (512 KiB of float32 plus the same of int32 bin indices)."""

SMALL = 1 << 16
"""Below this many products, forming them all is cheaper than the bookkeeping."""

GATHER_COST = 2.5
"""Cost of a product whose ``iy`` is gathered column-wise, relative to one in a full row."""

Ranges = tuple[tuple[float, float], tuple[float, float]]


def hist2d_factored(
    d: Tensor, a: Tensor, param: Tensor, ranges: Ranges, bins: tuple[int, int]
) -> Tensor:
    """:func:`~cockpit_histograms._binning.hist2d_layer` of ``g_n = d_n a_n^T`` from the factors.

    ``count[x, y] = #{(n, i, j) : ix(fl32(d_ni a_nj)) = x, iy(theta_ij) = y}``, with
    ``ix``/``iy`` the clamped float32 quantizations of ``hist2d_layer``.

    Args:
        d: Output gradients ``[B, out]`` (of each sample's own loss).
        a: Layer inputs ``[B, in]``.
        param: The weight ``theta``, ``[out, in]``.
        ranges: ``((x_low, x_high), (y_low, y_high))`` of the gradient and parameter axes.
        bins: ``(xbins, ybins)``.

    Returns:
        float64 ``[xbins * ybins + 6]`` as :func:`~cockpit_histograms._binning.hist2d_layer`.

    """
    theta = param.detach()
    if not _factored_path_applies(d, a, theta):
        return _binning.hist2d_layer(d[:, :, None] * a[:, None, :], param, ranges, bins)
    top = (d.abs().amax(1) * a.abs().amax(1)).max().to(torch.float32).to(torch.float64)
    if not math.isfinite(float(top)):  # an overflowing product: NaN/inf bookkeeping needed
        return _binning.hist2d_layer(d[:, :, None] * a[:, None, :], param, ranges, bins)
    (xlo, xhi), (ylo, yhi) = ranges
    xbins, ybins = bins
    wx, wy = (xhi - xlo) / xbins, (yhi - ylo) / ybins
    low, high = xlo + wx / 2, xhi - wx / 2
    batch, n_out, n_in = d.shape[0], d.shape[1], a.shape[1]
    size = xbins * ybins

    # parameter bins, as hist2d_layer (exact integers, so int32 joint indices are equal)
    theta32 = theta.reshape(n_out, n_in).to(torch.float32)
    _, theta_top = _binning.scan(theta32)
    iy = ((theta32.clamp(ylo + wy / 2, yhi - wy / 2) - ylo) / wy).to(torch.int32)

    def x_bin(v: Tensor, clamp: bool) -> Tensor:  # the x-bin of hist2d_layer, in place
        v = v.clamp_(low, high) if clamp else v
        return v.sub_(xlo).div_(wx)  # truncated by the caller's int32 conversion

    # Plan: skip the zero entries of the factor ``u`` with more of them (``g_n`` or its
    # transpose is then formed row by row: rows of non-zero ``u_ni`` only, ``iy`` rows
    # gathered), and also those of the other factor ``v`` if that saves enough work
    # (column gathers cost ``GATHER_COST`` times more per product).
    nonzero_d, nonzero_a = d != 0, a != 0
    k_d, k_a = nonzero_d.sum(1), nonzero_a.sum(1)
    n_both = int((k_d * k_a).sum())
    n_rows_d, n_rows_a = int(k_d.sum()) * n_in, int(k_a.sum()) * n_out
    if n_rows_a < n_rows_d:  # work on the transposes: g_n^T = a_n d_n^T
        u, v, nonzero_u, nonzero_v, iy, n_rows = a, d, nonzero_a, nonzero_d, iy.T, n_rows_a
    else:
        u, v, nonzero_u, nonzero_v, n_rows = d, a, nonzero_d, nonzero_a, n_rows_d
    iy = iy.contiguous()
    skip_both = GATHER_COST * n_both < n_rows
    n_formed = n_both if skip_both else n_rows

    # zero products: B - #samples whose product is formed, per element, all in x-bin x0
    counts = torch.zeros(size, dtype=torch.int64)
    if n_formed < batch * n_out * n_in:
        exact = torch.float32 if batch < (1 << 24) else torch.float64  # exact counts
        if skip_both:
            formed = nonzero_u.T.to(exact) @ nonzero_v.to(exact)
        else:
            formed = nonzero_u.sum(0, dtype=exact)[:, None].expand(iy.shape)
        zeros = (batch - formed).to(torch.float64).reshape(-1)
        x0 = int(x_bin(torch.zeros(1, dtype=torch.float32), clamp=True).to(torch.int32))
        per_y = torch.bincount(iy.reshape(-1), weights=zeros, minlength=ybins)
        counts[x0 * ybins : (x0 + 1) * ybins] += per_y.round().to(torch.int64)

    d_min, d_max = torch.aminmax(d, dim=1)
    a_min, a_max = torch.aminmax(a, dim=1)
    corners = torch.stack([d_min * a_min, d_min * a_max, d_max * a_min, d_max * a_max])
    corners = corners.to(torch.float32)
    clamp = not _binning.within(float(corners.min()), float(corners.max()), low, high)

    values = torch.empty(min(max(BUFFER, iy.shape[1]), max(n_formed, 1)), dtype=torch.float32)
    index = torch.empty(values.shape, dtype=torch.int32)
    blocks = _blocks(u, v, nonzero_u, nonzero_v if skip_both else None, iy, values)
    for m, y in blocks:
        # ix * ybins + iy: the float32 value of hist2d_layer (exact integers < 2**22)
        ix = index[:m].copy_(x_bin(values[:m], clamp))  # truncation toward zero
        counts += torch.bincount(torch.add(y, ix, alpha=ybins, out=ix), minlength=size)
    bad = torch.zeros(4, dtype=torch.float64)  # NaN, +inf, -inf, non-finite parameter
    return torch.cat([counts.to(torch.float64), bad, top.reshape(1), theta_top.reshape(1)])


def _factored_path_applies(d: Tensor, a: Tensor, theta: Tensor) -> bool:
    if d.dim() != 2 or a.dim() != 2 or d.device.type != "cpu" or d.dtype != a.dtype:
        return False
    if theta.numel() != d.shape[1] * a.shape[1] or d.shape[0] * theta.numel() < max(SMALL, 1):
        return False
    return all(bool(torch.isfinite(t).all()) for t in (d, a, theta))


def _blocks(
    u: Tensor,
    v: Tensor,
    nonzero_u: Tensor,
    nonzero_v: Tensor | None,
    iy: Tensor,
    values: Tensor,
) -> Iterator[tuple[int, Tensor]]:
    """Fill ``values`` with the products ``u_ni v_nj`` of non-zero ``u_ni`` and their ``iy``.

    Per sample, the rows ``i`` with ``u_ni != 0`` and either every column ``j`` or, with
    ``nonzero_v``, only those with ``v_nj != 0``. Products are computed in the factors'
    dtype and rounded to float32, as when the per-sample gradients are materialized.
    Yields the number of products and their int32 ``iy`` whenever ``values`` is full (and
    at the end). Column gathers of ``iy`` run in float32 (``index_select`` along the
    second dimension is ~4x faster for float32 than for int32 here) and are converted
    once per block.
    """
    k_u = nonzero_u.sum(1).tolist()
    rows_of = nonzero_u.nonzero()[:, 1].split(k_u)
    u_of = u[nonzero_u].split(k_u)
    if nonzero_v is None:
        cols_of, v_of, picked = None, v, iy
    else:
        k_v = nonzero_v.sum(1).tolist()
        cols_of = nonzero_v.nonzero()[:, 1].split(k_v)
        v_of = v[nonzero_v].split(k_v)
        picked = torch.empty(values.shape, dtype=torch.float32)
        iy_float = iy.to(torch.float32)  # exact: integers < 2**22
    y_index = torch.empty(values.shape, dtype=torch.int32)
    capacity, fill = values.numel(), 0

    def full() -> tuple[int, Tensor]:
        if cols_of is not None:
            y_index[:fill].copy_(picked[:fill])
        return fill, y_index[:fill]

    for n in range(u.shape[0]):
        rows, v_n = rows_of[n], v_of[n]
        width = v_n.numel()
        if not (rows.numel() and width):
            continue
        step = max(1, capacity // width)
        for r in range(0, rows.numel(), step):
            part = rows[r : r + step]
            m = part.numel() * width
            if fill + m > capacity:
                yield full()
                fill = 0
            _put(u_of[n][r : r + step], v_n, values[fill : fill + m].view(-1, width))
            if cols_of is None:
                torch.index_select(iy, 0, part, out=y_index[fill : fill + m].view(-1, width))
            else:
                out = picked[fill : fill + m].view(-1, width)
                torch.index_select(iy_float.index_select(0, part), 1, cols_of[n], out=out)
            fill += m
    if fill:
        yield full()


def _put(rows: Tensor, cols: Tensor, out: Tensor) -> None:
    """``out = rows[:, None] * cols[None, :]`` in the factors' dtype, rounded to float32."""
    if rows.dtype == torch.float32:
        torch.mul(rows[:, None], cols[None, :], out=out)
    else:
        out.copy_(rows[:, None] * cols[None, :])
