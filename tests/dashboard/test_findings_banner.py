"""Findings of the diagnoses appear as a banner under the dashboard's title (issue 22)."""

import matplotlib
from cockpit_dashboard import render

from cockpit_core.diagnosis import Finding
from cockpit_core.log import LogData

matplotlib.use("Agg")

OUTPUT = {s: {"loss": 1.0 / (s + 1)} for s in range(4)}
FINDING = {
    "id": "step_size/overshoot@0",
    "diagnosis": "step_size",
    "severity": "warning",
    "first_step": 0,
    "last_step": 3,
    "message": "steps overshoot the minimum along the update",
    "evidence": {"median": 0.8},
    "suggestion": "lower the learning rate",
    "source": "Schneider et al. 2021",
}


def _banner(fig):
    return [t for t in fig.texts if t.get_gid() == "cockpit-findings-banner"]


def test_a_run_with_findings_gets_a_banner_naming_them():
    data = LogData({}, OUTPUT, [], findings=[FINDING])
    (banner,) = _banner(render(data))
    text = banner.get_text()
    assert "WARNING step_size" in text and "overshoot" in text and "(steps 0-3)" in text


def test_no_banner_without_findings_or_in_a_comparison():
    assert _banner(render(LogData({}, OUTPUT, []))) == []
    runs = [LogData({}, OUTPUT, [], findings=[FINDING]), LogData({}, OUTPUT, [])]
    assert _banner(render(runs)) == []


def test_long_findings_are_cut_to_the_figure_width():
    from cockpit_dashboard.banner import findings_banner
    from matplotlib.figure import Figure

    long = Finding("x@0", "batch_size", "warning", 0, 59, "the norm test fails " * 20)
    fig = Figure(figsize=(6, 2))
    text = findings_banner(fig, [long])
    (line,) = text.get_text().splitlines()
    assert (
        line.startswith("WARNING batch_size (steps 0-59): the norm test fails") and line[-1] == "…"
    )
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # the box, padding included, stays inside the figure
    box = text.get_bbox_patch().get_window_extent(canvas.get_renderer())
    assert box.x1 <= fig.bbox.x1
    short = Finding("y@3", "dead_layers", "error", 3, 3, "no gradient")
    assert (
        findings_banner(Figure(), [short]).get_text() == "ERROR   dead_layers (step 3): no gradient"
    )
