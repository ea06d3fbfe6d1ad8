"""grad_hist_2d: protocol, counts against numpy.histogram2d on brute-force per-sample gradients.

Reference: per-sample gradients by an autograd loop (float64) and the parameters of the
step, rounded to float32 (the binning precision, as Cockpit 1.0.2 for float32 models),
clipped to the centres of the edge bins as Cockpit does, and counted with
``numpy.histogram2d``. Exact comparison: counts could only differ for a value within one
float32 rounding of a bin edge, which does not occur for these fixed seeds.
"""

import numpy as np
import pytest
from cockpit_histograms import GradHist2d

from cockpit_core.testing import check_quantity, run_cockpit, tiny_cnn, tiny_mlp
from cockpit_core.testing.reference import per_sample_gradients

PROBLEMS = {"mlp": tiny_mlp, "cnn": tiny_cnn}


def test_protocol():
    check_quantity(GradHist2d)
    check_quantity(GradHist2d, options={"bins": (3, 4), "keep_individual": True})
    check_quantity(GradHist2d, options={"adapt": ("grad_abs_max", None)})
    check_quantity(GradHist2d, problem=tiny_cnn())


@pytest.mark.parametrize(
    "options, match",
    [
        ({"bins": (0, 5)}, "positive integers"),
        ({"range": ((-1, 1), (2, 2))}, "range\\[1\\]"),
        ({"adapt": ("grad_abs_max",)}, "adapt"),
    ],
)
def test_bad_options_say_what_to_do(options, match):
    with pytest.raises(ValueError, match=match):
        GradHist2d(**options)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("problem", ["mlp", "cnn"])
def test_counts_equal_brute_force(problem, optimizer, reference_2d):
    ranges, bins = ((-1.0, 1.0), (-2.0, 2.0)), (40, 50)
    result = run_cockpit(
        PROBLEMS[problem](), [GradHist2d(keep_individual=True)], steps=3, optimizer=optimizer
    )
    for snap in result.snapshots:
        out = result.output[snap.step]["grad_hist_2d"]
        grads = per_sample_gradients(result.model_at(snap.step), result.problem, snap.x, snap.y)
        expected = reference_2d(grads, snap.params, ranges, bins)
        np.testing.assert_array_equal(out["per_param"], expected)
        np.testing.assert_array_equal(out["hist"], expected.sum(0))
        assert out["hist"].shape == bins
        np.testing.assert_allclose(out["x_edges"], np.linspace(-1, 1, 41))
        np.testing.assert_allclose(out["y_edges"], np.linspace(-2, 2, 51))
        assert set(out["nonfinite"].values()) == {0}
        assert out["param_abs_max"] == pytest.approx(
            max(p.abs().max().item() for p in snap.params), rel=1e-7
        )


def test_values_outside_both_ranges_are_clamped_into_edge_bins(reference_2d):
    ranges, bins = ((-0.03, 0.01), (-0.2, 0.1)), (5, 3)
    result = run_cockpit(tiny_mlp(), [GradHist2d(bins=bins, range=ranges)], steps=2)
    for snap in result.snapshots:
        out = result.output[snap.step]["grad_hist_2d"]
        grads = per_sample_gradients(result.model_at(snap.step), result.problem, snap.x, snap.y)
        np.testing.assert_array_equal(
            out["hist"], reference_2d(grads, snap.params, ranges, bins).sum(0)
        )
        assert out["hist"].sum() == sum(g.numel() for g in grads)
        assert out["hist"][0].sum() > 0 and out["hist"][-1].sum() > 0
        assert out["hist"][:, 0].sum() > 0 and out["hist"][:, -1].sum() > 0


def test_range_adaptation_per_axis(reference_2d):
    q = GradHist2d(bins=(6, 8), adapt=("grad_abs_max", {"kind": "param_abs_max", "padding": 0.5}))
    result = run_cockpit(tiny_cnn(), [q], steps=3, optimizer="adam")
    ranges = ((-1.0, 1.0), (-2.0, 2.0))
    for snap in result.snapshots:
        out = result.output[snap.step]["grad_hist_2d"]
        grads = per_sample_gradients(result.model_at(snap.step), result.problem, snap.x, snap.y)
        np.testing.assert_allclose(out["x_edges"][[0, -1]], ranges[0], rtol=1e-12)
        np.testing.assert_allclose(out["y_edges"][[0, -1]], ranges[1], rtol=1e-12)
        np.testing.assert_array_equal(
            out["hist"], reference_2d(grads, snap.params, ranges, (6, 8)).sum(0)
        )
        # the maxima are observed on the float32 values that are binned
        gm = float(np.float32(max(g.abs().max().item() for g in grads)))
        pm = float(np.float32(max(p.abs().max().item() for p in snap.params)))
        ranges = ((-gm, gm), (-1.5 * pm, 1.5 * pm))
