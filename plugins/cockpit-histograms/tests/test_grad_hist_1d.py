"""grad_hist_1d: protocol, counts against numpy on brute-force per-sample gradients, adaptation.

Reference: per-sample gradients by an autograd loop over samples (float64), rounded to
float32 (the quantity bins in float32, as Cockpit 1.0.2 does for float32 models), clipped
into the range and counted with ``numpy.histogram``. Counts are compared exactly: they can
only differ if an element lies within one float32 rounding of a bin edge, which does not
happen for these fixed seeds (a few hundred elements against 100 edges).
"""

import numpy as np
import pytest
import torch
from cockpit_histograms import GradHist1d, GradHist2d

from cockpit_core import MissingInfoError
from cockpit_core.statistics import pool
from cockpit_core.testing import check_quantity, run_cockpit, tiny_cnn, tiny_mlp
from cockpit_core.testing.reference import per_sample_gradients

PROBLEMS = {"mlp": tiny_mlp, "cnn": tiny_cnn}


def reference_counts(grads, lo, hi, bins):
    """Per-parameter counts [P, bins] of the float32-rounded, clipped per-sample gradients."""
    rows = []
    for g in grads:
        v = g.detach().numpy().astype(np.float32).ravel()
        v = np.clip(v, np.float32(lo), np.float32(hi))
        rows.append(np.histogram(v, bins=bins, range=(lo, hi))[0])
    return np.stack(rows)


def brute_force(result, step):
    snap = result.snapshots[step]
    return per_sample_gradients(result.model_at(step), result.problem, snap.x, snap.y)


def test_protocol():
    check_quantity(GradHist1d)
    check_quantity(GradHist1d, options={"bins": 7, "range": (-0.5, 0.25)})
    check_quantity(GradHist1d, options={"adapt": "grad_abs_max", "keep_individual": False})
    check_quantity(GradHist1d, options={"adapt": {"kind": "param_abs_max", "padding": 0.1}})
    check_quantity(GradHist1d, problem=tiny_cnn())


@pytest.mark.parametrize("bad", [(1.0, -1.0), (0.0, 0.0), (-float("inf"), 1.0)])
def test_bad_range_says_what_to_do(bad):
    with pytest.raises(ValueError, match="low < high"):
        GradHist1d(range=bad)


def test_unknown_adaptation_is_rejected():
    with pytest.raises(ValueError, match="grad_abs_max"):
        GradHist1d(adapt="grad_max")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("problem", ["mlp", "cnn"])
def test_counts_equal_brute_force(problem, optimizer):
    result = run_cockpit(PROBLEMS[problem](), [GradHist1d()], steps=3, optimizer=optimizer)
    for snap in result.snapshots:
        out = result.output[snap.step]["grad_hist_1d"]
        grads = brute_force(result, snap.step)
        expected = reference_counts(grads, -2.0, 2.0, 100)
        np.testing.assert_array_equal(out["per_param"], expected)
        np.testing.assert_array_equal(out["hist"], expected.sum(0))
        assert out["hist"].sum() == sum(g.numel() for g in grads)  # B * D elements
        np.testing.assert_allclose(out["edges"], np.linspace(-2, 2, 101))
        assert out["nonfinite"] == {"nan": 0, "posinf": 0, "neginf": 0}
        abs_max = max(g.abs().max().item() for g in grads)
        assert out["grad_abs_max"] == pytest.approx(abs_max, rel=1e-7)  # float32 rounding


def test_values_outside_the_range_are_clamped_into_the_edge_bins():
    lo, hi, bins = -0.05, 0.02, 7
    result = run_cockpit(tiny_mlp(), [GradHist1d(bins=bins, range=(lo, hi))], steps=2)
    for snap in result.snapshots:
        out = result.output[snap.step]["grad_hist_1d"]
        grads = brute_force(result, snap.step)
        flat = torch.cat([g.flatten() for g in grads]).numpy().astype(np.float32)
        assert (flat < lo).sum() > 0 and (flat > hi).sum() > 0  # the test exercises clamping
        np.testing.assert_array_equal(out["hist"], reference_counts(grads, lo, hi, bins).sum(0))
        assert out["hist"][0] >= (flat < lo).sum()
        assert out["hist"][-1] >= (flat > hi).sum()
        assert out["hist"].sum() == flat.size


@pytest.mark.parametrize("kind", ["grad_abs_max", "param_abs_max"])
def test_range_adaptation_uses_the_previous_tracked_step(kind):
    padding = 0.25
    q = GradHist1d(bins=20, adapt={"kind": kind, "padding": padding})
    result = run_cockpit(tiny_mlp(), [q], steps=4, optimizer="adam")
    ranges = [(-2.0, 2.0)]  # the first tracked step uses the configured range
    for snap in result.snapshots:
        lo, hi = ranges[-1]
        out = result.output[snap.step]["grad_hist_1d"]
        grads = brute_force(result, snap.step)
        np.testing.assert_allclose(out["edges"], np.linspace(lo, hi, 21), rtol=1e-12)
        np.testing.assert_array_equal(out["hist"], reference_counts(grads, lo, hi, 20).sum(0))
        if kind == "grad_abs_max":  # observed on the float32-rounded values that are binned
            m = float(np.float32(max(g.abs().max().item() for g in grads)))
        else:
            m = max(p.abs().max().item() for p in snap.params)
        end = (1 + padding) * max(1e-6 / 2, m)
        ranges.append((-end, end))
    assert q.current_range == pytest.approx(ranges[-1], rel=1e-15)


@pytest.mark.parametrize("pooled", [True, False])
def test_equal_options_share_one_statistic(monkeypatch, pooled):
    """Two instances with the same bins/range bin each layer once and get equal values."""
    import cockpit_histograms.grad_hist_1d as module

    calls: list[int] = []  # one entry per parameter binned alone
    pooled_rows: list[int] = []  # one entry per parameter binned in a pool

    def counting(original, into=calls):
        def kernel(*args, **kwargs):
            out = original(*args, **kwargs)
            into.extend([1] * (len(out) if into is pooled_rows else 1))
            return out

        return kernel

    if not pooled:
        monkeypatch.setattr(pool, "MEMBER_BYTES", 0)
    monkeypatch.setattr(module, "hist1d_layer", counting(module.hist1d_layer))
    monkeypatch.setattr(module, "hist1d_factored", counting(module.hist1d_factored))
    monkeypatch.setattr(module, "hist1d_pool", counting(module.hist1d_pool, pooled_rows))
    quantities = [GradHist1d(label="a"), GradHist1d(label="b"), GradHist1d(label="c", bins=10)]
    result = run_cockpit(tiny_mlp(), quantities, steps=2)
    n_params = len(list(result.model.parameters()))
    # two distinct statistics, two steps: each parameter binned once, alone or in a pool
    assert len(calls) + len(pooled_rows) == 2 * 2 * n_params
    assert (len(pooled_rows) > 0) == pooled
    for values in result.output.values():
        np.testing.assert_array_equal(values["a"]["hist"], values["b"]["hist"])


def test_adaptive_instances_do_not_share():
    a = GradHist1d(label="a", adapt="grad_abs_max")
    b = GradHist1d(label="b", adapt="grad_abs_max", every=2)
    assert a.requirements().statistics[0].key != b.requirements().statistics[0].key


def test_runs_with_the_2d_histogram_in_one_pass():
    result = run_cockpit(tiny_cnn(), [GradHist1d(), GradHist2d()], steps=2, optimizer="adam")
    alone = run_cockpit(tiny_cnn(), [GradHist1d()], steps=2, optimizer="adam")
    for step, values in result.output.items():
        np.testing.assert_array_equal(
            values["grad_hist_1d"]["hist"], alone.output[step]["grad_hist_1d"]["hist"]
        )


def test_missing_batch_size_is_reported_when_the_step_begins():
    from cockpit_core import Cockpit

    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), [GradHist1d()])
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y)
    with pytest.raises(MissingInfoError, match="grad_hist_1d.*batch_size"):
        with cp(0, info={"loss": loss}):
            loss.backward()
