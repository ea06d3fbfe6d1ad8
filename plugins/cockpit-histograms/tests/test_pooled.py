"""Small parameters binned together (the transforms' ``pooled_fn``) get their own histograms.

Reference: the per-parameter kernels ``hist1d_layer``/``hist2d_layer`` (checked against
numpy in ``test_grad_hist_1d.py``, ``test_grad_hist_2d.py`` and ``test_binning.py``) on
each member of the pool, and ``torch.histc`` row by row for ``bin_rows``. Everything is
compared exactly: counts are integers, and the extra entries (NaN/inf counts, largest
finite ``|value|``) are the same float32 values widened to float64. The small members
use ``torch.histc`` in the per-parameter kernel, so the pooled quantization is checked
against ``torch.histc`` itself. End to end, a run with pooling equals the same run with
pooling switched off (``MEMBER_BYTES = 0``) and brute-force per-sample gradients (an
autograd loop, float64) counted by numpy.
"""

import numpy as np
import pytest
import torch
from cockpit_histograms import GradHist1d, GradHist2d, _fastbin, _pooled, grad_hist_1d
from cockpit_histograms._binning import hist1d_layer, hist2d_layer

from cockpit_core.statistics import pool
from cockpit_core.testing import run_cockpit
from cockpit_core.testing.reference import per_sample_gradients
from cockpit_core.testing.transformer import tiny_transformer

INF, NAN = float("inf"), float("nan")

RANGES_1D = [
    (-2.0, 2.0, 100),
    (-0.05, 0.02, 7),
    (-1.0, 1.0, 10_000),  # P (bins + 1) WAYS > 2**15: int32 indices
    (0.001, 0.0010000001, 4),  # one float32 apart: exact_for fails, histc per member
]


def edges_and_neighbours(lo, hi, bins):
    """Every bin edge in float32 and its two float32 neighbours."""
    edges = torch.linspace(lo, hi, bins + 1).float()
    below = torch.nextafter(edges, torch.tensor(-INF))
    above = torch.nextafter(edges, torch.tensor(INF))
    return torch.cat([edges, below, above])


def pool_1d(lo, hi, bins, dtype, nonfinite=True, count=6, batch=3, dim=40, seed=0):
    """``[P, B, D]`` values around the range (some outside); edges and non-finite values."""
    gen = torch.Generator().manual_seed(seed)
    width = hi - lo
    grads = torch.rand(count, batch, dim, generator=gen, dtype=torch.float64) * 1.4 - 0.2
    grads = grads * width + lo  # 20% below lo, 20% above hi
    grads[1] = (grads[1] - lo) * 0.5 + lo + 0.25 * width  # a member inside the range
    special = edges_and_neighbours(lo, hi, bins)[: batch * dim].to(torch.float64)
    grads[2].view(-1)[: special.numel()] = special  # exactly at the edges (float32 values)
    if nonfinite:
        grads[3, 0, 0], grads[3, 1, 5] = NAN, INF
        grads[4, 2, 7] = -INF
    return grads.to(dtype)


def per_member_1d(grads, lo, hi, bins):
    return torch.stack([hist1d_layer(g, lo, hi, bins) for g in grads])


def assert_equal(got, want):
    assert got.dtype == torch.float64 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=False)


def assert_unchanged(grads, before):
    """The core's pooled gradients are read, never overwritten."""
    torch.testing.assert_close(grads, before, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("lo", "hi", "bins"), RANGES_1D)
def test_1d_rows_equal_the_per_parameter_kernel(lo, hi, bins, dtype):
    grads = pool_1d(lo, hi, bins, dtype)
    before = grads.clone()
    got = _pooled.hist1d_pool(grads, lo, hi, bins)
    assert_unchanged(grads, before)
    assert_equal(got, per_member_1d(grads, lo, hi, bins))
    # the test covers clamping (or histc per member), non-finite counts and the largest |g|
    if _fastbin.exact_for(lo, hi, bins):
        assert got[0, 0] > 0 and got[0, bins - 1] > 0
    else:
        assert (lo, hi, bins) == RANGES_1D[-1]
    assert got[3, bins : bins + 3].tolist() == [1.0, 1.0, 0.0]
    assert got[4, bins : bins + 3].tolist() == [0.0, 0.0, 1.0]
    assert got[:, : bins + 3].sum() == grads.numel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_1d_finite_pools_take_one_bincount(monkeypatch, dtype):
    """All members finite and inside: one quantization and count, no per-member kernel."""
    calls = []
    count_rows = _fastbin._count_rows
    monkeypatch.setattr(_fastbin, "_count_rows", lambda *a: calls.append(1) or count_rows(*a))
    monkeypatch.setattr(_pooled, "hist1d_layer", None)  # must not be called
    for inside in (True, False):  # without and with the clamp
        lo, hi = (-5.0, 5.0) if inside else (-0.5, 0.5)
        grads = torch.randn(7, 4, 9, generator=torch.Generator().manual_seed(2), dtype=dtype)
        got = _pooled.hist1d_pool(grads, lo, hi, 13)
        assert_equal(got, per_member_1d(grads, lo, hi, 13))
        assert got[:, -1].tolist() == [float(g.float().abs().max()) for g in grads]
    assert calls == [1, 1]


@pytest.mark.parametrize("limit", ["COUNTERS", "PIECE"])
def test_1d_many_members_are_counted_in_groups(monkeypatch, limit):
    calls = []
    count_rows = _fastbin._count_rows
    monkeypatch.setattr(_fastbin, "_count_rows", lambda *a: calls.append(1) or count_rows(*a))
    # 3 members a group: 3 * (bins + 1) * WAYS counters, or 3 * B * D values
    monkeypatch.setattr(_fastbin, limit, 3 * (21 * _fastbin.WAYS if limit == "COUNTERS" else 120))
    grads = pool_1d(-1.0, 1.0, 20, torch.float32, nonfinite=False, count=8)
    assert_equal(_pooled.hist1d_pool(grads, -1.0, 1.0, 20), per_member_1d(grads, -1.0, 1.0, 20))
    assert len(calls) == 3


def test_1d_a_different_rounding_falls_back_to_each_member(monkeypatch):
    """Where the vectorized assignment is not proved equal to histc, each member uses histc."""

    def reciprocal(v, lo32, scale, r32, bins, out, work=None):
        return out.copy_(torch.sub(v, lo32).mul_(scale * (1.0 / r32)))

    monkeypatch.setattr(_fastbin, "_quantize", reciprocal)
    _fastbin.exact_for.cache_clear()
    try:
        lo, hi, bins = next(
            r for r in [(-3.3, 7.1, 37), (-2.0, 2.0, 100)] if not _fastbin.exact_for(*r)
        )
        grads = pool_1d(lo, hi, bins, torch.float32)
        assert_equal(_pooled.hist1d_pool(grads, lo, hi, bins), per_member_1d(grads, lo, hi, bins))
    finally:
        _fastbin.exact_for.cache_clear()


def test_1d_all_nonfinite_and_empty_members():
    grads = torch.full((2, 3, 4), NAN)
    grads[1] = INF
    got = _pooled.hist1d_pool(grads, -1.0, 1.0, 5)
    assert_equal(got, per_member_1d(grads, -1.0, 1.0, 5))
    assert got[:, -1].tolist() == [-1.0, -1.0]  # nothing finite observed
    empty = torch.zeros(3, 2, 0)
    assert_equal(_pooled.hist1d_pool(empty, -1.0, 1.0, 5), per_member_1d(empty, -1.0, 1.0, 5))


@pytest.mark.parametrize("bins", [5, 100, 10_000])
def test_bin_rows_equals_histc_row_by_row(bins):
    gen = torch.Generator().manual_seed(3)
    v = (torch.randn(9, 500, generator=gen) * 0.3).clamp(-1.0, 1.0)
    v[4, :] = 0.01  # one crowded bin
    v[5, : 3 * (bins + 1)] = edges_and_neighbours(-1.0, 1.0, bins).clamp(-1.0, 1.0)[:500]
    want = torch.stack([torch.histc(r, bins=bins, min=-1.0, max=1.0) for r in v]).double()
    assert_equal(_fastbin.bin_rows(v, -1.0, 1.0, bins), want)


def test_bin_counts_in_one_piece_equals_histc(monkeypatch):
    monkeypatch.setattr(_fastbin, "SMALL", 0)
    v = (torch.randn(3000, generator=torch.Generator().manual_seed(4)) * 0.5).clamp(-1.0, 1.0)
    want = torch.histc(v, bins=17, min=-1.0, max=1.0).double()
    assert_equal(_fastbin.bin_counts(v, -1.0, 1.0, 17), want)


RANGES_2D = [((-1.0, 1.0), (-2.0, 2.0)), ((-0.03, 0.01), (-0.2, 0.1))]


def pool_2d(dtype, count=6, batch=3, shapes=((2, 5), (10,)), seed=0):
    """Per-sample gradients ``[P, B, 10]`` and parameters of two shapes with 10 elements."""
    gen = torch.Generator().manual_seed(seed)
    grads = torch.randn(count, batch, 10, generator=gen, dtype=torch.float64) * 0.6
    params = [
        torch.randn(shapes[p % 2], generator=gen, dtype=torch.float64) * 1.5 for p in range(count)
    ]
    grads[0, 1, :3] = torch.tensor([-0.95, 0.0, 0.5])  # exactly at x edges of (40, 50) bins
    params[0].view(-1)[:3] = torch.tensor([-1.92, 0.0, 0.08])  # and at y edges
    return grads.to(dtype), [p.to(dtype) for p in params]


def per_member_2d(grads, params, ranges, bins):
    return torch.stack([hist2d_layer(g, p, ranges, bins) for g, p in zip(grads, params)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ranges", RANGES_2D)
@pytest.mark.parametrize("nonfinite", [False, True])
def test_2d_rows_equal_the_per_parameter_kernel(ranges, dtype, nonfinite):
    bins = (40, 50)
    grads, params = pool_2d(dtype)
    if nonfinite:
        grads[2, 0, 3], grads[3, 1, 1] = NAN, -INF
        params[4].view(-1)[2] = INF
    before = grads.clone()
    got = _pooled.hist2d_pool(grads, params, ranges, bins)
    assert_unchanged(grads, before)
    assert_equal(got, per_member_2d(grads, params, ranges, bins))
    size = bins[0] * bins[1]
    assert got[:, : size + 4].sum() == grads.numel()  # pairs with NaN/inf counted apart
    if nonfinite:
        assert got[4, size + 3] == grads.shape[1]  # pairs with the non-finite parameter


@pytest.mark.parametrize("limit", ["COUNTERS", "PIECE"])
def test_2d_many_members_are_counted_in_groups(monkeypatch, limit):
    calls = []
    bincount = torch.bincount
    monkeypatch.setattr(torch, "bincount", lambda *a, **k: calls.append(1) or bincount(*a, **k))
    # 2 members a group: 2 * 12 counters, or 2 * B * D values
    monkeypatch.setattr(_pooled, limit, 2 * (12 if limit == "COUNTERS" else 30))
    grads, params = pool_2d(torch.float32, count=5)
    before = grads.clone()
    ranges, bins = RANGES_2D[1], (4, 3)
    got = _pooled.hist2d_pool(grads, params, ranges, bins)
    assert len(calls) == 3
    assert_unchanged(grads, before)
    assert_equal(got, per_member_2d(grads, params, ranges, bins))


RANGES_2D_RUN = ((-0.9, 1.0), (-2.0, 2.1))


def reference_counts(grads, lo, hi, bins):
    """Per-parameter counts [P, bins] of the float32-rounded, clipped per-sample gradients."""
    rows = []
    for g in grads:
        v = np.clip(g.numpy().astype(np.float32).ravel(), np.float32(lo), np.float32(hi))
        rows.append(np.histogram(v, bins=bins, range=(lo, hi))[0])
    return np.stack(rows)


def test_a_run_with_pools_equals_brute_force_and_the_run_without(monkeypatch, reference_2d):
    """A transformer (norms, biases, projections of equal sizes) binned in pools."""
    rows = []
    hist1d_pool = _pooled.hist1d_pool

    def counting(grads, *args):
        rows.append(len(grads))
        return hist1d_pool(grads, *args)

    monkeypatch.setattr(grad_hist_1d, "hist1d_pool", counting)

    def run():
        # 0 is no bin edge: the attention's key biases stay 0 and get gradients of about
        # 0 (exactly or not, depending on the order of summation)
        quantities = [
            GradHist1d(range=(-0.25, 0.3)),
            GradHist2d(range=RANGES_2D_RUN, keep_individual=True),
        ]
        return run_cockpit(tiny_transformer(), quantities, steps=2, attach=True)

    pooled = run()
    assert sum(rows) >= 8 and max(rows) > 1  # most parameters, several to a pool
    monkeypatch.setattr(pool, "MEMBER_BYTES", 0)
    rows.clear()
    alone = run()
    assert rows == []
    for snap in pooled.snapshots:
        got, want = pooled.output[snap.step], alone.output[snap.step]
        for name in ("grad_hist_1d", "grad_hist_2d"):
            np.testing.assert_array_equal(got[name]["per_param"], want[name]["per_param"])
            assert got[name]["grad_abs_max"] == want[name]["grad_abs_max"]
        grads = per_sample_gradients(pooled.model_at(snap.step), pooled.problem, snap.x, snap.y)
        expected = reference_counts(grads, -0.25, 0.3, 100)
        assert expected[:, 0].sum() > 0 and expected[:, -1].sum() > 0  # clamped outliers
        np.testing.assert_array_equal(got["grad_hist_1d"]["per_param"], expected)
        np.testing.assert_array_equal(
            got["grad_hist_2d"]["per_param"],
            reference_2d(grads, snap.params, RANGES_2D_RUN, (40, 50)),
        )
