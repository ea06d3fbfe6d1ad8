"""The web view's HTML page: plotly.js draws the panels from the data of a :class:`Feed`.

One page serves both uses. ``cockpit plot RUN -o dash.html`` writes it as a single
self-contained file (plotly.js inlined, the data embedded, no network needed);
``cockpit serve`` sends the same page with plotly.js as a separate, cacheable file and a
poll interval, and the page then asks the server for ``data.json`` every few seconds and
redraws with ``Plotly.react`` when the version changed. The charts are plotly's; the
page's own script only places the panels, lists the findings above them and polls.

The findings list is kept short so that the charts start on the first screen: one row
per diagnosis and run (a ``<details>`` element whose summary names the severity, the
diagnosis, its first message and steps; opened, it lists every stretch with the
suggestion and the source), in a box of at most :data:`FINDINGS_HEIGHT` that scrolls
beyond. Plotly's mode bar (zoom, pan, download) shows only while the pointer is over a
chart, in the top margin to the right, above the panel's title (see
:func:`cockpit_web.panels.figures`).
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from cockpit_core.log.atomic_file import write_text_atomic
from cockpit_web.feed import Feed

PLOTLY_JS = "plotly.min.js"
"""Where ``cockpit serve`` serves plotly.js (relative to the page)."""

DATA_JSON = "data.json"
"""Where ``cockpit serve`` serves :meth:`Feed.payload` (relative to the page)."""

FINDINGS_HEIGHT = "30vh"
"""Height of the findings list at most (CSS); a longer list scrolls."""

PLOTLY_CONFIG = {"responsive": True, "displaylogo": False, "displayModeBar": "hover"}
"""Plotly's configuration of every chart: the mode bar only while the pointer is over it."""

_STYLE = """
body { font-family: sans-serif; margin: 0.8em 2em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 0.2em 0; }
h2 { font-size: 1.05em; text-transform: uppercase; color: #555; border-bottom: 1px solid #ccc;
  margin: 0.6em 0 0.4em 0; }
#cockpit-status { color: #555; font-size: 0.9em; margin: 0.2em 0; }
.cockpit-topic { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr));
  gap: 0.5em; }
.cockpit-error { color: #b00; margin: 0.2em 0; }
.cockpit-error:empty { display: none; }
#cockpit-findings h2 { margin-top: 0.3em; }
.cockpit-findings-list { max-height: %(findings_height)s; overflow-y: auto; }
.cockpit-finding { border-left: 5px solid #1f77b4; padding: 0.1em 0.6em; margin: 0.15em 0;
  background: #f6f6f6; font-size: 0.9em; }
.cockpit-finding.warning { border-color: #ff7f0e; }
.cockpit-finding.error { border-color: #d62728; }
.cockpit-finding summary { display: block; cursor: pointer; white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; }
.cockpit-finding summary::before { content: "\\25b8  "; color: #777; }
.cockpit-finding[open] summary::before { content: "\\25be  "; }
.cockpit-finding ul { margin: 0.2em 0 0.2em 1.2em; padding: 0; }
.cockpit-finding small { color: #555; }
"""

# Places one div per panel under its topic's heading and hands the figure to plotly;
# with POLL > 0 asks the server for data.json and redraws when its version changed.
_SCRIPT = """
const POLL_MS = %(poll_ms)d;
const CONFIG = %(config)s;
let version = null;
function section(topic) {
  const id = "topic-" + topic.replace(/[^a-z0-9]+/g, "-");
  let box = document.getElementById(id);
  if (!box) {
    const h = document.createElement("h2");
    h.textContent = topic;
    box = document.createElement("div");
    box.id = id;
    box.className = "cockpit-topic";
    const panels = document.getElementById("cockpit-panels");
    panels.appendChild(h);
    panels.appendChild(box);
  }
  return box;
}
function show(data) {
  version = data.version;
  for (const topic of data.topics) {
    if (data.panels.some((p) => p.topic === topic)) section(topic);
  }
  for (const p of data.panels) {
    let div = document.getElementById("panel-" + p.id);
    if (!div) {
      div = document.createElement("div");
      div.id = "panel-" + p.id;
      div.className = "cockpit-panel";
      section(p.topic).appendChild(div);
    }
    div.dataset.points = p.points;
    Plotly.react(div, p.figure.data, p.figure.layout, CONFIG);
  }
  const runs = data.runs.map((r) => r.label + " (last step " + r.last_step + ")").join(", ");
  const status = document.getElementById("cockpit-status");
  status.dataset.points = data.points;
  status.dataset.version = data.version;
  status.textContent = data.points + " values in " + data.panels.length + " panels; " + runs +
    "; updated " + data.updated + (POLL_MS ? " (live)" : "");
  showFindings(data.finding_groups || [], (data.findings || []).length, data.runs.length > 1);
  const errors = data.runs.filter((r) => r.error).map((r) => r.label + ": " + r.error);
  for (const r of data.runs) {
    for (const problem of r.problems || []) errors.push(r.label + ": " + problem);
  }
  document.getElementById("cockpit-errors").textContent = errors.join("; ");
}
function stepsOf(f) {
  return f.first_step === f.last_step ? "step " + f.first_step
    : "steps " + f.first_step + "-" + f.last_step;
}
function showFindings(groups, count, several) {
  const box = document.getElementById("cockpit-findings");
  box.dataset.count = count;
  box.dataset.groups = groups.length;
  const open = new Set(Array.from(box.querySelectorAll("details[open]"), (d) => d.dataset.key));
  box.replaceChildren();
  if (!groups.length) return;
  const h = document.createElement("h2");
  h.textContent = "findings (" + count + " from " + groups.length + " diagnoses" +
    (several ? " and runs" : "") + ")";
  const list = document.createElement("div");
  list.className = "cockpit-findings-list";
  for (const g of groups) {
    const item = document.createElement("details");
    item.className = "cockpit-finding " + String(g.severity);
    item.dataset.key = g.run + "\u0000" + g.diagnosis;
    item.dataset.diagnosis = g.diagnosis;
    item.dataset.count = g.count;
    item.open = open.has(item.dataset.key);
    const summary = document.createElement("summary");
    const head = document.createElement("b");
    head.textContent = (several ? g.run + ": " : "") + String(g.severity).toUpperCase() + " " +
      g.diagnosis;
    summary.appendChild(head);
    const first = g.stretches.find((s) => s.id === g.id) || g;
    const where = stepsOf(first) + (g.count > 1 ? "; " + g.count + " stretches" : "");
    summary.appendChild(document.createTextNode(" (" + where + "): " + g.message));
    item.appendChild(summary);
    const stretches = document.createElement("ul");
    for (const s of g.stretches) {
      const li = document.createElement("li");
      li.dataset.id = s.id;
      li.textContent = stepsOf(s) + ": " + (s.severity !== g.severity
        ? String(s.severity).toUpperCase() + " " : "") + s.message;
      stretches.appendChild(li);
    }
    item.appendChild(stretches);
    const more = [g.suggestion, g.source].filter((t) => t).join(" \u2014 ");
    if (more) {
      const small = document.createElement("small");
      small.textContent = more;
      item.appendChild(small);
    }
    list.appendChild(item);
  }
  box.appendChild(h);
  box.appendChild(list);
}
async function poll() {
  try {
    const response = await fetch("%(data)s?version=" + version, {cache: "no-store"});
    const data = await response.json();
    if (data.version !== version) show(data);
  } catch (err) {
    document.getElementById("cockpit-errors").textContent = "cannot reach the server: " + err;
  }
  setTimeout(poll, POLL_MS);
}
show(JSON.parse(document.getElementById("cockpit-data").textContent));
if (POLL_MS > 0) setTimeout(poll, POLL_MS);
"""


def plotly_js() -> str:
    """The plotly.js bundle of the installed ``plotly`` package."""
    from plotly.offline import get_plotlyjs

    bundle: str = get_plotlyjs()  # unannotated in plotly
    return bundle


def _embed(payload: dict[str, Any]) -> str:
    """JSON that is safe inside a ``<script>`` element."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False, default=_plain)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _plain(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"cannot send {type(value).__name__} to the page")


def payload_json(payload: dict[str, Any]) -> bytes:
    """``data.json`` as sent by the server."""
    return _embed(payload).encode("utf-8")


def render_page(payload: dict[str, Any], poll_seconds: float = 0.0, inline_js: bool = True) -> str:
    """The page showing ``payload`` (:meth:`Feed.payload`).

    Args:
        payload: The data shown first.
        poll_seconds: Seconds between asks for :data:`DATA_JSON`; ``0`` for a static file.
        inline_js: Inline plotly.js (a self-contained file); else load :data:`PLOTLY_JS`.

    """
    script = (
        f"<script>{plotly_js()}</script>" if inline_js else f'<script src="{PLOTLY_JS}"></script>'
    )
    code = _SCRIPT % {
        "poll_ms": round(poll_seconds * 1000),
        "data": DATA_JSON,
        "config": json.dumps(PLOTLY_CONFIG),
    }
    style = _STYLE % {"findings_height": FINDINGS_HEIGHT}
    title = html.escape(str(payload.get("title", "cockpit")))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n<style>{style}</style>\n{script}\n</head>\n<body>\n"
        f'<h1>{title}</h1>\n<p id="cockpit-status"></p>\n'
        '<p id="cockpit-errors" class="cockpit-error"></p>\n'
        '<div id="cockpit-findings"></div>\n'
        '<div id="cockpit-panels"></div>\n'
        f'<script id="cockpit-data" type="application/json">{_embed(payload)}</script>\n'
        f"<script>{code}</script>\n</body>\n</html>\n"
    )


def write_page(
    paths: list[str | os.PathLike[str]] | Feed,
    out: str | os.PathLike[str],
    title: str | None = None,
    labels: list[str] | None = None,
    diagnose: bool = True,
) -> Path:
    """Write the web view of the runs at ``paths`` to ``out`` as one self-contained file.

    The file opens in any browser without a server or a network (plotly.js is inlined:
    about 5 MB). The installed diagnoses run over each log (``diagnose=False``: only the
    findings the logs recorded while training): their findings are listed above the
    panels, grouped by diagnosis and run, and shaded on them. It is written to a
    temporary file first and then renamed over ``out``. ``title`` and ``labels`` as in
    :class:`Feed`; ``paths`` may also be a :class:`Feed` (then they are its own).
    """
    out = Path(out)
    feed = (
        paths if isinstance(paths, Feed) else Feed(paths, title, labels=labels, diagnose=diagnose)
    )
    text = standalone_page(feed)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(out, text)


def standalone_page(feed: Feed) -> str:
    """The page of :func:`write_page` as text: plotly.js inlined, the data of every step.

    Shown once, the page has the diagnoses see every step of each log, as
    ``cockpit diagnose`` does.
    """
    for run in feed.runs:
        run.keep_all_steps()
    return render_page(feed.payload())
