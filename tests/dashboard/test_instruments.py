"""The first-party instruments draw what their quantities mean (checked on real values)."""

import warnings

import numpy as np
import pytest
from matplotlib.figure import Figure

from cockpit_core.dashboard import render
from cockpit_core.log import LogData
from cockpit_core.registry import default_registry
from cockpit_core.testing import run_cockpit, tiny_mlp


def _panel(fig, title):
    return next(a for a in fig.axes if a.get_title(loc="left") == title)


def _instrument(name):
    registry = default_registry()
    if name not in registry.instruments:
        pytest.skip(f"the plugin drawing '{name}' is not installed")
    return registry.instruments[name]


def test_effective_learning_rate_is_the_sgd_learning_rate():
    # plain SGD, lr = 0.1: ||theta_{t+1} - theta_t|| = 0.1 ||g_t|| exactly (float64 problem)
    result = run_cockpit(tiny_mlp(), ["update_size", "grad_norm"], steps=4, optimizer="sgd")
    ax = _panel(render(result.cockpit), "Effective learning rate")
    steps, ratio = ax.lines[0].get_data()
    assert list(steps) == [0, 1, 2]  # update_size of the last step needs one more step
    np.testing.assert_allclose(ratio, 0.1, rtol=1e-10)


def test_distance_panel_shows_both_quantities_on_two_axes():
    result = run_cockpit(tiny_mlp(), ["distance", "update_size"], steps=3)
    fig = render(result.cockpit)
    ax = _panel(fig, "Distance & update size")
    np.testing.assert_allclose(
        ax.lines[0].get_ydata(), [result.output[s]["distance"]["total"] for s in range(3)]
    )
    twin = next(a for a in fig.axes if a is not ax and a.bbox.bounds == ax.bbox.bounds)
    np.testing.assert_allclose(
        twin.lines[0].get_ydata(), [result.output[s]["update_size"]["total"] for s in range(2)]
    )


def test_histogram_over_time_rebins_without_losing_counts():
    inst = _instrument("grad_hist_1d_time")
    rng = np.random.default_rng(0)
    output = {}
    for step, width in enumerate([1.0, 1.0, 2.0, 0.5]):  # the range adapts between steps
        counts = rng.integers(0, 50, size=20)
        output[step] = {"grad_hist_1d": {"hist": counts, "edges": np.linspace(-width, width, 21)}}
    fig = Figure()
    ax = fig.add_subplot()
    inst.draw(ax, output, {})
    mesh = ax.collections[0]
    shown = 10 ** np.asarray(mesh.get_array()).reshape(20, 4) - 1  # log10(1 + count)
    totals = [output[s]["grad_hist_1d"]["hist"].sum() for s in range(4)]
    np.testing.assert_allclose(shown.sum(axis=0), totals, rtol=1e-9)
    # steps with the widest range are shown bin for bin
    np.testing.assert_allclose(shown[:, 2], output[2]["grad_hist_1d"]["hist"], rtol=1e-9)


def test_gradient_tests_gauge_draws_the_last_values():
    inst = _instrument("gradient_tests")
    output = {
        s: {
            "norm_test": {"total": 0.5 + s},
            "inner_test": {"total": 0.2},
            "ortho_test": {"total": 0.3},
        }
        for s in range(3)
    }
    fig = Figure()
    ax = fig.add_subplot()
    inst.draw(ax, output, {})
    series_ax, gauge = ax.child_axes
    np.testing.assert_allclose(series_ax.lines[0].get_ydata(), [0.5, 1.5, 2.5])
    circles = [p for p in gauge.patches if type(p).__name__ == "Circle"]
    assert circles and all(c.get_radius() == 2.5 for c in circles)


def test_alpha_gauge_counts_values_beyond_its_range():
    inst = _instrument("alpha")
    output = {s: {"alpha": {"alpha": a}} for s, a in enumerate([-3.0, 0.1, 0.2, 5.0, 6.0])}
    fig = Figure()
    ax = fig.add_subplot()
    inst.draw(ax, output, {})
    texts = [t.get_text() for t in ax.texts]
    assert "< 1" in texts and "2 >" in texts


TOTAL_PER_PARAM = [
    "grad_norm",
    "distance",
    "update_size",
    "norm_test",
    "inner_test",
    "ortho_test",
    "mean_gsnr",
    "early_stopping",
    "cabs",
    "hess_trace",
    "tic_diag",
    "tic_trace",
]


def test_nan_values_are_marked_and_break_no_panel():
    output = {}
    for step in range(4):
        value = np.nan if step == 2 else 1.0 + step
        output[step] = {
            q: {"total": value, "per_param": np.array([value, 2 * value])} for q in TOTAL_PER_PARAM
        }
        output[step]["loss"] = value
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failing panel warns: make it an error here
        fig = render(LogData({}, output))
    marks = [line for ax in fig.axes for line in ax.lines if line.get_label() == "NaN/inf"]
    assert marks and all(list(m.get_xdata()) == [2.0] for m in marks)
    assert "Mini-batch loss" in [a.get_title(loc="left") for a in fig.axes]
