"""Findings shade their steps on the dashboard panels that show what they read (issue 22)."""

import matplotlib
import numpy as np
import pytest
from cockpit_dashboard import LivePlot, render
from cockpit_dashboard.banner import COLORS
from cockpit_dashboard.markers import LABEL_GID, OPACITY, SPAN_GID
from matplotlib.colors import to_rgba

from cockpit_core import Registry, hookimpl
from cockpit_core.diagnosis import Diagnosis
from cockpit_core.errors import CockpitWarning
from cockpit_core.log import LogData
from cockpit_core.panel import Instrument, series
from cockpit_core.panel.planning import load
from cockpit_core.panel.style import finish
from cockpit_core.testing import run_cockpit, tiny_mlp

from ._helpers import Wiggle

matplotlib.use("Agg")

BASIC = ["loss", "grad_norm", "update_size", "distance", "time"]


def finding(diagnosis, severity, first, last):
    return {
        "id": f"{diagnosis}@{first}",
        "diagnosis": diagnosis,
        "severity": severity,
        "first_step": first,
        "last_step": last,
        "message": "something is off",
        "evidence": {},
        "suggestion": "",
        "source": "a test",
    }


def spans(ax):
    """The finding artists on ``ax`` and its inset axes."""
    axes = [ax, *ax.child_axes]
    return [a for x in axes for a in x.get_children() if a.get_gid() == SPAN_GID]


def by_title(fig):
    return {ax.get_title(loc="left"): ax for ax in fig.axes if ax.get_title(loc="left")}


def marked(fig):
    return {title for title, ax in by_title(fig).items() if spans(ax)}


def limits(fig):
    return {t: (ax.get_xlim(), ax.get_ylim()) for t, ax in by_title(fig).items()}


@pytest.fixture(scope="module")
def basic_registry():
    """cockpit-basic's panels and cockpit-diagnoses' rules (what each rule reads)."""
    import cockpit_basic.plugin
    import cockpit_diagnoses.plugin

    registry = Registry()
    registry.add_plugin(cockpit_basic.plugin, name="basic")
    registry.add_plugin(cockpit_diagnoses.plugin, name="diagnoses")
    return registry


@pytest.fixture(scope="module")
def basic_run(basic_registry):
    """A real 8-step run's data (no findings of its own)."""
    result = run_cockpit(tiny_mlp(), BASIC, steps=8, registry=basic_registry)
    data = load(result.cockpit)
    assert data.findings == [] and sorted(data.output) == list(range(8))
    return data


def with_findings(data, *findings):
    return LogData(data.header, data.output, data.errors, data.skipped, findings=list(findings))


def test_a_finding_shades_its_steps_on_exactly_the_panels_showing_what_it_reads(
    basic_run, basic_registry
):
    plain = render(basic_run, registry=basic_registry)
    fig = render(
        with_findings(basic_run, finding("exploding_gradients", "warning", 2, 5)),
        registry=basic_registry,
    )
    # exploding_gradients reads grad_norm: the three panels showing it, not loss/time/distance
    assert marked(fig) == {"Gradient norm", "Gradient norm per layer", "Effective learning rate"}
    assert {"Mini-batch loss", "Time per step", "Distance & update size"} <= set(by_title(fig))
    for title in marked(fig):
        ax = by_title(fig)[title]
        (span,) = spans(ax)
        assert isinstance(span, matplotlib.patches.Rectangle)
        # steps 2 to 5 on the x axis, the full height of the axes
        assert (span.get_x(), span.get_x() + span.get_width()) == (2.0, 5.0)
        assert (span.get_y(), span.get_height()) == (0.0, 1.0)
        assert span.get_data_transform() == ax.get_xaxis_transform()  # y: axes fraction
        assert span.get_facecolor() == pytest.approx(to_rgba(COLORS["warning"], OPACITY))
        assert span.zorder < min(line.zorder for line in ax.lines)  # behind the data
        assert span.get_label().startswith("_")  # in no legend
    # the axes' limits are those of the dashboard without findings
    assert limits(fig) == limits(plain)
    assert marked(plain) == set()


def test_a_one_step_finding_is_a_line_named_by_its_diagnosis(basic_run, basic_registry):
    fig = render(
        with_findings(basic_run, finding("loss_plateau", "error", 4, 4)), registry=basic_registry
    )
    assert marked(fig) == {"Mini-batch loss"}
    ax = by_title(fig)["Mini-batch loss"]
    (line,) = spans(ax)
    assert isinstance(line, matplotlib.lines.Line2D)
    assert list(line.get_xdata()) == [4.0, 4.0] and list(line.get_ydata()) == [0.0, 1.0]
    assert to_rgba(line.get_color()) == to_rgba(COLORS["error"])
    (label,) = [t for t in ax.texts if t.get_gid() == LABEL_GID]
    assert label.get_text() == "loss_plateau" and label.get_position()[0] == 4.0


def test_labels_that_would_overlap_or_leave_the_axes_are_left_out(basic_run, basic_registry):
    fig = render(
        with_findings(
            basic_run,
            finding("loss_plateau", "warning", 1, 3),
            finding("loss_plateau", "info", 2, 2),  # right next to the first one's label
            finding("loss_plateau", "info", 7, 7),  # at the right edge: no room to the right
        ),
        registry=basic_registry,
    )
    ax = by_title(fig)["Mini-batch loss"]
    assert len(spans(ax)) == 3  # every span is drawn
    labels = [t for t in ax.texts if t.get_gid() == LABEL_GID]
    assert [t.get_position()[0] for t in labels] == [1.0]


def test_findings_of_unknown_or_quantity_free_diagnoses_are_only_in_the_banner(
    basic_run, basic_registry
):
    fig = render(
        with_findings(
            basic_run,
            finding("no_such_rule", "error", 1, 3),  # not installed
            finding("nonfinite", "error", 2, 2),  # reads no quantity
        ),
        registry=basic_registry,
    )
    assert marked(fig) == set()
    (banner,) = [t for t in fig.texts if t.get_gid() == "cockpit-findings-banner"]
    assert "no_such_rule" in banner.get_text() and "nonfinite" in banner.get_text()


def test_a_comparison_of_runs_has_no_spans(basic_run, basic_registry):
    runs = [with_findings(basic_run, finding("exploding_gradients", "warning", 2, 5)), basic_run]
    fig = render(runs, registry=basic_registry)
    assert "Gradient norm" in by_title(fig) and marked(fig) == set()


# A third-party plugin: a quantity, a diagnosis of it, and panels with different x axes.


class WiggleHigh(Diagnosis):
    """Fires once two tracked steps have a wiggle above 0.5 (steps 1 and 2: sin 1, sin 2)."""

    name = "wiggle_high"
    reads = ("wiggle",)
    source = "a test rule"

    def check(self, window):
        steps, values = window.finite_series("wiggle", "total")
        high = steps[values > 0.5]
        if len(high) < 2:
            return []
        return [self.finding("", "warning", high[0], high[1], "wiggles high", {})]


def draw_curve(ax, output, header):
    steps, values = series(output, "wiggle")
    ax.plot(steps, values, color="purple")
    finish(ax, ylabel="wiggle")  # x axis labelled "step"


def draw_distribution(ax, output, header):
    _, values = series(output, "wiggle")
    ax.hist(values, bins=5)
    finish(ax, xlabel="wiggle value", ylabel="count")


def draw_heat_map(ax, output, header):
    steps, values = series(output, "wiggle")
    edges = np.concatenate([steps - 0.5, [steps[-1] + 0.5]])
    ax.pcolormesh(edges, [0.0, 1.0], values[None, :])
    finish(ax)


PANELS = [
    Instrument("wiggle_curve", "Wiggle curve", "oddities", ("wiggle",), draw_curve),
    Instrument("wiggle_hist", "Wiggle distribution", "oddities", ("wiggle",), draw_distribution),
    Instrument("wiggle_map", "Wiggle map", "oddities", ("wiggle",), draw_heat_map),
]


class WigglePlugin:
    @hookimpl
    def register_quantities(self, register):
        register(Wiggle)

    @hookimpl
    def register_instruments(self, register):
        for panel in PANELS:
            register(panel)

    @hookimpl
    def register_diagnoses(self, register):
        register(WiggleHigh)


@pytest.fixture(scope="module")
def wiggle_registry():
    registry = Registry()
    info = registry.add_plugin(WigglePlugin(), name="wiggle")
    assert info.ok, info.error
    return registry


def test_a_third_party_finding_marks_only_axes_with_steps_on_x(wiggle_registry):
    with pytest.warns(CockpitWarning, match="wiggle_high: wiggles high"):
        result = run_cockpit(
            tiny_mlp(), ["wiggle"], steps=6, registry=wiggle_registry, diagnoses=["wiggle_high"]
        )
    assert [(f.first_step, f.last_step) for f in result.cockpit.findings] == [(1, 2)]
    fig = render(result.cockpit)  # the Cockpit's registry: its panels and diagnoses
    axes = by_title(fig)
    # a histogram's x axis is the wiggle value: no span there
    assert marked(fig) == {"Wiggle curve", "Wiggle map"}
    (curve,) = spans(axes["Wiggle curve"])
    assert curve.get_fill() and curve.zorder < axes["Wiggle curve"].lines[0].zorder
    # on a heat map a fill behind the colours would be hidden: an outline above them
    (outline,) = spans(axes["Wiggle map"])
    (mesh,) = axes["Wiggle map"].collections
    assert not outline.get_fill() and outline.zorder > mesh.zorder
    assert to_rgba(outline.get_edgecolor()) == to_rgba(COLORS["warning"])
    for span in (curve, outline):
        assert (span.get_x(), span.get_x() + span.get_width()) == (1.0, 2.0)


def test_the_live_plot_draws_a_finding_that_came_after_its_last_picture(tmp_path, wiggle_registry):
    seen = []
    with pytest.warns(CockpitWarning, match="wiggle_high"):
        run_cockpit(
            tiny_mlp(),
            ["wiggle"],
            steps=4,
            registry=wiggle_registry,
            diagnoses=["wiggle_high"],
            sinks=[seen.append],
        )
    kinds = [r["kind"] for r in seen]
    upto = kinds.index("finding")
    assert kinds[upto - 1] == "values"  # the finding follows the values of its step
    path = tmp_path / "live.svg"
    # diagnose=False: only the recorded findings (else the picture finds it by itself)
    live = LivePlot(path, every=1, registry=wiggle_registry, diagnose=False)
    for record in seen[: upto + 1]:
        live(record)
    # the SVG names each artist by its gid: the picture drawn before the finding has none
    assert path.exists() and SPAN_GID not in path.read_text()
    pictures = live.renders
    live.close()
    assert live.renders == pictures + 1
    assert path.read_text().count(f'id="{SPAN_GID}') == 2  # the curve and the heat map

    # by default the live plot runs the diagnoses over what it has: the picture drawn
    # before the finding was recorded shows it already, and once only after the record
    path = tmp_path / "live_offline.svg"
    live = LivePlot(path, every=1, registry=wiggle_registry)
    for record in seen[:upto]:
        live(record)
    assert path.read_text().count(f'id="{SPAN_GID}') == 2
    live(seen[upto])
    live.close()
    assert path.read_text().count(f'id="{SPAN_GID}') == 2
