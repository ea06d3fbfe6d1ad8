"""check_instrument: every first-party panel draws; broken panels fail with a clear message."""

import warnings

import numpy as np
import pytest

from cockpit_core.panel import Instrument, series
from cockpit_core.plugin.registry import default_registry
from cockpit_core.testing import ConformanceError, check_instrument

REGISTRY = default_registry()
# the per-layer histogram panels need per-parameter histograms (see their descriptions)
OPTIONS = {"grad_hist_1d": {"keep_individual": True}, "grad_hist_2d": {"keep_individual": True}}


@pytest.mark.parametrize("name", sorted(REGISTRY.instruments))
def test_every_first_party_instrument_passes(name):
    fig = check_instrument(REGISTRY.instruments[name], options=OPTIONS, registry=REGISTRY)
    assert fig.axes, f"{name} drew nothing"


def test_there_are_first_party_instruments():
    assert {"loss", "grad_norm", "performance", "time"} <= set(REGISTRY.instruments)


def _draw_loss(ax, output, header):
    steps, loss = series(output, "loss")
    ax.plot(steps, loss)


def _instrument(draw, **kwargs):
    fields = {"name": "broken", "title": "Broken", "topic": "gradient", "quantities": ("loss",)}
    return Instrument(**{**fields, **kwargs}, draw=draw)


def test_a_working_custom_instrument_and_a_factory_pass():
    inst = _instrument(_draw_loss)
    assert check_instrument(inst).axes[0].get_title(loc="left") == "Broken"
    check_instrument(lambda: inst)


def test_a_raising_draw_is_named():
    def draw(ax, output, header):
        raise ValueError("no such column")

    with pytest.raises(ConformanceError) as err:
        check_instrument(_instrument(draw))
    message = str(err.value)
    assert message.startswith(
        "instrument 'broken' failed on the output in memory: draw(ax, output, header) raised "
        "ValueError: no such column (steps [0, 1, 2, 3, 4, 5], quantities ['loss']; "
    )
    assert isinstance(err.value.__cause__, ValueError)


def test_a_warning_while_drawing_is_a_failure():
    def draw(ax, output, header):
        np.mean(np.array([]))  # RuntimeWarning: Mean of empty slice

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the check must turn it into an error anyway
        with pytest.raises(ConformanceError, match="RuntimeWarning: Mean of empty slice"):
            check_instrument(_instrument(draw))


def test_an_error_at_render_time_is_named():
    def draw(ax, output, header):
        _draw_loss(ax, output, header)
        ax.set_ylabel(r"$\frac{1$")  # mathtext fails only when the figure is rendered

    with pytest.raises(ConformanceError) as err:
        check_instrument(_instrument(draw))
    assert "failed on the output in memory: rendering the drawn panel raised ValueError" in str(
        err.value
    )


def test_a_panel_that_fails_only_on_its_first_steps():
    def draw(ax, output, header):
        steps, loss = series(output, "loss")
        ax.plot(steps[1:], np.diff(loss) / np.diff(loss)[0])  # IndexError with one step

    with pytest.raises(ConformanceError) as err:
        check_instrument(_instrument(draw))
    assert "failed on the first steps only (as a live plot draws it)" in str(err.value)
    assert "(steps [0], quantities ['loss']" in str(err.value)


def test_unknown_quantity_is_named():
    with pytest.raises(ConformanceError) as err:
        check_instrument(_instrument(_draw_loss, quantities=("not_a_quantity",)))
    assert str(err.value) == (
        "instrument 'broken' reads 'not_a_quantity', which no plugin of the registry provides: "
        "pass quantities=[YourQuantity, ...] (classes work without installing the plugin) or "
        "output={step: {name: value}}."
    )


def test_unavailable_panel_is_named():
    inst = _instrument(_draw_loss, available=lambda output: False, description="needs more")
    with pytest.raises(ConformanceError) as err:
        check_instrument(inst)
    assert str(err.value) == (
        "instrument 'broken' is not drawn on the output in memory: available(output) returned "
        "False. Give check_instrument output the panel is meant for (options=... or "
        "output=...); its description says: needs more."
    )


def test_synthetic_output_and_missing_steps():
    check_instrument(_instrument(_draw_loss), output={0: {"loss": 1.0}, 1: {"loss": 0.5}})
    with pytest.raises(ConformanceError) as err:
        check_instrument(_instrument(_draw_loss, min_steps=3), output={0: {"loss": 1.0}})
    assert str(err.value) == (
        "instrument 'broken' is not drawn on the given output: it needs loss with at least 3 "
        "step(s) of values; the output has ['loss']."
    )


def test_a_factory_that_builds_an_invalid_instrument():
    with pytest.raises(ConformanceError) as err:
        check_instrument(lambda: _instrument(_draw_loss, name="Bad Name"))
    assert str(err.value).startswith(
        "building the instrument failed: Invalid Instrument 'Bad Name'"
    )
    with pytest.raises(ConformanceError) as err:
        check_instrument(lambda: 42)
    assert str(err.value).endswith("returned int, not a cockpit_core.instrument.Instrument.")
    with pytest.raises(ConformanceError, match="got str"):
        check_instrument("loss")
