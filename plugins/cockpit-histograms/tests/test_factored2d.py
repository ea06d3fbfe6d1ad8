"""The factored 2-D histogram kernel gives exactly the counts of the materializing kernel.

``hist2d_factored(d, a, theta)`` bins the pairs ``([g_n]_ij, theta_ij)`` of
``g_n = d_n a_n^T`` without forming all products; the reference is :func:`hist2d_layer`
on the materialized products (itself tested against ``numpy.histogram2d`` of brute-force
per-sample gradients), compared exactly (counts, non-finite counts and maxima). The
fast-path tests make sure the fast path ran (the materializing kernel raises there).
"""

import numpy as np
import pytest
import torch
from cockpit_backpack import extend
from cockpit_histograms import GradHist2d, _binning, _factored2d

from cockpit_core.statistics import pool
from cockpit_core.testing import run_cockpit
from cockpit_core.testing.problems import Problem
from cockpit_core.testing.reference import per_sample_gradients

RANGES = ((-1.0, 1.0), (-2.0, 2.0))


@pytest.fixture(autouse=True)
def no_small_shortcut(monkeypatch):
    """Take the fast path even for these small tensors (real layers are larger)."""
    monkeypatch.setattr(_factored2d, "SMALL", 0)


def factors(batch, n_out, n_in, zeros_d, zeros_a, dtype=torch.float32, scale=1.0, seed=0):
    """ReLU-like factors: ``a >= 0``, with fractions of exact zeros in ``d`` and ``a``."""
    gen = torch.Generator().manual_seed(seed)
    d = torch.randn(batch, n_out, generator=gen, dtype=dtype) * scale
    a = torch.randn(batch, n_in, generator=gen, dtype=dtype).abs()
    d[torch.rand(batch, n_out, generator=gen) < zeros_d] = 0.0
    a[torch.rand(batch, n_in, generator=gen) < zeros_a] = 0.0
    theta = torch.randn(n_out, n_in, generator=gen, dtype=dtype)
    return d, a, theta


def expected(d, a, theta, ranges=RANGES, bins=(7, 5)):
    return _binning.hist2d_layer(d[:, :, None] * a[:, None, :], theta, ranges, bins)


def fast(monkeypatch, d, a, theta, ranges=RANGES, bins=(7, 5)):
    """``hist2d_factored``, failing if it falls back to the materializing kernel."""
    plans = []
    blocks = _factored2d._blocks

    def spy(u, v, nonzero_u, nonzero_v, iy, values):
        plans.append(("a" if u is a else "d", nonzero_v is not None))
        return blocks(u, v, nonzero_u, nonzero_v, iy, values)

    def fail(*args, **kwargs):
        raise AssertionError("the materializing kernel ran")

    with monkeypatch.context() as m:
        m.setattr(_binning, "hist2d_layer", fail)
        m.setattr(_factored2d, "_blocks", spy)
        out = _factored2d.hist2d_factored(d, a, theta, ranges, bins)
    return out, plans


def assert_same(got, want):
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("zeros_d", "zeros_a", "gather_cost", "plan"),
    [
        (0.6, 0.2, 1e9, ("d", False)),  # rows of non-zero d_ni, all columns
        (0.2, 0.6, 1e9, ("a", False)),  # transposed: rows of non-zero a_nj
        (0.6, 0.5, 0.0, ("d", True)),  # non-zero entries of both factors only
        (0.3, 0.7, 0.0, ("a", True)),
        (0.0, 0.0, 1e9, ("d", False)),  # no zeros: every product formed
    ],
)
@pytest.mark.parametrize(("scale", "ranges"), [(0.3, RANGES), (1.0, ((-0.3, 0.2), (-0.5, 0.1)))])
def test_equals_the_materialized_histogram(
    monkeypatch, dtype, zeros_d, zeros_a, gather_cost, plan, scale, ranges
):
    """Every plan, float32/float64 factors, values inside and outside both ranges."""
    d, a, theta = factors(6, 13, 17, zeros_d, zeros_a, dtype, scale)
    d[1] = 0.0  # a sample without gradient
    a[2] = 0.0  # a sample without input
    monkeypatch.setattr(_factored2d, "GATHER_COST", gather_cost)
    got, plans = fast(monkeypatch, d, a, theta, ranges)
    assert plans == [plan]
    assert_same(got, expected(d, a, theta, ranges))
    assert got[:-6].sum() == d.shape[0] * theta.numel()


@pytest.mark.parametrize("buffer", [1, 20, 70, 130])  # row by row ... several samples per block
@pytest.mark.parametrize("gather_cost", [0.0, 1e9])
def test_small_buffers_split_samples_and_rows(monkeypatch, buffer, gather_cost):
    d, a, theta = factors(5, 9, 7, 0.4, 0.4, seed=3)
    monkeypatch.setattr(_factored2d, "BUFFER", buffer)
    monkeypatch.setattr(_factored2d, "GATHER_COST", gather_cost)
    got, _ = fast(monkeypatch, d, a, theta)
    assert_same(got, expected(d, a, theta))


def test_the_default_plan_on_a_layer_of_the_benchmark_shape(monkeypatch):
    """1152 -> 512 linear layer of the 3c3d network (scaled down in the batch)."""
    d, a, theta = factors(4, 512, 1152, 0.5, 0.3, scale=0.01, seed=1)
    theta *= 0.05
    bins = (40, 50)
    got, plans = fast(monkeypatch, d, a, theta, bins=bins)
    assert plans == [("d", False)]
    assert_same(got, expected(d, a, theta, bins=bins))


@pytest.mark.parametrize(
    "ranges",
    [
        ((-0.3, 0.1), (-2.0, 2.0)),  # 0 on an x-bin edge
        ((0.1, 0.5), (-2.0, 2.0)),  # 0 below the x range: zero products in the first bin
        ((-1.0, -0.5), (0.5, 3.0)),  # 0 above; parameters below the y range
    ],
)
@pytest.mark.parametrize("gather_cost", [0.0, 1e9])
def test_zero_products_on_edges_and_outside_the_range(monkeypatch, ranges, gather_cost):
    d, a, theta = factors(8, 6, 11, 0.5, 0.5, seed=4)
    monkeypatch.setattr(_factored2d, "GATHER_COST", gather_cost)
    got, _ = fast(monkeypatch, d, a, theta, ranges, bins=(4, 3))
    assert_same(got, expected(d, a, theta, ranges, bins=(4, 3)))


@pytest.mark.parametrize("gather_cost", [0.0, 1e9])
def test_products_next_to_every_bin_edge(monkeypatch, gather_cost):
    """Products equal to the 64 float32 values around each x-bin edge (d = +-1, 1/2, 2)."""
    (xlo, xhi), bins = (-0.7, 0.9), (13, 3)
    edges = torch.linspace(xlo, xhi, bins[0] + 1, dtype=torch.float32)
    bits = edges.view(torch.int32)[:, None] + torch.arange(-32, 32, dtype=torch.int32)
    values = torch.cat([bits.view(torch.float32).reshape(-1), torch.zeros(5)])
    a = torch.stack([values, values.flip(0), 2 * values])
    d = torch.tensor([[1.0, -1.0, 0.5, 0.0], [2.0, 1.0, 0.0, -0.5], [0.5, 0.0, 1.0, -2.0]])
    theta = torch.linspace(-3.0, 3.0, 4 * values.numel()).reshape(4, -1)
    monkeypatch.setattr(_factored2d, "GATHER_COST", gather_cost)
    ranges = ((xlo, xhi), (-2.0, 2.0))
    got, _ = fast(monkeypatch, d, a, theta, ranges, bins)
    assert_same(got, expected(d, a, theta, ranges, bins))


def test_one_sample_and_all_zero_factors(monkeypatch):
    d, a, theta = factors(1, 4, 3, 0.5, 0.3, seed=5)
    got, _ = fast(monkeypatch, d, a, theta)
    assert_same(got, expected(d, a, theta))
    d.zero_()  # nothing to form: all pairs counted through the zero masks
    got, _ = fast(monkeypatch, d, a, theta)
    assert_same(got, expected(d, a, theta))
    assert got[-2] == 0.0  # largest |g|


@pytest.mark.parametrize("where", ["d_nan", "a_inf", "theta_nan", "theta_inf", "overflow"])
def test_nonfinite_values_take_the_materializing_path(where):
    d, a, theta = factors(4, 3, 5, 0.3, 0.3)
    if where == "d_nan":
        d[2, 1] = float("nan")
    elif where == "a_inf":
        a[0, 0] = float("inf")  # inf * 0 = NaN must be counted as NaN
    elif where == "theta_nan":
        theta[1, 2] = float("nan")
    elif where == "theta_inf":
        theta[0, 0] = -float("inf")
    else:
        d[0, 0], a[0, 0] = 1e30, 1e30  # finite factors, product overflows float32
    got = _factored2d.hist2d_factored(d, a, theta, RANGES, (7, 5))
    assert_same(got, expected(d, a, theta))
    assert got[35:39].sum() > 0  # non-finite gradients or parameters are counted


def test_tiny_layers_take_the_materializing_path(monkeypatch):
    monkeypatch.setattr(_factored2d, "SMALL", 1 << 16)
    d, a, theta = factors(3, 2, 4, 0.3, 0.3)
    calls = []
    layer = _binning.hist2d_layer
    monkeypatch.setattr(_binning, "hist2d_layer", lambda *args: calls.append(1) or layer(*args))
    got = _factored2d.hist2d_factored(d, a, theta, RANGES, (7, 5))
    assert calls == [1]
    assert_same(got, layer(d[:, :, None] * a[:, None, :], theta, RANGES, (7, 5)))


def relu_mlp(batch_size=16, seed=0):
    """A 10-24-16-3 ReLU MLP (float64): factors with many exact zeros."""

    def make():
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Linear(10, 24),
            torch.nn.ReLU(),
            torch.nn.Linear(24, 16),
            torch.nn.ReLU(),
            torch.nn.Linear(16, 3),
        )
        return extend(model.double())

    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(64, 10, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (64,), generator=gen)
    return Problem("relu_mlp", make, x, y, batch_size, "cross_entropy", seed)


@pytest.mark.parametrize("gather_cost", [0.0, 1e9])
def test_a_relu_mlp_run_equals_brute_force(monkeypatch, gather_cost, reference_2d):
    """End to end through the core: the linear weights take the factored path."""
    monkeypatch.setattr(pool, "MEMBER_BYTES", 0)  # small layers would be binned together
    monkeypatch.setattr(_factored2d, "GATHER_COST", gather_cost)
    calls = []
    blocks = _factored2d._blocks
    monkeypatch.setattr(_factored2d, "_blocks", lambda *args: calls.append(1) or blocks(*args))
    ranges, bins = ((-0.2, 0.2), (-0.5, 0.5)), (20, 10)
    quantity = GradHist2d(bins=bins, range=ranges, keep_individual=True)
    result = run_cockpit(relu_mlp(), [quantity], steps=3)
    assert len(calls) == 3 * 3  # three weights, three steps
    for snap in result.snapshots:
        out = result.output[snap.step]["grad_hist_2d"]
        grads = per_sample_gradients(result.model_at(snap.step), result.problem, snap.x, snap.y)
        want = reference_2d(grads, snap.params, ranges, bins)
        np.testing.assert_array_equal(out["per_param"], want)
        assert (grads[2] == 0).sum() > 0  # ReLU: products with a zero factor
        assert out["grad_abs_max"] == pytest.approx(
            float(np.float32(max(g.abs().max().item() for g in grads))), rel=1e-6
        )
