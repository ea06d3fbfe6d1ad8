"""Moving averages follow the tracked points and the panel's scale (issue 34)."""

import matplotlib
import numpy as np
import pytest
from cockpit_dashboard import render
from matplotlib.figure import Figure

from cockpit_core.log import LogData
from cockpit_core.panel import ema, smooth
from cockpit_core.panel.data import smooth_window

matplotlib.use("Agg")


def _average_line(ax):
    (line,) = [line for line in ax.lines if line.get_label() == "moving average"]
    return line.get_xdata(), line.get_ydata()


def test_the_default_window_is_odd_and_about_a_twentieth_of_the_points():
    assert [smooth_window(n) for n in (0, 1, 5, 29, 30, 50, 100, 300, 2000)] == [
        1,
        1,
        1,
        1,
        3,
        3,
        5,
        15,
        101,
    ]
    # an even window is made odd; a window of one point is the series itself
    x = np.arange(6.0)
    np.testing.assert_allclose(smooth(x, 2), smooth(x, 3))
    np.testing.assert_allclose(smooth(x, 1), x)


def test_a_series_tracked_every_10th_step_is_averaged_over_its_own_points():
    """A value that drops from 1 to 0.15 at step 250, tracked every 10th step of 500."""
    steps = np.arange(0, 500, 10)
    values = np.where(steps < 250, 1.0, 0.15)
    output = {int(s): {"grad_norm": {"total": float(v)}} for s, v in zip(steps, values)}
    fig = render(LogData({}, output), panels=["grad_norm"], diagnose=False)
    ax = next(a for a in fig.axes if a.get_title(loc="left") == "Gradient norm")
    x, y = _average_line(ax)
    np.testing.assert_array_equal(x, steps)  # one average per tracked point, at its step
    # a window of 3 points (50 points): one point after the drop the average is there,
    # where the causal EMA of the points (weight 0.2) still read ~0.7
    after = steps >= 260
    np.testing.assert_allclose(y[after], 0.15)
    np.testing.assert_allclose(y[steps < 240], 1.0)
    assert ema(values)[steps == 260][0] > 0.6
    assert y[-1] == pytest.approx(0.15)  # the run's end shows the run's end
    assert np.nanmin(values) <= y.min() and y.max() <= np.nanmax(values)


def test_the_gsnr_average_on_a_log_axis_is_geometric_and_stays_within_the_data():
    """A GSNR around 0.01 with a spike of 100 every 10th point: no sawtooth above it."""
    rng = np.random.default_rng(0)
    gsnr = 0.01 * np.exp(rng.normal(0.0, 0.3, 200))
    gsnr[::10] = 100.0
    output = {5 * i: {"mean_gsnr": float(v)} for i, v in enumerate(gsnr)}
    fig = render(LogData({}, output), panels=["mean_gsnr"], diagnose=False)
    ax = next(a for a in fig.axes if a.get_title(loc="left") == "Mean GSNR")
    assert ax.get_yscale() == "log"
    x, y = _average_line(ax)
    np.testing.assert_array_equal(x, 5 * np.arange(200))
    assert gsnr.min() <= y.min() and y.max() <= gsnr.max()
    # the mean of logs over a window of 11 points, one of them a spike: 10^(-2 + 4/11),
    # about 0.023; the arithmetic mean there is about 9, 900 times the typical value
    typical = np.median(gsnr)
    assert np.median(y) / typical < 3
    arithmetic = smooth(gsnr)
    assert np.median(arithmetic) / typical > 100
    np.testing.assert_allclose(y, smooth(gsnr, log=True))


def test_non_finite_values_are_gaps_of_the_average_and_marked():
    values = np.array([1.0, 2.0, np.nan, 4.0, np.inf, 6.0])
    out = smooth(values, 3)
    np.testing.assert_allclose(out, [1.5, 1.5, np.nan, 4.0, np.nan, 6.0])
    # on a log scale, values <= 0 are left out of the averages
    np.testing.assert_allclose(smooth(np.array([1.0, 0.0, 100.0]), 3, log=True), [1, 10, 100])
    output = {s: {"loss": float(v)} for s, v in enumerate(values)}
    fig = render(LogData({}, output), panels=["loss"], diagnose=False)
    marks = [line for ax in fig.axes for line in ax.lines if line.get_label() == "NaN/inf"]
    (mark,) = marks
    assert list(mark.get_xdata()) == [2.0, 4.0]


def test_ema_keeps_its_signature_and_takes_a_log_scale():
    values = np.array([1.0, 100.0, np.nan, 1.0])
    np.testing.assert_allclose(ema(values, 0.5), [1.0, 50.5, 50.5, 25.75])
    np.testing.assert_allclose(ema(values, 0.5, log=True), [1.0, 10.0, 10.0, np.sqrt(10.0)])


def test_a_panel_sets_its_scale_before_averaging(registry_with_basic):
    """The loss spanning decades: log axis and a geometric moving average."""
    loss = np.geomspace(10.0, 0.01, 60)
    loss[::7] *= 50  # spikes
    output = {s: {"loss": float(v)} for s, v in enumerate(loss)}
    ax = Figure().add_subplot()
    registry_with_basic.instruments["loss"].draw(ax, output, {})
    assert ax.get_yscale() == "log"
    np.testing.assert_allclose(_average_line(ax)[1], smooth(loss, log=True))
