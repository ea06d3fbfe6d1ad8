"""cockpit-dashboard registers its renderers and the ``live_plot`` sink through the hooks."""

import cockpit_basic.plugin
import cockpit_dashboard.plugin
import numpy as np
import pytest
from cockpit_dashboard import LivePlot
from cockpit_dashboard.image import dashboard_image
from cockpit_dashboard.live import LivePlotConfig, live_plot_sink
from matplotlib.figure import Figure

from cockpit_core import ConfigError, Registry, UnknownSinkError
from cockpit_core.cli.main import main
from cockpit_core.errors import CockpitWarning, UnknownRendererError
from cockpit_core.hookspecs import LIVE_PLOT_SINK
from cockpit_core.plugin.registry import default_registry
from cockpit_core.testing import run_cockpit, tiny_mlp


def registry_of():
    registry = Registry()
    assert registry.add_plugin(cockpit_dashboard.plugin, name="dashboard").ok
    return registry


def test_the_plugin_registers_png_svg_pdf_and_the_live_plot_sink():
    registry = registry_of()
    assert sorted(registry.renderers) == [".pdf", ".png", ".svg"]
    assert {e.render for e in registry.renderers.values()} == {cockpit_dashboard.plugin.render}
    assert registry.renderer(None) is registry.renderers[".png"]  # no path: the figure
    assert registry.renderer("a/b.SVG") is registry.renderers[".svg"]
    with pytest.raises(UnknownRendererError):
        registry.renderer("dashboard.jpg")
    entry = registry.sink_entry(LIVE_PLOT_SINK)
    assert (entry.factory, entry.config) == (live_plot_sink, LivePlotConfig)
    installed = default_registry()  # through the entry point of the installed distribution
    assert installed.renderers[".png"].distribution == "cockpit-dashboard"
    assert installed.sink_entry(LIVE_PLOT_SINK).distribution == "cockpit-dashboard"


def test_live_plot_options_are_validated(tmp_path):
    registry = registry_of()
    path = str(tmp_path / "live.png")
    sink = registry.make_sink({"name": "live_plot", "path": path, "every": 3})
    assert isinstance(sink, LivePlot) and (sink.every, str(sink.path)) == (3, path)
    assert registry.make_sink({"name": "live_plot", "path": path}).every == 50
    with pytest.raises(ConfigError, match="every"):
        registry.make_sink({"name": "live_plot", "path": path, "every": 0})
    with pytest.raises(ConfigError, match="unknown option"):
        registry.make_sink({"name": "live_plot", "path": path, "evry": 3})
    with pytest.raises(ValueError, match=r"\.png, \.svg, \.pdf"):
        registry.make_sink({"name": "live_plot", "path": str(tmp_path / "live.gif")})


def test_cockpit_live_plot_is_the_sink_and_writes_the_picture(tmp_path):
    path = tmp_path / "live.png"
    result = run_cockpit(tiny_mlp(), ["loss"], steps=3, live_plot=path, live_every=1)
    live = next(s for s in result.cockpit.sinks if isinstance(s, LivePlot))
    assert live.every == 1 and live.path == path
    result.cockpit.close()  # waits for the background renderer's last picture
    assert path.read_bytes().startswith(b"\x89PNG")
    basic = Registry()  # the quantities, not the dashboard: no live plot
    basic.add_plugin(cockpit_basic.plugin, name="basic")
    with pytest.raises(UnknownSinkError, match="live_plot"):
        run_cockpit(tiny_mlp(), ["loss"], steps=1, registry=basic, live_plot=path)


def test_plot_picks_the_renderer_by_suffix(tmp_path, capsys):
    result = run_cockpit(tiny_mlp(), ["loss"], steps=3, log=tmp_path / "log.jsonl")
    result.cockpit.close()
    assert main(["plot", str(tmp_path / "log.jsonl"), "-o", str(tmp_path / "d.svg")]) == 0
    assert (tmp_path / "d.svg").read_bytes().startswith(b"<?xml")
    assert "Dashboard written to" in capsys.readouterr().out
    assert result.cockpit.plot(tmp_path / "d.pdf") == tmp_path / "d.pdf"
    assert (tmp_path / "d.pdf").read_bytes().startswith(b"%PDF")
    assert isinstance(result.cockpit.plot(), Figure)


def test_the_renderer_ignores_options_it_does_not_use(tmp_path):
    result = run_cockpit(tiny_mlp(), ["loss"], steps=2)
    fig = cockpit_dashboard.plugin.render(result.cockpit, None, title="t", port=8050)
    assert fig._suptitle.get_text() == "t"
    path = cockpit_dashboard.plugin.render(result.cockpit, tmp_path / "a.png", poll=2.0)
    assert path == tmp_path / "a.png" and path.read_bytes().startswith(b"\x89PNG")


def test_dashboard_image_is_rgb_or_none_with_a_warning():
    result = run_cockpit(tiny_mlp(), ["loss"], steps=2)
    image = dashboard_image(result.cockpit, dpi=20)
    assert image is not None and image.dtype == np.uint8
    assert image.ndim == 3 and image.shape[2] == 3 and image.min() < image.max()
    with pytest.warns(CockpitWarning, match="could not be drawn"):
        assert dashboard_image(42) is None
