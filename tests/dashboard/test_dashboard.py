"""The dashboard lays out instruments registered by plugins (issue 5)."""

import warnings

import numpy as np
import pytest
from cockpit_dashboard import LivePlot, plan, render

from cockpit_core import Registry
from cockpit_core.cli.main import main
from cockpit_core.log import LogData
from cockpit_core.panel import Instrument
from cockpit_core.testing import run_cockpit, tiny_mlp

from ._helpers import WIGGLE_PANEL, draw_wiggle, figure_texts, make_plugin, panel_titles


def test_hook_register_instruments(tmp_path, registry_with_basic):
    registry = registry_with_basic
    info = registry.add_plugin(make_plugin(WIGGLE_PANEL), name="throwaway")
    assert info.ok and registry.instruments["wiggle"] is WIGGLE_PANEL
    result = run_cockpit(tiny_mlp(), ["loss", "wiggle"], steps=6, registry=registry)
    fig = result.cockpit.plot()
    titles = panel_titles(fig)
    assert "Wiggle-o-meter" in titles and "Mini-batch loss" in titles
    # its own topic gets its own column group with a heading
    assert "ODDITIES" in figure_texts(fig)
    ax = next(a for a in fig.axes if a.get_title(loc="left") == "Wiggle-o-meter")
    x, y = ax.lines[0].get_data()
    np.testing.assert_allclose(y, np.sin(np.arange(6)))


def test_what_was_not_tracked_is_skipped_and_stated(registry_with_basic):
    registry = registry_with_basic
    registry.add_plugin(make_plugin(WIGGLE_PANEL), name="throwaway")
    result = run_cockpit(tiny_mlp(), ["loss"], steps=3, registry=registry)
    fig = render(result.cockpit)
    assert panel_titles(fig) == ["Mini-batch loss"]
    note = " ".join(figure_texts(fig))
    assert "Not tracked" in note
    assert "Wiggle-o-meter (wiggle)" in note and "Gradient norm (grad_norm)" in note
    p = plan(result.cockpit)
    assert {i.name for i, _ in p.skipped} >= {"wiggle", "grad_norm", "distance"}


def test_values_without_an_instrument_are_named():
    data = LogData({}, {0: {"mystery": 1.0}, 1: {"mystery": 2.0}})
    fig = render(data, instruments=[WIGGLE_PANEL])
    note = " ".join(figure_texts(fig))
    assert "Tracked without a panel" in note and "mystery" in note
    assert "Nothing to show" in note or any(
        "Nothing to show" in t.get_text() for ax in fig.axes for t in ax.texts
    )


@pytest.mark.parametrize("suffix,magic", [("png", b"\x89PNG"), ("svg", b"<?xml"), ("pdf", b"%PDF")])
def test_renders_png_svg_and_pdf(tmp_path, suffix, magic):
    data = LogData({}, {s: {"wiggle": {"total": float(s)}} for s in range(4)})
    path = tmp_path / f"dash.{suffix}"
    render(data, path, instruments=[WIGGLE_PANEL])
    assert path.read_bytes()[:5].startswith(magic)
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, no leftovers


def test_unknown_format_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"\.png, \.svg, \.pdf"):
        render(LogData(), tmp_path / "dash.gif", instruments=[])


def test_instrument_validation_messages():
    with pytest.raises(TypeError, match="snake_case"):
        Instrument("Bad Name", "t", "gradient", ("loss",), draw_wiggle)
    with pytest.raises(TypeError, match="lower-case"):
        Instrument("x", "t", "Gradient", ("loss",), draw_wiggle)
    with pytest.raises(TypeError, match="draw must be"):
        Instrument("x", "t", "gradient", ("loss",), None)
    with pytest.raises(TypeError, match="at least one quantity"):
        Instrument("x", "t", "gradient", (), draw_wiggle)
    with pytest.raises(TypeError, match="not a snake_case quantity name"):
        Instrument("x", "t", "gradient", ("Loss Q",), draw_wiggle)
    assert Instrument("x", "t", "gradient", "loss", draw_wiggle).quantities == ("loss",)


def test_register_instruments_with_a_wrong_object_keeps_the_quantities():
    registry = Registry()
    with pytest.warns(UserWarning, match="panels and sinks are skipped"):
        info = registry.add_plugin(make_plugin("not an instrument"), name="sloppy")
    assert info.ok and "wiggle" in registry.quantities
    assert registry.instruments == {}
    assert "not a cockpit_core.instrument.Instrument" in registry.extension_errors["sloppy"]


def test_register_instruments_name_collision_keeps_the_first():
    registry = Registry()
    registry.add_plugin(make_plugin(WIGGLE_PANEL), name="first")
    other = Instrument("wiggle", "Other", "gradient", ("wiggle",), draw_wiggle)
    registry.add_plugin(make_plugin(other, quantities=()), name="second")
    assert registry.instruments["wiggle"] is WIGGLE_PANEL
    assert "instrument:wiggle" in registry.conflicts


def test_labelled_quantities_get_one_panel_each(registry_with_basic):
    registry = registry_with_basic
    registry.add_plugin(make_plugin(WIGGLE_PANEL), name="throwaway")
    result = run_cockpit(
        tiny_mlp(),
        ["loss", {"name": "wiggle", "label": "w2"}, "wiggle"],
        steps=3,
        registry=registry,
    )
    titles = panel_titles(render(result.cockpit))
    assert "Wiggle-o-meter [w2]" in titles and "Wiggle-o-meter" in titles


def test_a_broken_panel_shows_its_error_and_the_rest_is_drawn():
    def boom(ax, output, header):
        ax.inset_axes((0, 0, 0.5, 0.5))
        raise RuntimeError("kaputt")

    broken = Instrument("broken", "Broken panel", "gradient", ("wiggle",), boom)
    data = LogData({}, {0: {"wiggle": 1.0}})
    with pytest.warns(UserWarning, match="instrument 'broken' failed: RuntimeError: kaputt"):
        fig = render(data, instruments=[broken, WIGGLE_PANEL])
    ax = next(a for a in fig.axes if a.get_title(loc="left") == "Broken panel")
    assert "kaputt" in ax.texts[0].get_text() and not ax.child_axes
    assert "Wiggle-o-meter" in panel_titles(fig)


def test_available_condition_hides_a_panel_and_says_why():
    picky = Instrument(
        "picky",
        "Picky",
        "gradient",
        ("wiggle",),
        draw_wiggle,
        available=lambda out: len(out) > 5,
        description="needs 6 steps",
    )
    fig = render(LogData({}, {0: {"wiggle": 1.0}}), instruments=[picky])
    assert "Picky" not in panel_titles(fig)
    assert "Picky (needs 6 steps)" in " ".join(figure_texts(fig))


def test_min_steps_and_optional_quantities():
    one = LogData({}, {0: {"a": 1.0}})
    inst = Instrument("ab", "AB", "gradient", (), draw_wiggle, optional=("a", "b"))
    needs_two = Instrument("two", "Two", "gradient", ("a",), draw_wiggle, min_steps=2)
    p = plan(one, instruments=[inst, needs_two])
    assert [panel.title for panel in p.panels] == ["AB"]
    assert p.panels[0].keys == {"a": "a"}
    assert [i.name for i, _ in p.skipped] == ["two"]


def test_cli_plot(tmp_path, registry_with_basic, capsys):
    result = run_cockpit(tiny_mlp(), ["loss", "grad_norm"], steps=3, log=tmp_path / "log.jsonl")
    result.cockpit.close()
    assert main(["plot", str(tmp_path / "log.jsonl"), "-o", str(tmp_path / "d.svg")]) == 0
    assert (tmp_path / "d.svg").read_bytes().startswith(b"<?xml")
    assert "d.svg" in capsys.readouterr().out
    assert main(["plot", str(tmp_path / "log.jsonl")]) == 0  # default: next to the log
    assert (tmp_path / "dashboard.png").exists()
    assert main(["plot", str(tmp_path / "missing.jsonl")]) == 1
    assert "no log file" in capsys.readouterr().err
    (tmp_path / "evil.jsonl").write_text('{"__instance_type__": ["os", "system"]}\n')
    assert main(["plot", str(tmp_path / "evil.jsonl")]) == 1
    assert "Nothing from it was imported" in capsys.readouterr().err


def test_live_plot_refreshes_every_n_steps(tmp_path):
    path = tmp_path / "live.png"
    result = run_cockpit(tiny_mlp(), ["loss", "grad_norm"], steps=5, live_plot=path, live_every=2)
    live = next(s for s in result.cockpit.sinks if isinstance(s, LivePlot))
    result.cockpit.close()  # waits for the background renderer's last picture
    assert path.exists()
    # asked at steps 0, 2 and 4; requests arriving while a picture is drawn are merged
    assert 1 <= live.renders <= 3
    with pytest.raises(ValueError, match="every must be"):
        LivePlot(tmp_path / "x.png", every=0)


def test_cp_plot_returns_the_path_or_the_figure(tmp_path):
    result = run_cockpit(tiny_mlp(), ["loss"], steps=2)
    assert result.cockpit.plot(tmp_path / "a.pdf") == tmp_path / "a.pdf"
    fig = result.cockpit.plot(title="my run")
    assert fig._suptitle.get_text() == "my run"


def test_plots_from_jsonl_and_json_are_the_same(tmp_path):
    result = run_cockpit(
        tiny_mlp(), ["loss", "grad_norm", "distance"], steps=3, log=tmp_path / "l.jsonl"
    )
    result.cockpit.close()
    result.cockpit.write(tmp_path / "o.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = plan(str(tmp_path / "l.jsonl"))
        b = plan(tmp_path / "o.json")
    assert [p.title for p in a.panels] == [p.title for p in b.panels]
    assert len(a.panels) == 4  # distance, grad norm, per-layer grad norm, loss


def test_a_cockpit_that_only_streams_is_plotted_from_its_log(tmp_path):
    result = run_cockpit(
        tiny_mlp(), ["loss"], steps=3, keep_in_memory=False, log=tmp_path / "l.jsonl"
    )
    assert result.cockpit.get_output() == {}
    fig = result.cockpit.plot()
    assert "Mini-batch loss" in panel_titles(fig)
