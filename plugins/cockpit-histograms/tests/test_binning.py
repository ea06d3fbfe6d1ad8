"""Edge cases of the histogram kernels: clamping, NaN/inf, chunking, the accelerator path."""

import warnings

import cockpit_histograms._binning as binning
import numpy as np
import pytest
import torch
from cockpit_histograms import GradHist1d, GradHist2d, RangeAdaptation

from cockpit_core import Cockpit
from cockpit_core.statistics import pool
from cockpit_core.testing import tiny_mlp

INF, NAN = float("inf"), float("nan")


def test_1d_clamps_outliers_and_counts_nonfinite_apart():
    values = torch.tensor(
        [
            [-5.0, -2.0, -1.9, 0.0, 1.99, 2.0, 7.0, NAN],
            [INF, -INF, INF, 0.5, 1e30, -1e30, NAN, 1.0],
        ],
        dtype=torch.float64,
    )
    out = binning.hist1d_layer(values, -2.0, 2.0, 4)
    counts, (nan, posinf, neginf, top) = out[:4].tolist(), out[4:].tolist()
    # bins [-2,-1) [-1,0) [0,1) [1,2]; -5, -2, -1.9, -1e30 -> bin 0; 7, 1e30 -> bin 3
    assert counts == [4.0, 0.0, 2.0, 5.0]
    assert (nan, posinf, neginf) == (2.0, 2.0, 1.0)
    assert top == pytest.approx(1e30, rel=1e-7)


def test_1d_all_nonfinite_observes_nothing():
    out = binning.hist1d_layer(torch.full((3, 2), NAN), -1.0, 1.0, 5)
    assert out[:5].sum() == 0 and out[5] == 6 and out[-1] == -1


def test_2d_counts_pairs_with_nonfinite_values_apart():
    theta = torch.tensor([0.5, NAN, -0.5])
    grads = torch.tensor([[0.1, 0.2, INF], [-0.3, 0.4, NAN], [9.0, -9.0, 0.0]])
    out = binning.hist2d_layer(grads, theta, ((-1.0, 1.0), (-1.0, 1.0)), (2, 2))
    hist = out[:4].reshape(2, 2)
    # finite pairs: (0.1, .5) (-0.3, .5) (9 -> x bin 1, .5) (0.0, -0.5)
    assert hist.tolist() == [[0.0, 1.0], [1.0, 2.0]]
    nan, posinf, neginf, bad_params, gmax, pmax = out[4:].tolist()
    assert (nan, posinf, neginf, bad_params) == (1.0, 1.0, 0.0, 3.0)
    assert (gmax, pmax) == (9.0, 0.5)


@pytest.mark.parametrize("kernel", ["1d", "2d"])
def test_accelerator_path_equals_cpu_fast_path(kernel, monkeypatch):
    """Off the CPU the kernels skip the finiteness check; both paths must agree."""
    torch.manual_seed(0)
    grads, theta = torch.randn(5, 3, 4, dtype=torch.float64), torch.randn(3, 4)

    def run():
        if kernel == "1d":
            return binning.hist1d_layer(grads, -1.0, 1.5, 9)
        return binning.hist2d_layer(grads, theta, ((-1.0, 1.0), (-0.5, 2.0)), (4, 3))

    fast = run()
    original = binning._scan_range
    monkeypatch.setattr(
        binning, "_scan_range", lambda v, lo, hi: (False, original(v, lo, hi)[1], False)
    )
    torch.testing.assert_close(run(), fast, rtol=0, atol=0)


def test_chunking_gives_the_same_counts(monkeypatch):
    torch.manual_seed(1)
    grads, theta = torch.randn(6, 11) * 2, torch.randn(11)
    one = binning.hist1d_layer(grads, -2.0, 2.0, 13)
    two = binning.hist2d_layer(grads, theta, ((-2.0, 2.0), (-1.0, 1.0)), (5, 7))
    monkeypatch.setattr(binning, "CHUNK", 7)  # chunks that split samples
    torch.testing.assert_close(binning.hist1d_layer(grads, -2.0, 2.0, 13), one, rtol=0, atol=0)
    torch.testing.assert_close(
        binning.hist2d_layer(grads, theta, ((-2.0, 2.0), (-1.0, 1.0)), (5, 7)), two, rtol=0, atol=0
    )


def test_float32_counts_stay_exact_beyond_2_to_the_24():
    """torch.histc counts in float32; chunking keeps a crowded bin exact."""
    n = (1 << 24) + 3
    out = binning.hist1d_layer(torch.zeros(1, n), -1.0, 1.0, 2)
    assert int(out[1]) == n


def test_adaptation_keeps_the_range_when_nothing_finite_was_seen():
    adapt = RangeAdaptation(kind="grad_abs_max", padding=0.5, min_size=1.0)
    assert adapt.new_range(-1.0, (-2.0, 2.0)) == (-2.0, 2.0)
    assert adapt.new_range(0.1, (-2.0, 2.0)) == (-0.75, 0.75)  # min_size / 2, padded


def test_nonfinite_gradients_do_not_crash_a_run():
    """A sample with inf input gives NaN gradients; the run goes on and nothing breaks."""
    problem = tiny_mlp()
    model = problem.make_model()
    loss_fn = problem.loss_module()
    cp = Cockpit(model.named_parameters(), [GradHist1d(), GradHist2d()], on_error="raise")
    for step in range(2):
        x, y = problem.batch(step)
        if step == 0:
            x = x.clone()
            x[0, 0] = INF
        out = model(x)
        loss = loss_fn(out, y)
        info = {"loss": loss, "batch_size": len(x)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with cp(step, info=info):
                loss.backward()
        model.zero_grad()
    output = cp.get_output()
    assert 1 in output  # the next, finite step is tracked normally
    assert output[1]["grad_hist_1d"]["nonfinite"] == {"nan": 0, "posinf": 0, "neginf": 0}
    if 0 in output:  # the core may skip non-finite steps; if not, NaNs are counted apart
        hist = output[0]["grad_hist_1d"]
        assert hist["nonfinite"]["nan"] > 0
        n_elements = sum(p.numel() for p in model.parameters()) * len(x)
        assert hist["hist"].sum() + sum(hist["nonfinite"].values()) == n_elements
    np.testing.assert_array_equal(
        output[1]["grad_hist_1d"]["hist"].sum(),
        sum(p.numel() for p in model.parameters()) * problem.batch_size,
    )


@pytest.mark.parametrize("pooled", [True, False])
def test_a_failing_kernel_is_reported_without_breaking_backward(monkeypatch, pooled):
    import cockpit_histograms.grad_hist_1d as module

    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    # the per-parameter kernel, or the one binning small parameters together
    monkeypatch.setattr(module, "hist1d_pool" if pooled else "hist1d_layer", broken)
    if not pooled:
        monkeypatch.setattr(pool, "MEMBER_BYTES", 0)
    from cockpit_core.testing import run_cockpit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_cockpit(tiny_mlp(), [GradHist1d()], steps=2)  # backward must not raise
    assert result.output == {}
    assert len(result.cockpit.errors) == 2
    assert "kernel exploded" in result.cockpit.errors[0]["error"]
