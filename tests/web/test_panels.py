"""Which panel shows a series, and the plotly figures of several overlaid runs."""

from __future__ import annotations

from types import SimpleNamespace

import plotly.graph_objects as go
from cockpit_web import assign, default_layout, figures


def test_first_party_series_go_to_the_dashboards_topics():
    names = {"grad_norm": "grad_norm"}
    assert assign("grad_norm/total", names).id == "grad_norm"
    assert assign("grad_norm/total", names).topic == "step size"
    assert assign("norm_test/total", {}).id == assign("ortho_test/total", {}).id
    assert assign("hess_max_ev/value", {}).topic == "curvature"
    assert assign("metrics/valid_loss", {}).topic == "performance"
    assert assign("alpha/alpha", {}).id == "alpha"
    assert assign("alpha/exact", {}) is None  # a flag, not worth a line
    assert assign("hess_max_ev/hvps", {}) is None
    layout = default_layout()
    assert {p.topic for p in layout.panels} <= set(layout.topics)


def test_labelled_and_third_party_quantities_get_panels_of_their_own():
    labelled = assign("gn_fc/total", {"gn_fc": "grad_norm"})
    assert labelled.id == "grad_norm-gn_fc" and "[gn_fc]" in labelled.title
    assert labelled.topic == "step size"
    wiggle = assign("wiggle/total", {"wiggle": "wiggle"})
    assert (wiggle.id, wiggle.title, wiggle.topic) == ("q-wiggle", "wiggle", "other")
    assert assign("wiggle/nested/field", {}).id == "q-wiggle"  # every scalar field


def _run(label, series, names=None):
    return SimpleNamespace(label=label, series=series, names=names or {})


def test_runs_are_overlaid_with_a_legend_and_panels_ordered_by_topic():
    a = _run("a", {"loss": {0: 2.0, 1: 1.5}, "wiggle/total": {0: 1.0}, "grad_norm/total": {1: 3.0}})
    b = _run("b", {"loss": {0: 2.5, 2: None}})
    panels = figures([a, b])
    assert [p["id"] for p in panels] == ["grad_norm", "loss", "q-wiggle"]
    assert [p["topic"] for p in panels] == ["step size", "performance", "other"]
    loss = next(p for p in panels if p["id"] == "loss")
    traces = loss["figure"]["data"]
    assert [t["name"] for t in traces] == ["a: loss", "b: loss"]
    assert list(traces[0]["x"]) == [0, 1] and list(traces[0]["y"]) == [2.0, 1.5]
    assert list(traces[1]["x"]) == [0, 2] and list(traces[1]["y"]) == [2.5, None]
    assert traces[0]["line"]["color"] != traces[1]["line"]["color"]
    assert loss["points"] == 4 and loss["figure"]["layout"]["title"]["text"] == "Mini-batch loss"
    for panel in panels:  # every figure is valid for plotly (it raises on an unknown key)
        go.Figure(panel["figure"])
    single = figures([a])
    assert [t["name"] for t in single[1]["figure"]["data"]] == ["loss"]  # one run: no prefix


def test_long_series_are_thinned_evenly_keeping_the_last_point():
    run = _run("r", {"loss": {s: float(s) for s in range(5001)}})
    (panel,) = figures([run], max_points=100)
    x = list(panel["figure"]["data"][0]["x"])
    assert len(x) <= 101 and x[0] == 0 and x[-1] == 5000
    assert len(set(b - a for a, b in zip(x[:-2], x[1:-1]))) == 1  # evenly spaced
    assert panel["points"] == 5001
