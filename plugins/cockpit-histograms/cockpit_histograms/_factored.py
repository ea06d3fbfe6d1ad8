"""Histograms of a linear layer's per-sample gradients from their factors, ``g_n = d_n a_n^T``.

A linear layer's per-sample weight gradients are outer products of the output gradients
``d_n`` (``[out]``) and the inputs ``a_n`` (``[in]``) (Goodfellow, 2015, "Efficient
per-example gradient computations"). Forming all of them costs ``B x out x in`` elements
(75 M for the first dense layer of the 3c3d network); binning them is the most expensive
part of the histograms. In ReLU networks many ``a_n`` and ``d_n`` entries are exactly zero,
and a product with a zero factor is exactly zero, so:

- the zero products are counted without forming them:
  ``#zeros = B out in - sum_n nnz(d_n) nnz(a_n)``, all in the bin that holds ``0``;
- the other products are formed per sample from the non-zero entries only, into a small
  float32 buffer that is binned whenever it is full (no ``B x out x in`` tensor);
- the clamp into the range is skipped when the extreme products (from the extreme factor
  entries) lie inside it, and the largest ``|g|`` is ``max_n max|d_n| max|a_n|``
  (rounding is monotone, so this is the largest rounded product).

Every element gets the same bin as when the products are materialized and binned by
:func:`~cockpit_histograms._binning.hist1d_layer` (the same float32 products and the same
``torch.histc`` call), so the counts are identical, not approximately equal. Factors with
NaN/inf (whose products with zero are NaN) take the materializing path.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from cockpit_histograms import _binning
from cockpit_histograms._fastbin import bin_counts

BUFFER = 1 << 21
"""Products formed and binned at a time (8 MiB of float32)."""

SMALL = 1 << 16
"""Below this many products, forming them all is cheaper than the bookkeeping."""

DENSE = 0.25
"""Below this fraction of zero products, all products are formed (in blocks of samples)."""


def hist1d_factored(d: Tensor, a: Tensor, lo: float, hi: float, bins: int) -> Tensor:
    """:func:`~cockpit_histograms._binning.hist1d_layer` of ``g_n = d_n a_n^T`` from the factors.

    Args:
        d: Output gradients ``[B, out]`` (of each sample's own loss).
        a: Layer inputs ``[B, in]``.
        lo: Lower end of the range.
        hi: Upper end of the range.
        bins: Number of bins.

    Returns:
        float64 ``[bins + 4]`` as :func:`~cockpit_histograms._binning.hist1d_layer`.

    """
    # the materializing kernel for: tiny layers, accelerators, and NaN/inf factors or
    # products that overflow float32 (inf * 0 = NaN must be counted as NaN)
    if not _factored_path_applies(d, a):
        return _binning.hist1d_layer(d[:, :, None] * a[:, None, :], lo, hi, bins)
    top = (d.abs().amax(1) * a.abs().amax(1)).max().to(torch.float32).to(torch.float64)
    if not math.isfinite(float(top)):
        return _binning.hist1d_layer(d[:, :, None] * a[:, None, :], lo, hi, bins)
    batch, n_out, n_in = d.shape[0], d.shape[1], a.shape[1]
    nonzero_d: Tensor | None
    nonzero_a: Tensor | None
    k_d: Tensor | None
    k_a: Tensor | None
    nonzero_d, nonzero_a = d != 0, a != 0
    k_d, k_a = nonzero_d.sum(1), nonzero_a.sum(1)
    n_nonzero = int((k_d * k_a).sum())
    counts = torch.zeros(bins, dtype=torch.float64)
    n_zero = batch * n_out * n_in - n_nonzero
    if n_zero < DENSE * batch * n_out * n_in:  # few zeros: skipping them costs more than binning
        n_nonzero, n_zero = batch * n_out * n_in, 0
        nonzero_d = nonzero_a = k_d = k_a = None
    zero = torch.zeros(1, dtype=torch.float32).clamp_(lo, hi)
    counts += torch.histc(zero, bins=bins, min=lo, max=hi).to(torch.float64) * n_zero

    d_min, d_max = torch.aminmax(d, dim=1)
    a_min, a_max = torch.aminmax(a, dim=1)
    corners = torch.stack([d_min * a_min, d_min * a_max, d_max * a_min, d_max * a_max])
    corners = corners.to(torch.float32)
    inside = _binning.within(float(corners.min()), float(corners.max()), lo, hi)

    buffer = torch.empty(min(max(BUFFER, n_in), max(n_nonzero, 1)), dtype=torch.float32)
    for chunk in _products(d, a, nonzero_d, nonzero_a, k_d, k_a, buffer, n_nonzero):
        v = chunk if inside else chunk.clamp_(lo, hi)
        counts.add_(bin_counts(v, lo, hi, bins))
    bad = torch.zeros(3, dtype=torch.float64)
    return torch.cat([counts, bad, top.reshape(1)])


def _factored_path_applies(d: Tensor, a: Tensor) -> bool:
    if d.dim() != 2 or a.dim() != 2 or d.device.type != "cpu" or a.shape[1] > BUFFER:
        return False
    if d.shape[0] * d.shape[1] * a.shape[1] < max(SMALL, 1):
        return False
    return bool(torch.isfinite(d).all()) and bool(torch.isfinite(a).all())


def _products(
    d: Tensor,
    a: Tensor,
    nonzero_d: Tensor | None,
    nonzero_a: Tensor | None,
    k_d: Tensor | None,
    k_a: Tensor | None,
    buffer: Tensor,
    n_products: int,
) -> Iterator[Tensor]:
    """Fill ``buffer`` with float32 products ``d_ni a_nj`` and yield it whenever it is full.

    Without masks (``nonzero_d is None``) every product is formed, a block of samples at a
    time; with masks, only the products of non-zero entries, one sample at a time.
    Products are computed in the factors' dtype and then rounded to float32, as when the
    per-sample gradients are materialized first.
    """
    if n_products == 0:
        return
    batch, n_out, n_in = d.shape[0], d.shape[1], a.shape[1]
    same_dtype = d.dtype == torch.float32
    fill = 0

    def put(rows: Tensor, cols: Tensor) -> None:  # rows [m, r], cols [m, c] -> m r c products
        out = buffer[fill : fill + rows.numel() * cols.shape[1]].view(
            rows.shape[0], rows.shape[1], cols.shape[1]
        )
        if same_dtype:
            torch.mul(rows[:, :, None], cols[:, None, :], out=out)
        else:
            out.copy_(rows[:, :, None] * cols[:, None, :])

    if nonzero_d is None:
        samples = buffer.numel() // (n_out * n_in)
        if samples >= 1:  # whole samples per block
            for start in range(0, batch, samples):
                rows, cols = d[start : start + samples], a[start : start + samples]
                put(rows, cols)
                yield buffer[: rows.numel() * n_in]
            return
        sample_rows = ((d[n], a[n]) for n in range(batch))
    else:
        assert nonzero_a is not None and k_d is not None and k_a is not None, "masks come together"
        sample_rows = (
            (d[n][nonzero_d[n]], a[n][nonzero_a[n]])
            for n, (kd, ka) in enumerate(zip(k_d.tolist(), k_a.tolist()))
            if kd and ka
        )
    for d_n, a_n in sample_rows:
        width = a_n.numel()
        n_rows = max(1, buffer.numel() // width)
        for r in range(0, d_n.numel(), n_rows):
            part = d_n[r : r + n_rows]
            size = part.numel() * width
            if fill + size > buffer.numel():
                yield buffer[:fill]
                fill = 0
            put(part[None], a_n[None])
            fill += size
    if fill:
        yield buffer[:fill]


def hist1d_sparse(values: Tensor, n_zero: int, lo: float, hi: float, bins: int) -> Tensor:
    """:func:`~cockpit_histograms._binning.hist1d_layer` of a tensor given by its non-zero part.

    For per-sample gradients whose elements are ``values`` and ``n_zero`` exact zeros (an
    embedding's rows: a sample touches a few rows of the weight), the zeros are counted
    into their bin without forming them.
    """
    out = _binning.hist1d_layer(values, lo, hi, bins)
    if n_zero:
        zero = torch.zeros(1, dtype=torch.float32).clamp_(lo, hi)
        out[:bins] += torch.histc(zero, bins=bins, min=lo, max=hi).to(out.dtype) * n_zero
        out[-1] = out[-1].clamp(min=0.0)  # the zeros' |g| = 0 is a maximum candidate
    return out
