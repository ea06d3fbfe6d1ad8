"""The web view in a real headless browser: panels drawn by plotly, live updates.

Needs Chromium (`./dev setup` installs it in CI: Debian's `chromium` package); skipped
where no `chromium` or `chromium-browser` is on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading

import pytest

from cockpit_core.log import dumps
from cockpit_core.web import make_server

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no headless browser: install Debian's `chromium` (./dev setup does in CI) to run "
    "the web view's browser test",
)


def dump_dom(url: str, profile, budget_ms: int = 4000) -> str:
    """The page's DOM after ``budget_ms`` of virtual time (scripts run, polls answered)."""
    command = [
        BROWSER,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        "--dump-dom",
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _attribute(dom: str, element_id: str, name: str) -> int:
    found = re.search(rf'id="{element_id}"[^>]*\b{name}="(\d+)"', dom)
    assert found, f"no {name} on #{element_id}"
    return int(found.group(1))


def test_page_shows_the_panels_and_updates_when_a_record_is_appended(logged_run, tmp_path):
    appended = {"loss": 0.125}
    with make_server([logged_run.log.parent], port=0, poll_seconds=0.5) as server:
        feed_payload = server.feed.payload
        calls = []

        def payload():
            calls.append(1)
            if len(calls) == 2:  # the page's first poll: the run writes one more step
                with open(logged_run.log, "a") as f:
                    f.write(dumps({"kind": "values", "step": 10, "values": appended}) + "\n")
            return feed_payload()

        server.feed.payload = payload
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            first = feed_payload()
            dom = dump_dom(server.url, tmp_path / "profile")
        finally:
            server.shutdown()
            thread.join(5)
    titles = ("Gradient norm", "Gradient norm per parameter", "Mini-batch loss")
    for title in (*titles, "Distance from start &amp; update size"):
        assert f'data-unformatted="{title}"' in dom  # plotly drew the panel's title
    assert dom.count('class="main-svg"') >= 3  # plotly's SVG charts
    for heading in ("step size", "performance"):
        assert f"<h2>{heading}</h2>" in dom
    assert len(calls) >= 2, "the page never polled data.json"
    # the page redrew with the appended step: one more loss value, a newer version
    assert _attribute(dom, "cockpit-status", "data-points") == first["points"] + 1
    assert _attribute(dom, "cockpit-status", "data-version") > first["version"]
    loss_before = next(p["points"] for p in first["panels"] if p["id"] == "loss")
    assert _attribute(dom, "panel-loss", "data-points") == loss_before + 1
    assert "last step 10" in dom


def test_static_page_lists_findings_and_shades_their_steps(logged_run, tmp_path):
    from cockpit_core.diagnosis import Finding
    from cockpit_core.web import write_page

    finding = Finding(
        "dead_layers@1", "dead_layers", "warning", 1, 2, "a <b>dead</b> layer", {"x": 1}
    )
    with open(logged_run.log, "a") as f:
        f.write(dumps(finding.to_record()) + "\n")
    page = write_page([logged_run.log], tmp_path / "dash.html")
    dom = dump_dom(page.as_uri(), tmp_path / "profile", budget_ms=2000)
    assert _attribute(dom, "cockpit-findings", "data-count") == 1
    # the message is text, not markup; the entry is styled by its severity
    assert 'class="cockpit-finding warning" data-id="dead_layers@1"' in dom
    assert "WARNING dead_layers: </b>a &lt;b&gt;dead&lt;/b&gt; layer (steps 1-2)" in dom

    # plotly drew the span on the grad_norm panel (dead_layers reads grad_norm) only
    def drawn(panel_id: str) -> int:
        html = dom[dom.index(f'id="panel-{panel_id}"') :]
        return html[: html.find('id="panel-', 5)].count('class="shape-group"')

    assert (drawn("grad_norm"), drawn("loss")) == (1, 0)


def test_page_draws_the_histogram_heat_map_and_the_stability_threshold(tmp_path):
    from cockpit_core.testing import run_cockpit, tiny_mlp
    from cockpit_core.web import write_page

    quantities = ["loss", "grad_hist_1d", "hess_max_ev", "optimizer_hparams"]
    result = run_cockpit(tiny_mlp(), quantities, steps=3, log=tmp_path / "run" / "log.jsonl")
    result.cockpit.close()
    page = write_page([tmp_path / "run"], tmp_path / "dash.html")
    dom = dump_dom(page.as_uri(), tmp_path / "profile", budget_ms=2000)

    def panel(panel_id: str) -> str:
        html = dom[dom.index(f'id="panel-{panel_id}"') :]
        return html[: html.find('id="panel-', 5)]

    heat = panel("grad_hist_time")
    assert 'data-unformatted="Gradient histogram over time"' in heat
    assert 'class="hm"' in heat and "<image" in heat  # plotly drew the heat map's image
    assert 'data-unformatted="log10(1 + count)"' in heat  # and its colour bar
    assert 'data-unformatted="stability threshold 2/lr = 20"' in panel("hess_max_ev")
