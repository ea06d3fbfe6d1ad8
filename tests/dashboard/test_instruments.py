"""The first-party instruments draw what their quantities mean (checked on real values)."""

import warnings

import numpy as np
import pytest
import torch
from cockpit_dashboard import render
from matplotlib.figure import Figure

from cockpit_core.log import LogData
from cockpit_core.plugin.registry import default_registry
from cockpit_core.testing import run_cockpit, tiny_mlp


def _panel(fig, title):
    return next(a for a in fig.axes if a.get_title(loc="left") == title)


def _instrument(name):
    registry = default_registry()
    if name not in registry.instruments:
        pytest.skip(f"the plugin drawing '{name}' is not installed")
    return registry.instruments[name]


def _lines(ax):
    return {line.get_label(): line for line in ax.lines}


def _brute_force_ratio(result, steps):
    """||theta_{t+1} - theta_t|| / ||g_t|| from the run's float64 snapshots."""
    ratios = []
    for snap in result.snapshots[: len(steps)]:
        update = torch.cat([(a - b).flatten() for a, b in zip(snap.params_after, snap.params)])
        grad = torch.cat([g.flatten() for g in snap.grads])
        ratios.append(float(update.norm() / grad.norm()))
    return ratios


def test_effective_learning_rate_is_the_sgd_learning_rate():
    # plain SGD, lr = 0.1: ||theta_{t+1} - theta_t|| = 0.1 ||g_t|| exactly (float64 problem)
    quantities = ["update_size", "grad_norm", "optimizer_hparams"]
    result = run_cockpit(tiny_mlp(), quantities, steps=4, optimizer="sgd")
    ax = _panel(render(result.cockpit), "Effective learning rate")
    steps, ratio = ax.lines[0].get_data()
    assert list(steps) == [0, 1, 2]  # update_size of the last step needs one more step
    np.testing.assert_allclose(ratio, 0.1, rtol=1e-10)
    lr_steps, lr = _lines(ax)["optimizer lr"].get_data()
    assert list(lr_steps) == [0, 1, 2, 3]
    np.testing.assert_allclose(lr, [s.lr[0] for s in result.snapshots], rtol=0)
    assert [t.get_text() for t in ax.texts] == ["plain SGD: = learning rate"]


def test_effective_learning_rate_with_momentum_is_not_called_the_learning_rate():
    # SGD(lr=0.05, momentum=0.9, weight_decay=1e-3): the ratio differs from lr
    quantities = ["update_size", "grad_norm", "optimizer_hparams"]
    result = run_cockpit(tiny_mlp(), quantities, steps=4, optimizer="sgd_momentum")
    ax = _panel(render(result.cockpit), "Effective learning rate")
    steps, ratio = ax.lines[0].get_data()
    np.testing.assert_allclose(ratio, _brute_force_ratio(result, steps), rtol=1e-10)
    assert not np.allclose(ratio, 0.05)
    np.testing.assert_allclose(_lines(ax)["optimizer lr"].get_ydata(), 0.05, rtol=0)
    (caption,) = [t.get_text() for t in ax.texts]
    assert caption.startswith("SGD with weight decay: not the learning rate")


def test_effective_learning_rate_without_optimizer_hparams_says_when_it_is_the_lr():
    result = run_cockpit(tiny_mlp(), ["update_size", "grad_norm"], steps=3, optimizer="adam")
    ax = _panel(render(result.cockpit), "Effective learning rate")
    assert "optimizer lr" not in _lines(ax)
    assert [t.get_text() for t in ax.texts] == [
        "= learning rate only for plain SGD\n(no momentum, no weight decay)"
    ]


def _hparams(name="SGD", **group):
    return {"optimizer": name, "groups": [{"lr": 0.1, "momentum": 0.0, **group}]}


@pytest.mark.parametrize(
    "hparams,expected",
    [
        (_hparams(), "plain SGD: = learning rate"),
        # heavy ball, lr 0.1, m 0.9: aligned gradients 0.1 / 0.1 = 1; uncorrelated ones of
        # equal norm 0.1 / sqrt(1 - 0.81) = 0.2294
        (_hparams(momentum=0.9), "η/(1−m) = 1 if gradients align"),
        (_hparams(momentum=0.9), "η/√(1−m²) = 0.229 if uncorrelated"),
        (_hparams(momentum=0.5, dampening=0.5), "η(1−d)/(1−m) = 0.1 if"),
        (_hparams(momentum=0.9, nesterov=True), "SGD (Nesterov), momentum m = 0.9, lr η = 0.1"),
        (_hparams(weight_decay=1e-4), "SGD with weight decay: not the learning rate"),
        (_hparams("Adam", betas=[0.9, 0.999]), "Adam: not the learning rate"),
    ],
)
def test_effective_learning_rate_caption(hparams, expected):
    from cockpit_basic.lr_relation import lr_relation

    assert expected in lr_relation(hparams)


def test_effective_learning_rate_draws_each_param_group_and_the_schedule():
    inst = _instrument("hyperparameters")
    output = {
        s: {
            "update_size": {"total": 1.0},
            "grad_norm": {"total": 2.0},
            "optimizer_hparams": {"optimizer": "SGD", "groups": [{"lr": lr}, {"lr": lr / 10}]},
        }
        for s, lr in enumerate([0.1, 0.1, 0.05, 0.05])
    }
    fig = Figure()
    ax = fig.add_subplot()
    inst.draw(ax, output, {})
    lines = _lines(ax)
    np.testing.assert_allclose(lines["lr (group 0)"].get_ydata(), [0.1, 0.1, 0.05, 0.05])
    np.testing.assert_allclose(lines["lr (group 1)"].get_ydata(), [0.01, 0.01, 0.005, 0.005])
    assert "between the param groups" in ax.texts[0].get_text()


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


def _tick_label_boxes(fig, ax):
    """Window extents of the visible tick labels of each axis of ``ax`` (after a draw)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return [
        [t.get_window_extent(renderer) for t in axis.get_ticklabels() if t.get_text()]
        for axis in (ax.xaxis, ax.yaxis)
    ]


@pytest.mark.parametrize("runs", [1, 2], ids=["default", "side_by_side"])
def test_gradient_tests_gauge_tick_labels_do_not_overlap(runs):
    _instrument("gradient_tests")
    rng = np.random.default_rng(0)
    output = {
        s: {n: {"total": float(v)} for n, v in zip(TESTS, rng.uniform(0.1, 1.5, 3))}
        for s in range(8)
    }
    data = LogData({}, output)
    fig = render([data] * runs if runs > 1 else data, panels=["gradient_tests"])

    def walk(axes):
        for ax in axes:
            yield ax
            yield from walk(ax.child_axes)

    gauges = [a for a in walk(fig.axes) if a.get_title() == "last step"]
    assert len(gauges) == runs
    for gauge in gauges:
        for boxes in _tick_label_boxes(fig, gauge):
            assert len(boxes) == 3  # -1, 0 and 1
            for i, a in enumerate(boxes):
                assert not any(a.overlaps(b) for b in boxes[i + 1 :])


def test_alpha_gauge_counts_values_beyond_its_range():
    inst = _instrument("alpha")
    output = {s: {"alpha": {"alpha": a}} for s, a in enumerate([-3.0, 0.1, 0.2, 5.0, 6.0])}
    fig = Figure()
    ax = fig.add_subplot()
    inst.draw(ax, output, {})
    texts = [t.get_text() for t in ax.texts]
    assert "1 step < -1.5" in texts and "2 steps > 1.5" in texts


TESTS = ("norm_test", "inner_test", "ortho_test")
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
