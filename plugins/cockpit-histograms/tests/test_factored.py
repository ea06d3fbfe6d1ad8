"""The factored 1-D histogram kernel gives exactly the counts of the materializing kernel.

``hist1d_factored(d, a)`` bins ``g_n = d_n a_n^T`` without forming all products; the
reference is :func:`hist1d_layer` on the materialized products (itself tested against
``numpy.histogram`` of brute-force per-sample gradients). Counts are compared exactly.
"""

import pytest
import torch
from cockpit_histograms import _binning, _factored, _fastbin


@pytest.fixture(autouse=True)
def no_small_shortcut(monkeypatch):
    """Take the fast paths even for these small tensors (real layers are larger)."""
    monkeypatch.setattr(_factored, "SMALL", 0)
    monkeypatch.setattr(_fastbin, "SMALL", 0)


def relu_factors(batch, n_out, n_in, dtype, scale=1.0, seed=0):
    """Factors with many exact zeros, as in a ReLU network."""
    gen = torch.Generator().manual_seed(seed)
    d = torch.randn(batch, n_out, generator=gen, dtype=dtype) * scale
    a = torch.randn(batch, n_in, generator=gen, dtype=dtype).clamp(min=0)
    d[torch.rand(batch, n_out, generator=gen) < 0.5] = 0.0
    d[1] = 0.0  # a sample without gradient
    return d, a


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("lo", "hi", "scale"), [(-2.0, 2.0, 0.3), (-0.3, 0.2, 1.0), (0.1, 0.5, 1.0)]
)
@pytest.mark.parametrize("dense", [False, True])
def test_equals_the_materialized_histogram(dtype, lo, hi, scale, dense):
    d, a = relu_factors(6, 13, 17, dtype, scale)
    if dense:
        d, a = d + 0.01, a - 0.5
    expected = _binning.hist1d_layer(d[:, :, None] * a[:, None, :], lo, hi, 11)
    got = _factored.hist1d_factored(d, a, lo, hi, 11)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("buffer", [10, 70, 130])  # rows split, one sample, two samples
@pytest.mark.parametrize("dense", [False, True])
def test_small_buffers_split_samples_and_rows(monkeypatch, buffer, dense):
    d, a = relu_factors(5, 9, 7, torch.float32, seed=3)
    if dense:  # no zeros: every product is formed, in blocks of samples
        d, a = d + 0.01, a - 0.5
    expected = _binning.hist1d_layer(d[:, :, None] * a[:, None, :], -1.0, 1.0, 7)
    monkeypatch.setattr(_factored, "BUFFER", buffer)
    got = _factored.hist1d_factored(d, a, -1.0, 1.0, 7)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_nonfinite_factors_take_the_materializing_path():
    d, a = relu_factors(4, 3, 5, torch.float32)
    a[0, 0] = float("inf")  # inf * 0 = NaN must be counted as NaN
    d[2, 1] = float("nan")
    expected = _binning.hist1d_layer(d[:, :, None] * a[:, None, :], -1.0, 1.0, 5)
    got = _factored.hist1d_factored(d, a, -1.0, 1.0, 5)
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    assert got[5] > 0  # NaN products are counted


@pytest.mark.parametrize("problem", ["mlp", "cnn"])
def test_a_run_with_the_fast_paths_equals_brute_force(problem):
    """End to end (factored linear layers, convolutions, vectorized binning) in float64."""
    import numpy as np
    from cockpit_histograms import GradHist1d

    from cockpit_core.testing import run_cockpit, tiny_cnn, tiny_mlp
    from cockpit_core.testing.reference import per_sample_gradients

    result = run_cockpit({"mlp": tiny_mlp, "cnn": tiny_cnn}[problem](), [GradHist1d()], steps=2)
    for snap in result.snapshots:
        grads = per_sample_gradients(result.model_at(snap.step), result.problem, snap.x, snap.y)
        expected = [
            np.histogram(
                np.clip(g.numpy().astype(np.float32).ravel(), -2.0, 2.0), bins=100, range=(-2, 2)
            )[0]
            for g in grads
        ]
        out = result.output[snap.step]["grad_hist_1d"]
        np.testing.assert_array_equal(out["per_param"], np.stack(expected))
