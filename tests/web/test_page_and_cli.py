"""The page as one file (cockpit plot -o .html), the server's routes, the CLI's errors."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request

import pytest
from cockpit_web import make_server, render_page

from cockpit_core.cli.main import main

from .conftest import STEPS


def _embedded(page: str) -> dict:
    found = re.search(r'<script id="cockpit-data" type="application/json">(.*?)</script>', page)
    return json.loads(found.group(1))


def _trace(payload: dict, panel: str, name: str) -> dict:
    figure = next(p for p in payload["panels"] if p["id"] == panel)["figure"]
    return next(t for t in figure["data"] if t["name"] == name)


def test_plot_html_writes_one_self_contained_page(logged_run, tmp_path, capsys):
    out = tmp_path / "dash.html"
    assert main(["plot", str(logged_run.log), "-o", str(out), "--title", "a </script> b"]) == 0
    assert f"Dashboard written to {out}" in capsys.readouterr().out
    page = out.read_text()
    assert "<script src=" not in page and "Plotly.react" in page
    assert re.search(r"plotly\.js v\d+\.\d+", page)  # the bundle is inlined
    assert "a </script> b" not in page  # the title is escaped, in the page and its data
    payload = _embedded(page)
    assert payload["title"] == "a </script> b"
    loss = _trace(payload, "loss", "loss")
    assert loss["x"] == list(range(STEPS))
    assert loss["y"] == [snap.loss for snap in logged_run.result.snapshots]  # exact round trip
    assert _trace(payload, "metrics", "metrics/valid_loss")["y"] == [0.75]
    assert payload["runs"][0]["label"] == "run" and payload["runs"][0]["last_step"] == STEPS - 1


def test_a_static_page_does_not_poll_and_a_served_one_does(logged_run):
    with make_server([logged_run.log.parent], port=0) as server:
        payload = server.feed.payload()
    assert "const POLL_MS = 0;" in render_page(payload)
    assert "const POLL_MS = 1500;" in render_page(payload, poll_seconds=1.5, inline_js=False)


def test_server_routes(logged_run):
    with make_server([logged_run.log.parent], port=0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            with urllib.request.urlopen(server.url) as response:
                page = response.read().decode()
            assert '<script src="plotly.min.js"></script>' in page
            assert "const POLL_MS = 2000;" in page
            with urllib.request.urlopen(server.url + "data.json") as response:
                data = json.loads(response.read())
            assert _trace(data, "loss", "loss")["y"] == [
                s.loss for s in logged_run.result.snapshots
            ]
            assert data["points"] == _embedded(page)["points"]
            with urllib.request.urlopen(server.url + "plotly.min.js") as response:
                assert response.headers["Cache-Control"] == "max-age=86400"
                assert len(response.read()) > 1_000_000
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(server.url + "nothing")
        finally:
            server.shutdown()
            thread.join(5)


def test_serve_errors_are_messages(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "missing")]) == 1
    assert "neither a cockpit log nor a run folder" in capsys.readouterr().err
    assert main(["serve", str(tmp_path)]) == 1  # a folder without a log
    assert "holds no cockpit log" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(tmp_path), "--poll", "0"])
    assert exit_info.value.code == 2


def test_plot_html_overlays_several_runs_with_their_labels(logged_run, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text(logged_run.log.read_text())
    out = tmp_path / "cmp.html"
    args = ["plot", str(logged_run.log), str(other), "-o", str(out), "--labels", "base,copy"]
    assert main(args) == 0
    payload = _embedded(out.read_text())
    assert [run["label"] for run in payload["runs"]] == ["base", "copy"]
    assert _trace(payload, "loss", "base: loss")["y"] == _trace(payload, "loss", "copy: loss")["y"]
