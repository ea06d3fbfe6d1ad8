"""Which panel of the web view shows what: the layout built from the registered instruments.

Every registered :class:`~cockpit_core.panel.Instrument` with a
:class:`~cockpit_core.panel.Chart` gives a panel (:class:`Layout`): the chart's lines, in
the instrument's topic, ordered as on the dashboard (topic, then the instrument's
``order``). A quantity tracked under a ``label`` gets a panel of its own per label. A
quantity that no chart names, a third-party one without a chart included, gets a generic
panel (its output key as title, topic :data:`OTHER`) with all its scalar fields.
:meth:`Layout.assign` says which panels show a scalar series; :func:`thin` keeps a series
to the points a chart shows. The plotly figures of the panels are made by
:mod:`cockpit_web.panels` and :mod:`cockpit_web.extra_panels`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cockpit_core.panel import TOPICS as DASHBOARD_TOPICS
from cockpit_core.panel import Chart, Each, Instrument, Line, Threshold
from cockpit_core.panel.planning import default_instruments

OTHER = "other"
"""The topic of a quantity's generic panel (a quantity no chart names)."""

BOTTOM = "performance"
"""The dashboard's bottom row: on the page the last section before :data:`OTHER`."""

Drawn = tuple[Line | Each, ...] | None
"""What a panel draws of one quantity (see :class:`~cockpit_core.panel.Chart`)."""


@dataclass(frozen=True)
class WebPanel:
    """A panel of the web view.

    Args:
        id: Stable identifier (the page's element id).
        title: Shown above the chart.
        topic: Section of the page (:attr:`Layout.topics`).
        members: ``{quantity name: what is drawn}``; ``None`` draws every scalar field.
        log_y: Logarithmic y axis (``None``: when the values span more than a factor 20).
        y_title: The y axis' title.
        place: Sort key within the topic (the instrument's ``order`` and name, then the
            label, the kind of panel and the run).
        chart: The chart it comes from (``None`` for a generic panel).

    """

    id: str
    title: str
    topic: str
    members: Mapping[str, Drawn] = field(default_factory=dict)
    log_y: bool | None = False
    y_title: str = ""
    place: tuple[Any, ...] = ()
    chart: Chart | None = None

    def labelled(self, key: str, name: str) -> WebPanel:
        """The panel for quantity ``name`` tracked under the label ``key`` (itself if none)."""
        if key == name:
            return self
        return replace(
            self,
            id=f"{self.id}-{key}",
            title=f"{self.title} [{key}]",
            members={name: self.members.get(name)},
            place=(*self.place[:2], key, *self.place[3:]),
        )


def generic(key: str, name: str) -> WebPanel:
    """The panel of a quantity no chart names: every scalar field, topic :data:`OTHER`."""
    return WebPanel(f"q-{key}", key, OTHER, {name: None}, place=(0, f"q-{key}", "", 0, 0))


def from_chart(instrument: Instrument, chart: Chart) -> WebPanel:
    """The panel of an instrument's chart (defaults from the instrument)."""
    name = chart.name or instrument.name
    return WebPanel(
        id=name,
        title=chart.title or instrument.title,
        topic=instrument.topic,
        members=dict(chart.drawn) if chart.drawn else {chart.heatmap: None},
        log_y=chart.log_y,
        y_title=chart.y_title,
        place=(instrument.order, name, "", 0, 0),
        chart=chart,
    )


class Layout:
    """The web view's panels, from the charts of ``instruments``.

    Args:
        instruments: Registered instruments, in registration order (one whose chart's
            panel id is taken already gets ``-<instrument name>`` appended).

    Attributes:
        panels: One per instrument with a chart, in page order.
        topics: Sections of the page in order: the dashboard's column topics, the plugins'
            own topics (alphabetically), ``performance``, then :data:`OTHER`.
        entries: ``{quantity name: (Each, ...)}``: the arrays the view keeps per step
            (:class:`~cockpit_web.arrays.ArrayStore`).
        thresholds: Every chart's :class:`~cockpit_core.panel.Threshold`, once each.

    """

    def __init__(self, instruments: Iterable[Instrument]):
        panels: dict[str, WebPanel] = {}
        for instrument in instruments:
            if instrument.chart is None:
                continue
            panel = from_chart(instrument, instrument.chart)
            if panel.id in panels:
                panel = replace(panel, id=f"{panel.id}-{instrument.name}")
            panels.setdefault(panel.id, panel)
        own = sorted({p.topic for p in panels.values()} - {*DASHBOARD_TOPICS, OTHER})
        columns = tuple(t for t in DASHBOARD_TOPICS if t != BOTTOM)
        self.topics: tuple[str, ...] = (*columns, *own, BOTTOM, OTHER)
        self.panels: tuple[WebPanel, ...] = tuple(sorted(panels.values(), key=self.sort_key))
        self._drawn: dict[str, list[WebPanel]] = {}
        self._heatmaps: dict[str, list[WebPanel]] = {}
        entries: dict[str, dict[Each, None]] = {}
        thresholds: dict[Threshold, None] = {}
        for panel in self.panels:
            assert panel.chart is not None
            for name, drawn in panel.chart.drawn.items():
                self._drawn.setdefault(name, []).append(panel)
                for item in drawn or ():
                    if isinstance(item, Each):
                        entries.setdefault(name, {})[item] = None
            if panel.chart.heatmap:
                self._heatmaps.setdefault(panel.chart.heatmap, []).append(panel)
            thresholds.update(dict.fromkeys(panel.chart.thresholds))
        self.entries: dict[str, tuple[Each, ...]] = {k: tuple(v) for k, v in entries.items()}
        self.thresholds: tuple[Threshold, ...] = tuple(thresholds)

    @classmethod
    def of(cls, registry: Any = None) -> Layout:
        """The layout of ``registry``'s instruments (default: every installed plugin's)."""
        return cls(default_instruments(None, registry))

    def rank(self, topic: str) -> float:
        """Position of ``topic``'s section (an unknown topic: before :data:`OTHER`)."""
        return self.topics.index(topic) if topic in self.topics else len(self.topics) - 1.5

    def sort_key(self, panel: WebPanel) -> tuple[Any, ...]:
        """Page order: the topic, then the panel's ``place``, then its id."""
        return (self.rank(panel.topic), *panel.place, panel.id)

    def described(self, name: str) -> bool:
        """Whether a chart names quantity ``name`` (else it gets a generic panel)."""
        return name in self._drawn or name in self._heatmaps

    def charts_of(self, name: str) -> list[WebPanel]:
        """The panels whose series name quantity ``name``."""
        return self._drawn.get(name, [])

    def heatmaps_of(self, name: str) -> list[WebPanel]:
        """The panels that show quantity ``name``'s histograms as a heat map."""
        return self._heatmaps.get(name, [])

    def draws_per_param(self, name: str) -> bool:
        """Whether a chart draws quantity ``name``'s ``per_param`` list (with :class:`Each`)."""
        return any(each.field == "per_param" for each in self.entries.get(name, ()))

    def assign(self, tag: str, names: Mapping[str, str]) -> list[tuple[WebPanel, Line | None]]:
        """The panels that show series ``tag`` (``key/field...``), each with its :class:`Line`.

        The line is ``None`` where the panel draws every scalar of the quantity; no panel:
        the series is hidden (a field no chart lists, such as ``alpha/exact``).

        Args:
            tag: A series name from :class:`~cockpit_web.follow.LogFollower`.
            names: ``{output key: quantity name}`` of the run (a ``label`` makes them differ).

        """
        key, _, rest = tag.partition("/")
        name = names.get(key, key)
        if not self.described(name):
            return [(generic(key, name), None)]
        found: list[tuple[WebPanel, Line | None]] = []
        for panel in self.charts_of(name):
            drawn = panel.members[name]
            if drawn is None:
                found.append((panel.labelled(key, name), None))
                continue
            line = next((d for d in drawn if isinstance(d, Line) and d.field == rest), None)
            if line is not None:
                found.append((panel.labelled(key, name), line))
        return found


def default_layout() -> Layout:
    """The layout of every installed plugin's instruments."""
    return Layout.of()


def assign(tag: str, names: Mapping[str, str], layout: Layout | None = None) -> WebPanel | None:
    """The first panel that shows series ``tag``, ``None`` if it is hidden.

    Args:
        tag: A series name (``key/field...``) from :class:`~cockpit_web.follow.LogFollower`.
        names: ``{output key: quantity name}`` of the run.
        layout: Default: :func:`default_layout`.

    """
    found = (layout or default_layout()).assign(tag, names)
    return found[0][0] if found else None


def thin(points: Sequence[tuple[int, Any]], limit: int) -> list[tuple[int, Any]]:
    """At most ``limit`` evenly spaced points, the last one always kept."""
    if len(points) <= limit:
        return list(points)
    stride = -(-len(points) // limit)
    kept = list(points[::stride])
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept
