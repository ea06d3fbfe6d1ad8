"""LivePlot(background=True): pictures drawn by a renderer process, training only hands records."""

from __future__ import annotations

import warnings

import pytest
from cockpit_dashboard import LivePlot
from cockpit_dashboard import live as live_module

from cockpit_core.errors import CockpitWarning

needs_fork = pytest.mark.skipif(
    not live_module.can_render_in_background(), reason="no fork here: background renders inline"
)
OPTIONS = {"dpi": 30, "title": "live"}  # a fixed title: pictures of equal data are equal


def _records(steps):
    yield {"kind": "header", "quantities": [{"name": "loss", "key": "loss"}]}
    for step in range(steps):
        yield {"kind": "values", "step": step, "values": {"loss": 1.0 / (step + 1)}}
    yield {"kind": "metrics", "step": steps - 1, "metrics": {"valid_loss": 0.5}}


@needs_fork
def test_requests_are_merged_and_the_last_picture_shows_everything(tmp_path):
    live = LivePlot(tmp_path / "bg.png", every=1, background=True, **OPTIONS)
    for record in _records(30):
        live(record)  # a picture is due at every step
    renderer = live._renderer.process
    assert renderer.is_alive() and live.renders <= 30
    live.close()
    assert not renderer.is_alive() and renderer.exitcode == 0
    assert 1 <= live.renders < 31  # requests queued while drawing became one picture
    reference = LivePlot(tmp_path / "inline.png", every=1000, **OPTIONS)
    for record in _records(30):
        reference(record)
    reference.close()  # one picture of everything, drawn in this process
    assert (tmp_path / "bg.png").read_bytes() == (tmp_path / "inline.png").read_bytes()
    assert live.data.output == reference.data.output


@needs_fork
def test_a_cockpit_run_with_a_background_live_plot(tmp_path):
    from cockpit_core.testing import run_cockpit, tiny_mlp

    live = LivePlot(tmp_path / "live.png", every=2, background=True, dpi=30)
    result = run_cockpit(tiny_mlp(), ["loss", "grad_norm"], steps=5, sinks=[live])
    result.cockpit.close()
    assert live.renders >= 1 and live._renderer is None
    assert (tmp_path / "live.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(live.data.output) == list(range(5))


@needs_fork
def test_a_failing_render_is_a_warning_at_close(tmp_path):
    live = LivePlot(tmp_path / "bad.png", every=1, background=True, panels=["no_such_panel"])
    for record in _records(2):
        live(record)
    with pytest.warns(CockpitWarning, match="rendering .*bad.png failed"):
        live.close()
    assert live.renders == 0


def test_without_fork_background_renders_in_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(live_module, "can_render_in_background", lambda: False)
    live = LivePlot(tmp_path / "x.png", every=2, background=True, **OPTIONS)
    assert live.background is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for record in _records(5):
            live(record)
    assert live.renders == 3  # steps 0, 2, 4 as before
    live.close()
    assert live.renders == 4  # the metric arrived since
