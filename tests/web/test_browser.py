"""The web view in a real headless browser: panels drawn by plotly, live updates.

Needs Chromium (`./dev setup` installs it in CI: Debian's `chromium` package); skipped
where no `chromium` or `chromium-browser` is on PATH.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import threading

import pytest
from cockpit_web import make_server

from cockpit_core.log import dumps

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no headless browser: install Debian's `chromium` (./dev setup does in CI) to run "
    "the web view's browser test",
)


def dump_dom(url: str, profile, budget_ms: int = 4000, window: str = "1280,800") -> str:
    """The page's DOM after ``budget_ms`` of virtual time (scripts run, polls answered)."""
    command = [
        BROWSER,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={window}",
        "--hide-scrollbars",
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
    from cockpit_web import write_page

    from cockpit_core.diagnosis import Finding

    finding = Finding(
        "dead_layers@1", "dead_layers", "warning", 1, 2, "a <b>dead</b> layer", {"x": 1}
    )
    with open(logged_run.log, "a") as f:
        f.write(dumps(finding.to_record()) + "\n")
    page = write_page([logged_run.log], tmp_path / "dash.html")
    dom = dump_dom(page.as_uri(), tmp_path / "profile", budget_ms=2000)
    assert _attribute(dom, "cockpit-findings", "data-count") == 1
    assert _attribute(dom, "cockpit-findings", "data-groups") == 1
    # the message is text, not markup; the row is styled by its severity
    assert '<details class="cockpit-finding warning" data-key=' in dom
    assert "WARNING dead_layers</b> (steps 1-2): a &lt;b&gt;dead&lt;/b&gt; layer" in dom
    assert '<li data-id="dead_layers@1">steps 1-2: a &lt;b&gt;dead&lt;/b&gt; layer</li>' in dom

    # plotly drew the span on the grad_norm panel (dead_layers reads grad_norm) only
    def drawn(panel_id: str) -> int:
        html = dom[dom.index(f'id="panel-{panel_id}"') :]
        return html[: html.find('id="panel-', 5)].count('class="shape-group"')

    assert (drawn("grad_norm"), drawn("loss")) == (1, 0)


def test_page_draws_the_histogram_heat_map_and_the_stability_threshold(tmp_path):
    from cockpit_web import write_page

    from cockpit_core.testing import run_cockpit, tiny_mlp

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


# Measures the drawn page in the browser and writes the boxes (page coordinates, px) into
# a <pre id="geometry"> element of the DOM that --dump-dom returns.
MEASURE = """
<script>
setTimeout(function () {
  function box(el) {
    if (!el) return null;
    const r = el.getBoundingClientRect();
    return [r.left, r.top + window.scrollY, r.right, r.bottom + window.scrollY];
  }
  const panels = Array.from(document.querySelectorAll(".cockpit-panel"), (p) => ({
    id: p.id, box: box(p), title: box(p.querySelector(".gtitle")),
    modebar: box(p.querySelector(".modebar")),
  }));
  const pre = document.createElement("pre");
  pre.id = "geometry";
  pre.textContent = JSON.stringify({height: window.innerHeight, panels: panels});
  document.body.appendChild(pre);
}, 1500);
</script>
"""


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_twenty_findings_of_two_runs_leave_the_charts_on_the_first_screen(logged_run, tmp_path):
    """1280x800: one row per diagnosis and run, the charts start on the first screen, and
    plotly's mode bar covers no panel title."""
    import json

    from cockpit_web import write_page

    from cockpit_core.diagnosis import Finding

    message = "the norm test fails at many tracked steps: the mini-batch gradient is too noisy"
    plan = {
        "lr-0.1": [("dead_layers", "warning", 4), ("batch_size", "warning", 5)],
        "lr-1": [
            ("batch_size", "warning", 4),
            ("exploding_gradients", "error", 2),
            ("step_size", "warning", 3),
            ("dead_layers", "info", 2),
        ],
    }
    runs = []
    for name, items in plan.items():
        (tmp_path / name).mkdir()
        log = tmp_path / name / "log.jsonl"
        log.write_bytes(logged_run.log.read_bytes())
        with open(log, "a") as f:
            for diagnosis, severity, count in items:
                for k in range(count):
                    found = Finding(f"{diagnosis}@{k}", diagnosis, severity, k, k + 1, message)
                    f.write(dumps(found.to_record()) + "\n")
        runs.append(tmp_path / name)
    page = write_page(runs, tmp_path / "dash.html", diagnose=False)
    measured = tmp_path / "measured.html"
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom = dump_dom(measured.as_uri(), tmp_path / "profile", budget_ms=4000)

    assert _attribute(dom, "cockpit-findings", "data-count") == 20
    assert _attribute(dom, "cockpit-findings", "data-groups") == 6  # one per diagnosis and run
    assert dom.count('<details class="cockpit-finding') == 6
    assert 'data-diagnosis="batch_size" data-count="5"' in dom
    geometry = json.loads(html.unescape(re.search(r'<pre id="geometry">(.*?)</pre>', dom)[1]))
    panels = geometry["panels"]
    assert len(panels) >= 3
    first = min(p["box"][1] for p in panels)
    # the first charts start on the first screen, with room to be read
    assert first + 200 <= min(800, geometry["height"]), geometry
    for panel in panels:
        title, modebar = panel["title"], panel["modebar"]
        assert title is not None and modebar is not None, panel
        assert not _overlap(title, modebar), panel  # the mode bar covers no title
        assert panel["box"][1] <= title[1] and title[3] <= panel["box"][3]
