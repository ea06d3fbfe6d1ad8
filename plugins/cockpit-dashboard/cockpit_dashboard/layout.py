"""Lay out the registered instruments and render the dashboard (matplotlib, headless).

Layout (like Cockpit 1.0.2's, but built from whatever instruments are installed)::

    +-------------+-----------------------+-------------+-------------------+
    |  STEP SIZE  |       GRADIENT        |  CURVATURE  |  <plugin topics>  |
    |  panel      |  panel     panel      |  panel      |  panel            |
    |  panel      |  panel     panel      |  panel      |  <small topic>    |
    |  panel      |  panel     panel      |  panel      |  panel            |
    +-------------+-----------------------+-------------+-------------------+
    |  PERFORMANCE: panels side by side                                     |
    +-----------------------------------------------------------------------+
    Not tracked: ... (panels skipped because their quantities were not tracked)

A topic with more panels than ``rows`` wraps into several sub-columns; a plugin's topic
with few panels shares the column before it when there is room (:func:`_columns`), each
topic in its own box. Given several runs, the same layout shows the union of their panels,
a colour per run (:mod:`cockpit_dashboard.compare`). Figures are built without pyplot
(no global state, no window): safe in threads and on headless machines.
"""

from __future__ import annotations

import os
import textwrap
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cockpit_core.errors import CockpitWarning, UnknownInstrumentError
from cockpit_core.instrument import TOPICS, Instrument
from cockpit_core.log import LogData
from cockpit_core.log.atomic_file import atomic_write
from cockpit_core.panel.planning import (
    Panel,
    default_instruments,
    load,
    plan,
    registry_of,
    skip_note,
)
from cockpit_core.panel.style import EXTRA_COLORS, TOPIC_COLORS, message
from cockpit_dashboard import compare
from cockpit_dashboard.panel_draw import draw_safely

FORMATS = ("png", "svg", "pdf")
"""File formats :func:`render` writes (chosen by the file suffix)."""


def _select(instruments: list[Instrument], names: Iterable[str]) -> list[Instrument]:
    """The instruments named ``names``; raise with the closest name for an unknown one."""
    by_name = {inst.name: inst for inst in instruments}
    wanted = list(names)
    for name in wanted:
        if name not in by_name:
            raise UnknownInstrumentError(name, by_name)
    return [by_name[name] for name in dict.fromkeys(wanted)]


def render(
    source: Any,
    path: str | os.PathLike[str] | None = None,
    *,
    registry: Any = None,
    instruments: Iterable[Instrument] | None = None,
    panels: Iterable[str] | None = None,
    title: str | None = None,
    rows: int = 4,
    panel_size: tuple[float, float] = (4.6, 2.7),
    dpi: int = 100,
    labels: Sequence[str] | None = None,
    diagnose: bool = True,
) -> Any:
    """Render the dashboard of ``source`` and save it to ``path`` if given.

    Args:
        source: A :class:`~cockpit_core.Cockpit`, a log path (``.jsonl`` or ``.json``), a
            :class:`~cockpit_core.log.LogData` or ``{step: {name: value}}``; or a list of
            these to compare runs: each panel then shows every run in its own colour, with
            a legend (see :mod:`cockpit_dashboard.compare`).
        path: Output file; the suffix picks the format (``.png``, ``.svg``, ``.pdf``).
        registry: Where instruments, and the diagnoses whose findings mark panels, come
            from (default: the Cockpit's, else every installed plugin).
        instruments: Use these instruments instead of the registry's.
        panels: Draw only the instruments of these names (in their usual places).
        title: Figure title (default: a summary of the run).
        rows: Panels per column before a topic wraps into another column.
        panel_size: Width and height of one panel in inches.
        dpi: Resolution of raster output.
        labels: Legend labels of compared runs (default: each run's learning rate, else
            its log path; see :func:`~cockpit_dashboard.compare.run_labels`).
        diagnose: Run the registry's diagnoses over the run, as ``cockpit diagnose``
            does; ``False``: show only the findings recorded while training.

    One run's findings (those the diagnoses find in it now, and the ``finding`` records of
    ``cp.findings`` or the log, each once:
    :func:`~cockpit_core.diagnosing.findings.run_findings`) appear as a banner under the
    title (:mod:`cockpit_dashboard.banner`) and as shaded step spans on the panels that show
    what their diagnosis reads (:mod:`cockpit_dashboard.markers`); a comparison shows none.
    A diagnosis that fails is skipped, warned about and named in the note at the bottom.

    Returns:
        The matplotlib ``Figure``.

    Raises:
        UnknownInstrumentError: A name of ``panels`` is no instrument's (with the closest).
        ValueError: An empty list of runs, or ``labels`` not one per run.

    """
    from matplotlib.figure import Figure

    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}.")
    suffix = check_path(path)
    sources = list(source) if isinstance(source, (list, tuple)) else [source]
    if not sources:
        raise ValueError("render needs at least one run: got an empty list.")
    datas = [load(s) for s in sources]
    insts = (
        list(instruments) if instruments is not None else default_instruments(sources[0], registry)
    )
    if panels is not None:
        insts = _select(insts, panels)
    findings: list[Any] = []  # a comparison: none
    problems: list[str] = []
    if len(datas) == 1:
        data = datas[0]
        plan_ = plan(data, insts)
        reg = registry_of(sources[0], registry)
        findings, problems = _findings(data, reg, diagnose)
        marker = _marker(findings, reg)

        def draw(fig: Any, cell: Any, panel: Panel) -> Any:
            ax = _draw_panel(fig, cell, panel, data)
            marker(ax, panel)
            return ax

        summary = _summary(data, sorted(data.output))
    else:
        runs, plan_, data = compare.prepare(datas, sources, insts, labels)
        summary = compare.summary(runs)

        def draw(fig: Any, cell: Any, panel: Panel) -> Any:
            return compare.draw_panel(fig, cell, panel, runs)

    bottom = plan_.topics.get("performance", [])
    subcols = _columns({t: ps for t, ps in plan_.topics.items() if t != "performance"}, rows)
    nrows = max((sum(len(ps) for _, ps in col) for col in subcols), default=0)
    pw, ph = panel_size
    note = skip_note(plan_, data)
    if problems:
        note.append("Diagnoses skipped: " + "; ".join(problems) + ".")
    ncols = max(len(subcols), 2)
    width = ncols * pw
    wrapped = [w for line in note for w in textwrap.wrap(line, int(width * 15))]
    groups = len({f.diagnosis for f in findings})  # the banner: a line per diagnosis
    banner_lines = min(groups, 3) + (groups > 3)
    top_in, col_title_in = 0.75 + (0.2 * banner_lines + 0.2 if findings else 0.0), 0.45
    col_in = nrows * ph + col_title_in if subcols else 0.0
    bottom_in = 1.3 * ph if bottom else 0.0
    note_in = 0.22 * len(wrapped) + 0.25
    if not subcols and not bottom:
        bottom_in = ph
    height = top_in + col_in + bottom_in + note_in + (0.35 if subcols and bottom else 0.0)
    fig = Figure(figsize=(width, height), dpi=dpi, facecolor="white")

    title = title or summary
    size = min(13.0, 13.0 * width * 8.5 / max(len(title), 1))  # keep a long title on the page
    fig.suptitle(title, x=0.01, ha="left", fontsize=size, fontweight="bold")
    if findings:  # what the diagnoses found, under the title (docs/diagnoses.md)
        from cockpit_dashboard.banner import findings_banner

        findings_banner(fig, findings, y=1 - 0.62 / height)
    y_top = 1 - top_in / height
    left, right = 0.55 / width, 1 - 0.5 / width
    if subcols:
        y_bot = y_top - col_in / height
        outer = fig.add_gridspec(
            1,
            len(subcols),
            left=left,
            right=right,
            top=y_top - col_title_in / height,
            bottom=y_bot + 0.45 / height,
            wspace=0.42,
        )
        boxes: dict[str, list[tuple[float, float, float, float]]] = {}
        for j, column in enumerate(subcols):
            inner = outer[0, j].subgridspec(nrows, 1, hspace=0.85)
            slots = [inner[i, 0].get_position(fig) for i in range(nrows)]
            i = 0
            for k, (topic, topic_panels) in enumerate(column):
                for panel in topic_panels:
                    draw(fig, inner[i, 0], panel)
                    i += 1
                # a topic sharing its column gets a box around its own panels only
                top = y_top if k == 0 else slots[i - len(topic_panels)].y1 + col_title_in / height
                low = y_bot if k == len(column) - 1 else slots[i - 1].y0 - 0.45 / height
                if k < len(column) - 1:  # leave a gap to the next topic's box
                    gap = slots[i - 1].y0 - slots[i].y1
                    low = max(low, slots[i].y1 + gap / 2 + 0.05 / height)
                if k > 0:
                    gap = slots[i - len(topic_panels) - 1].y0 - slots[i - len(topic_panels)].y1
                    top = min(top, slots[i - len(topic_panels)].y1 + gap / 2 - 0.05 / height)
                x = outer[0, j].get_position(fig)
                boxes.setdefault(topic, []).append((x.x0, low, x.x1, top))
        for k, (topic, parts) in enumerate(boxes.items()):
            x0 = min(b[0] for b in parts) - 0.42 / width
            x1 = max(b[2] for b in parts) + 0.1 / width
            y0, y1 = min(b[1] for b in parts), max(b[3] for b in parts)
            color = TOPIC_COLORS.get(topic, EXTRA_COLORS[k % len(EXTRA_COLORS)])
            _group(fig, (x0, y0, x1, y1), topic, color, 0.08 / height)
        y_top = y_bot - 0.35 / height
    if bottom or not subcols:
        y_bot = y_top - bottom_in / height
        if bottom:
            box = (left - 0.42 / width, y_bot, right + 0.1 / width, y_top)
            _group(fig, box, "performance", TOPIC_COLORS["performance"], 0.06 / height)
            gs = fig.add_gridspec(
                1,
                len(bottom),
                left=left,
                right=right,
                top=y_top - 0.5 / height,
                bottom=y_bot + 0.45 / height,
                wspace=0.25,
                width_ratios=[p.instrument.size for p in bottom],
            )
            for j, panel in enumerate(bottom):
                draw(fig, gs[0, j], panel)
        else:
            ax = fig.add_axes(
                (left, y_bot + 0.1 / height, right - left, (bottom_in - 0.2) / height)
            )
            ax.set_axis_off()
            message(ax, "Nothing to show: no tracked quantity has an installed instrument.")
    for i, line in enumerate(wrapped):
        fig.text(
            0.01, (note_in - 0.2 - 0.22 * i) / height, line, fontsize=8.5, va="top", color="#444455"
        )
    if path is not None:
        save(fig, path, dpi=dpi, suffix=suffix)
    return fig


def _group(
    fig: Any, box: tuple[float, float, float, float], topic: str, color: str, pad: float
) -> None:
    """A rounded background ``box`` (figure fractions x0, y0, x1, y1) headed by ``topic``."""
    from matplotlib.patches import FancyBboxPatch

    x0, y0, x1, y1 = box
    fig.patches.append(
        FancyBboxPatch(
            (x0, y0),
            x1 - x0,
            y1 - y0,
            boxstyle="round,pad=0,rounding_size=0.01",
            transform=fig.transFigure,
            facecolor=color,
            edgecolor="none",
            zorder=-10,
        )
    )
    fig.text(
        (x0 + x1) / 2,
        y1 - pad,
        topic.upper(),
        ha="center",
        va="top",
        fontsize=12,
        fontweight="bold",
        color="#333344",
    )


def _columns(topics: Mapping[str, list[Panel]], rows: int) -> list[list[tuple[str, list[Panel]]]]:
    """The column groups: each column a list of ``(topic, panels)``, top to bottom.

    A topic fills columns of at most ``rows`` panels (:func:`_split`). A plugin's own
    topic (not one of :data:`~cockpit_core.instrument.TOPICS`) that fits in the free
    slots of the column before it joins that column, stacked below, when that column
    holds whole topics only: one- or two-panel plugin topics share a column instead of
    each taking a mostly empty one. The standard topics keep their columns.
    """
    chunks = [
        (t, chunk, len(chunk) == len(ps)) for t, ps in topics.items() for chunk in _split(ps, rows)
    ]
    height = max((len(chunk) for _, chunk, _ in chunks), default=0)
    columns: list[list[tuple[str, list[Panel]]]] = []
    shareable = False  # whether the last column holds whole topics only
    for topic, chunk, whole in chunks:
        used = sum(len(ps) for _, ps in columns[-1]) if columns else height
        if whole and shareable and topic not in TOPICS and used + len(chunk) <= height:
            columns[-1].append((topic, chunk))
        else:
            columns.append([(topic, chunk)])
            shareable = whole
    return columns


def _split(panels: list[Panel], rows: int) -> list[list[Panel]]:
    """Split a topic's panels into the fewest sub-columns of at most ``rows``, evenly."""
    k = -(-len(panels) // rows)
    per = -(-len(panels) // k)
    return [panels[i : i + per] for i in range(0, len(panels), per)]


def _summary(data: LogData, steps: list[int]) -> str:
    version = data.header.get("cockpit_core")
    span = f"steps {steps[0]}-{steps[-1]}" if steps else "no steps"
    names = {
        str(q.get("key")) for q in data.header.get("quantities") or [] if isinstance(q, Mapping)
    }
    count = len(names) or len({k for v in data.output.values() for k in v})
    return f"cockpit: {span}, {count} quantities" + (
        f" (cockpit-core {version})" if version else ""
    )


def _title(ax: Any, panel: Panel) -> None:
    ax.set_title(panel.title, fontsize=9.5, fontweight="bold", loc="left")


def _findings(data: LogData, registry: Any, diagnose: bool) -> tuple[list[Any], list[str]]:
    """The run's findings and the diagnoses that failed (warned about here)."""
    from cockpit_core.diagnosing.findings import run_findings

    found, problems = run_findings(data, registry, offline=diagnose)
    for problem in problems:
        warnings.warn(f"cockpit dashboard: {problem}", CockpitWarning, stacklevel=4)
    return found, problems


def _marker(findings: list[Any], registry: Any) -> Callable[[Any, Panel], Any]:
    """``marker(ax, panel)``: the run's findings on a drawn panel (see ``markers``)."""
    if not findings:
        return lambda ax, panel: None
    from cockpit_core.diagnosing.findings import diagnosis_reads
    from cockpit_dashboard.markers import mark_panel

    reads = diagnosis_reads(registry)
    return lambda ax, panel: mark_panel(ax, panel.keys, findings, reads)


def _draw_panel(fig: Any, cell: Any, panel: Panel, data: LogData) -> Any:
    ax = fig.add_subplot(cell)
    _title(ax, panel)
    draw_safely(fig, ax, panel, data, lambda a: _title(a, panel))
    return ax


def check_path(path: str | os.PathLike[str] | None) -> str | None:
    """The picture format of ``path`` (``None`` for no path); a ``ValueError`` if unknown."""
    if path is None:
        return None
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise ValueError(
            f"cannot write a dashboard to '{path}': use a file name ending in "
            + ", ".join(f".{f}" for f in FORMATS)
            + "."
        )
    return suffix


def save(fig: Any, path: str | os.PathLike[str], dpi: int = 100, suffix: str | None = None) -> Path:
    """Save ``fig`` atomically: write a temporary file, then rename it over ``path``.

    A viewer watching the file (live mode) never sees a half-written picture.
    """
    path = Path(path)
    suffix = suffix or check_path(path)
    with atomic_write(path) as out:  # a fresh temporary name: no planted symlink followed
        fig.savefig(out, dpi=dpi, format=suffix, facecolor=fig.get_facecolor())
    return path


def plot(source: Any, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> Path | Any:
    """Render ``source`` (see :func:`render`); return ``path`` if given, else the figure."""
    fig = render(source, path, **kwargs)
    return Path(path) if path is not None else fig
