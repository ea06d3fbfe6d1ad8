"""Vectorized histogram kernels and bin-range options shared by the two histogram quantities.

Both kernels run inside the core's per-sample pass (``per_sample_transform``): they get one
layer's per-sample gradients ``[B, *shape]`` and return a small float64 vector (counts and
a few extra numbers), so the per-sample gradients can be freed right after.

Binning is done in float32, as Cockpit 1.0.2 does for the usual float32 models (it clamps
``B * grad_batch`` and calls ``torch.histc``/its own 2-D quantizer in the gradient's
dtype); for float64 models this only moves elements that lie within float32 rounding of a
bin edge.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, cast

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor

from cockpit_histograms._fastbin import bin_counts

CHUNK = 1 << 24
"""Elements binned per call: ``torch.histc`` counts in float32, exact up to ``2**24``."""

MAX_BINS_2D = 1 << 22
"""Most bins of a 2-D histogram: joint bin indices stay exact in float32 arithmetic."""

EXTRA_1D = 4
"""Numbers after the counts in a 1-D layer result: NaN, +inf, -inf, max finite ``|g|``."""

EXTRA_2D = 6
"""Numbers after the counts in a 2-D layer result: NaN, +inf, -inf, pairs with a
non-finite parameter, max finite ``|g|``, max finite ``|theta|``."""


class RangeAdaptation(BaseModel):
    """How a histogram moves its bin range to ``[-m, m]`` from an observed maximum ``m``.

    As Cockpit 1.0.2's ``GradAbsMax``/``ParamAbsMax``: ``m' = (1 + padding) *
    max(min_size / 2, m)``. The range found at a tracked step is used from the next
    tracked step on (the histogram of the step itself uses the range it started with).
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["grad_abs_max", "param_abs_max"] = Field(
        "grad_abs_max",
        description="'grad_abs_max': largest finite |per-sample gradient element|; "
        "'param_abs_max': largest finite |parameter element|.",
    )
    padding: float = Field(0.0, ge=0.0, description="Relative padding added to the maximum.")
    min_size: float = Field(1e-6, gt=0.0, description="Smallest width of the range.")

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: object) -> object:
        return {"kind": data} if isinstance(data, str) else data

    def new_range(self, abs_max: float, old: tuple[float, float]) -> tuple[float, float]:
        """The adapted range, or ``old`` if no finite value was observed (``abs_max < 0``)."""
        if not math.isfinite(abs_max) or abs_max < 0:
            return old
        end = (1.0 + self.padding) * max(self.min_size / 2, abs_max)
        return (-end, end)


def check_range(value: tuple[float, float], what: str) -> tuple[float, float]:
    """Raise ``ValueError`` with a fix unless ``value`` is a finite ``(low, high)``, low < high."""
    lo, hi = float(value[0]), float(value[1])
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
        raise ValueError(
            f"{what} must be two finite numbers (low, high) with low < high, got {value}; "
            "e.g. range = [-2, 2]."
        )
    return (lo, hi)


def scan(v: Tensor) -> tuple[bool, Tensor]:
    """``(all finite?, largest finite |v|)`` of a chunk (see :func:`_scan_range`)."""
    finite, top, _ = _scan_range(v, -math.inf, math.inf)
    return finite, top


def _scan_range(v: Tensor, lo: float, hi: float) -> tuple[bool, Tensor, bool]:
    """``(all finite?, largest finite |v|, all within [lo, hi]?)``, deciding cheaply.

    On the CPU a host sync is free, so one fast ``aminmax`` pass decides, and the slower
    non-finite bookkeeping (and clamping) runs only when needed. On accelerators the
    bookkeeping always runs (a few cheap element-wise kernels) to avoid a device sync per
    layer. The maximum is ``-1`` when there is no finite element ("nothing observed").
    """
    if v.numel() == 0:
        return True, torch.tensor(-1.0, dtype=torch.float64, device=v.device), True
    if v.device.type == "cpu":
        # tolist: a 0-d tensor's float without another dispatched operation (item has one)
        low, high = (cast(float, t.tolist()) for t in torch.aminmax(v))
        if math.isfinite(low) and math.isfinite(high):
            top = torch.tensor(max(abs(low), abs(high)), dtype=torch.float64)
            return True, top, within(low, high, lo, hi)
    top = torch.where(torch.isfinite(v), v.abs(), -1.0).max()
    return False, top.to(torch.float64), False


def within(low: float, high: float, lo: float, hi: float) -> bool:
    """Whether ``[low, high]`` lies in ``[lo, hi]`` and in its float32 rounding.

    Clamping such values is a no-op whichever precision the bounds are applied in, so
    the clamp can be skipped without changing a count.
    """
    return low >= max(lo, float(np.float32(lo))) and high <= min(hi, float(np.float32(hi)))


def _nonfinite_counts(v: Tensor) -> Tensor:
    """``[#NaN, #+inf, #-inf]`` as float64."""
    inf = float("inf")
    counts = [torch.isnan(v).sum(), (v == inf).sum(), (v == -inf).sum()]
    return torch.stack(counts).to(torch.float64)


def _max_or_none(values: list[Tensor], device: torch.device) -> Tensor:
    if not values:
        return torch.tensor(-1.0, dtype=torch.float64, device=device)
    return values[0] if len(values) == 1 else torch.stack(values).max()


def hist1d_layer(per_sample: Tensor, lo: float, hi: float, bins: int) -> Tensor:
    """Histogram of all elements of one layer's per-sample gradients.

    Finite values outside ``[lo, hi]`` are clamped into the edge bins (as Cockpit 1.0.2);
    NaN and +-inf are not binned but counted.

    Returns:
        float64 ``[bins + 4]``: counts, #NaN, #+inf, #-inf, largest finite ``|value|``
        (``-1`` if none).

    """
    flat = per_sample.reshape(-1)
    device = flat.device
    if flat.numel() <= CHUNK:  # the usual case: one chunk, no running sums
        counts, bad, top = _hist1d_chunk(flat, lo, hi, bins)
        return torch.cat([counts, bad, top.reshape(1)])
    counts = torch.zeros(bins, dtype=torch.float64, device=device)
    bad = torch.zeros(3, dtype=torch.float64, device=device)
    tops = []
    for start in range(0, flat.numel(), CHUNK):
        chunk_counts, chunk_bad, top = _hist1d_chunk(flat[start : start + CHUNK], lo, hi, bins)
        counts += chunk_counts
        bad += chunk_bad
        tops.append(top)
    return torch.cat([counts, bad, _max_or_none(tops, device).reshape(1)])


def _hist1d_chunk(flat: Tensor, lo: float, hi: float, bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(counts, [#NaN, #+inf, #-inf], largest finite |value|)`` of at most :data:`CHUNK` values."""
    owned = flat.dtype != torch.float32  # the float32 chunk is a copy we may overwrite
    v = flat.to(torch.float32)
    finite, top, inside = _scan_range(v, lo, hi)
    if inside:  # clamping would change nothing
        counts = bin_counts(v, lo, hi, bins)
    elif finite:
        counts = bin_counts(v.clamp_(lo, hi) if owned else v.clamp(lo, hi), lo, hi, bins)
    else:
        # histc ignores NaN; mapping +-inf to NaN keeps them out of the edge bins
        clamped = torch.where(torch.isfinite(v), v, float("nan")).clamp_(lo, hi)
        counts = torch.histc(clamped, bins=bins, min=lo, max=hi).to(torch.float64)
        return counts, _nonfinite_counts(v), top
    return counts, torch.zeros(3, dtype=torch.float64, device=v.device), top


def hist2d_layer(
    per_sample: Tensor,
    param: Tensor,
    ranges: tuple[tuple[float, float], tuple[float, float]],
    bins: tuple[int, int],
) -> Tensor:
    """Joint histogram of (per-sample gradient element, parameter element) of one layer.

    Each pair ``(g_n[i], theta[i])`` is one count. As in Cockpit 1.0.2, values are clamped
    to the centres of the edge bins and quantized as ``floor((v - low) / width)``. Pairs
    with a non-finite gradient element or parameter are not binned but counted. The joint
    index ``ix * ybins + iy`` is counted with ``torch.bincount`` on int32 (CPU) or
    ``torch.histc``, which needs ``xbins * ybins <= 2**22`` to stay exact in float32.

    Returns:
        float64 ``[xbins * ybins + 6]``: counts (row-major ``[xbins, ybins]``), #NaN,
        #+inf, #-inf gradient elements, #pairs with a non-finite parameter, largest finite
        ``|g|``, largest finite ``|theta|`` (``-1`` if none).

    """
    (xlo, xhi), (ylo, yhi) = ranges
    xbins, ybins = bins
    wx, wy = (xhi - xlo) / xbins, (yhi - ylo) / ybins
    n, batch = param.numel(), per_sample.shape[0]
    device = per_sample.device
    grads = per_sample.reshape(batch, n)
    theta = param.detach().reshape(n).to(torch.float32)
    theta_finite, theta_top = scan(theta)
    iy = ((theta.clamp(ylo + wy / 2, yhi - wy / 2) - ylo) / wy).long().to(torch.float32)
    iy_int = iy.to(torch.int32)
    size = xbins * ybins
    if not theta_finite:
        theta_ok = torch.isfinite(theta)
    counts = torch.zeros(size, dtype=torch.float64, device=device)
    bad = torch.zeros(3, dtype=torch.float64, device=device)
    tops = []
    rows = max(1, CHUNK // max(n, 1))
    owned = grads.dtype != torch.float32  # the float32 chunks are copies we may overwrite
    low, high = xlo + wx / 2, xhi - wx / 2
    for start in range(0, batch if n else 0, rows):
        g = grads[start : start + rows].to(torch.float32)
        finite, top = scan(g)
        tops.append(top)
        ok = None
        if not finite:
            bad += _nonfinite_counts(g)
            ok = torch.isfinite(g)
        if not theta_finite:
            ok = theta_ok if ok is None else ok & theta_ok
        # floor((v - low) / width) as Cockpit 1.0.2 (v - low > 0 after the clamp, so the
        # truncation is the floor), then the row-major joint bin index ix * ybins + iy
        idx = g.clamp_(low, high) if owned else g.clamp(low, high)
        idx = idx.sub_(xlo).div_(wx)
        if ok is None and idx.device.type == "cpu":
            # the int32 conversion truncates (faster than trunc_); int32 bincount is ~5x
            # faster than histc here
            joint = torch.bincount(
                torch.add(iy_int, idx.to(torch.int32), alpha=ybins).reshape(-1), minlength=size
            )
        else:  # in place and in float32 (exact: indices < 2**22)
            idx = torch.add(iy, idx.trunc_(), alpha=ybins, out=idx)
            if ok is not None:
                idx = torch.where(ok, idx, float("nan"))  # histc ignores NaN
            # integer k sits in the middle of bin [k - 1/2, k + 1/2): rounding cannot move it
            joint = torch.histc(idx, bins=size, min=-0.5, max=size - 0.5)
        counts += joint.to(torch.float64)
    bad_params = torch.zeros(1, dtype=torch.float64, device=device)
    if not theta_finite:
        bad_params += (~theta_ok).sum() * batch
    tops_max = _max_or_none(tops, device).reshape(1)
    return torch.cat([counts, bad, bad_params, tops_max, theta_top.reshape(1)])


def stack_layers(layers: Sequence[Tensor | None], width: int, maxima: int) -> Tensor:
    """Stack per-layer results on one device.

    A parameter without gradient gets zeros, and ``-1`` ("nothing observed") in its last
    ``maxima`` entries.
    """
    present = [t for t in layers if t is not None]
    device = present[0].device if present else torch.device("cpu")
    empty = torch.zeros(width, dtype=torch.float64, device=device)
    empty[width - maxima :] = -1.0
    if not layers:
        return empty[None][:0]
    return torch.stack([empty if t is None else t.to(device) for t in layers])


def param_abs_max(params: Sequence[Tensor]) -> float:
    """Largest finite ``|theta_i|`` over all parameters (``-1`` if there is none)."""
    device = params[0].device if params else torch.device("cpu")
    tops = [scan(p.detach().reshape(-1))[1].to(device) for p in params if p.numel()]
    return float(torch.stack(tops).max()) if tops else -1.0


def check_layers(layers: Sequence[Tensor | None], width: int, names: Sequence[str]) -> None:
    """Raise if a layer's result does not have the expected ``width`` (a broken backend).

    A transform that raised never gets here: the core reports it through ``ctx.stat``.
    """
    failed = [n for n, t in zip(names, layers) if t is not None and t.numel() != width]
    if failed:
        raise RuntimeError(
            f"the histogram of parameter(s) {failed} has a wrong size: expected {width} "
            "numbers per parameter from the per-sample transform."
        )
