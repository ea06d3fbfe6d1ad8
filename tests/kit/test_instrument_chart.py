"""Instrument.chart: the declarative web panel, its validation, the first-party charts."""

from __future__ import annotations

import pytest

from cockpit_core.engine.metrics import METRICS_KEY
from cockpit_core.panel import Chart, Each, Instrument, Line, Threshold
from cockpit_core.plugin.registry import default_registry


def _draw(ax, output, header):
    """Not drawn here."""


def _instrument(**kwargs):
    fields = {"name": "wiggle", "title": "Wiggle", "topic": "gradient", "quantities": ("wiggle",)}
    return Instrument(**{**fields, **kwargs}, draw=_draw)


def test_a_chart_normalises_its_series_and_defaults_to_none():
    assert _instrument().chart is None
    chart = Chart({"wiggle": ("total", Each("rms", names="modules")), "loss": None, "x": "a/b"})
    assert chart.series == {
        "wiggle": (Line("total"), Each("rms", names="modules")),
        "loss": None,
        "x": (Line("a/b"),),  # one field path is a tuple of one line
    }
    assert chart.quantities == ("wiggle", "loss", "x")
    assert (chart.log_y, chart.title, chart.name, chart.thresholds) == (False, "", "", ())
    heat = Chart(heatmap="grad_hist_1d", name="grad_hist_time")
    assert heat.quantities == ("grad_hist_1d",) and heat.series == {}
    assert _instrument(chart=chart).chart is chart
    hash(_instrument(chart=chart))  # still hashable, as frozen dataclasses are


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"series": {"wiggle": 3}}, "series['wiggle'] must be a tuple of fields"),
        ({"series": {"wiggle": ()}}, "series['wiggle'] must be a tuple of fields"),
        ({"series": {"Wiggle": None}}, "series: 'Wiggle' is not a snake_case quantity name"),
        ({"series": {"wiggle": ("a//b",)}}, "'a//b' is not a field path"),
        ({"series": {"wiggle": (1.5,)}}, "series['wiggle'][0]: 1.5 is not a field path"),
        ({"series": ["wiggle"]}, "series must be a dict {quantity name: fields}"),
        ({"series": {}}, "give series ({quantity name: fields}) or a heatmap quantity"),
        ({"series": {"wiggle": None}, "log_y": "auto"}, "log_y must be True, False or None"),
        ({"series": {"wiggle": None}, "name": "Wiggle Panel"}, "name 'Wiggle Panel' must be"),
        ({"series": {"wiggle": None}, "heatmap": "wiggle"}, "series or a heatmap quantity, not"),
        ({"series": {"wiggle": None}, "thresholds": (print,)}, "thresholds must be a tuple"),
    ],
)
def test_an_invalid_chart_raises_a_type_error_naming_the_field(kwargs, message):
    with pytest.raises(TypeError, match="Invalid Chart") as err:
        Chart(**kwargs)
    assert message in str(err.value)


def test_invalid_lines_thresholds_and_charts_of_an_instrument_raise_type_errors():
    with pytest.raises(TypeError, match=r"Invalid Each 'rms': reduce must be one of 'max'"):
        Each("rms", reduce="sum")
    with pytest.raises(TypeError, match=r"Invalid Each 'rms': names '/x' is not a field path"):
        Each("rms", names="/x")
    with pytest.raises(
        TypeError, match=r"Invalid Line .b_simple.: error must be a field path .*, got 3"
    ):
        Line("b_simple", error=3)
    with pytest.raises(TypeError, match=r"Invalid Threshold 'Hparams': quantity 'Hparams'"):
        Threshold("Hparams", print)
    with pytest.raises(TypeError, match=r"line must be a function line\(value\)"):
        Threshold("optimizer_hparams", 2.0)
    with pytest.raises(TypeError, match=r"chart must be None or a cockpit_core.panel.Chart, got"):
        _instrument(chart={"wiggle": None})


def test_first_party_charts_name_registered_quantities():
    registry = default_registry()
    known = set(registry.names()) | {METRICS_KEY}  # cp.log's metrics are drawn as well
    charts = {n: i.chart for n, i in registry.instruments.items() if i.chart is not None}
    expected = {"loss", "grad_norm", "alpha", "hess_max_ev", "activations_rms", "noise_scale"}
    assert expected <= set(charts)
    for name, chart in charts.items():
        quantities = set(chart.quantities) | {t.quantity for t in chart.thresholds}
        assert quantities <= known, name
    ids = [chart.name or name for name, chart in charts.items()]
    assert len(ids) == len(set(ids))  # one web panel each
