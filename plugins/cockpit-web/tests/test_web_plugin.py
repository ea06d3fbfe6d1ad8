"""cockpit-web's hooks: the ``.html`` renderer (also for a Cockpit) and ``cockpit serve``."""

from __future__ import annotations

import json
import re

import pytest
from cockpit_web.command import DESCRIPTION, HELP
from cockpit_web.render import render_html

from cockpit_core.cli.main import main
from cockpit_core.plugin.registry import default_registry
from cockpit_core.testing import run_cockpit, tiny_mlp

STEPS = 3


@pytest.fixture(scope="module")
def result():
    done = run_cockpit(tiny_mlp(), ["loss", "grad_norm"], steps=STEPS)
    done.cockpit.close()
    return done


def _payload(page: str) -> dict:
    found = re.search(r'<script id="cockpit-data" type="application/json">(.*?)</script>', page)
    return json.loads(found.group(1))


def _losses(payload: dict, name: str) -> list[float]:
    figure = next(p for p in payload["panels"] if p["id"] == "loss")["figure"]
    return next(t for t in figure["data"] if t["name"] == name)["y"]


def test_the_plugin_registers_the_html_renderer_and_the_serve_command():
    registry = default_registry()
    assert registry.renderer("dash.HTML").distribution == "cockpit-web"
    assert registry.renderer("dash.html").render is render_html
    assert registry.commands["serve"].distribution == "cockpit-web"
    assert registry.commands["serve"].help == HELP


def test_a_cockpit_renders_what_it_tracked_into_a_page(result, tmp_path, capsys):
    out = tmp_path / "dash.html"
    assert result.cockpit.plot(out, title="mine", rows=2, dpi=50) == out
    payload = _payload(out.read_text())
    assert payload["title"] == "mine"
    assert [run["label"] for run in payload["runs"]] == ["run"]
    assert _losses(payload, "loss") == [s.loss for s in result.snapshots]
    assert capsys.readouterr().err == ""
    assert list(tmp_path.iterdir()) == [out]  # the Cockpit's snapshot is not left behind


def test_runs_compared_and_the_page_as_text_without_a_path(result, tmp_path):
    log = result.cockpit.write(tmp_path / "base" / "output.json")
    page = render_html([log, result.cockpit], None, diagnose=False)
    assert page.startswith("<!DOCTYPE html>")
    payload = _payload(page)
    assert [run["label"] for run in payload["runs"]] == ["base", "run 2"]
    expected = [s.loss for s in result.snapshots]
    assert _losses(payload, "base: loss") == _losses(payload, "run 2: loss") == expected


def test_cockpit_serve_comes_from_the_command_hook_with_its_description(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert DESCRIPTION in out and "--allow-host NAME" in out
    assert HELP not in out  # the short help is for the list of commands
