"""The :class:`Instrument`: one dashboard panel, contributed by a plugin.

Plugins register instruments through the ``register_instruments`` hook (see
``docs/hooks.md`` and ``docs/dashboard.md``). The matplotlib dashboard calls an instrument's
``draw``; a view that draws with another library (the web view of cockpit-web) reads its
:class:`Chart` instead: a declarative line chart of logged fields (:class:`Line`,
:class:`Each`, :class:`Threshold`). This module imports no plotting library, so plugins can
import it at discovery time for free.

Stability: the fields below are part of the plugin protocol (version 1). New fields are
only ever added with defaults; ``draw`` keeps its three positional arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Output = Mapping[int, Mapping[str, Any]]
"""``{step: {quantity_name: value}}`` as the dashboard hands it to ``draw``."""

Draw = Callable[[Any, Output, Mapping[str, Any]], Any]
"""``draw(ax, output, header)``: draw a panel on a matplotlib ``Axes``."""

TOPICS: tuple[str, ...] = ("step size", "gradient", "curvature", "performance")
"""The standard topics, in layout order. ``performance`` is the bottom row; every other
topic (standard or a plugin's own) is a column group."""

_NAME = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")

REDUCTIONS: tuple[str, ...] = ("max", "min", "mean")
"""How :class:`Each` reduces entries that are lists (e.g. one number per attention head)."""


@dataclass(frozen=True)
class Line:
    """One line of a :class:`Chart`: a number in the quantity's logged value.

    Attributes:
        field: Its path in the value, ``field/subfield`` into nested dicts (``total``,
            ``b_simple``, ``nonfinite/nan``): the series the web view and the tracker sinks
            name ``<key>/<field>``.
        error: Path of its standard error in the same value (``se``), drawn as error bars of
            ``± error`` at the steps where both are shown and the error is finite; ``""``:
            none.

    """

    field: str
    error: str = ""

    def __post_init__(self) -> None:
        problems = _path_problems(self.field, "field") + _path_problems(self.error, "error", True)
        if problems:
            raise TypeError(f"Invalid Line {self.field!r}: " + "; ".join(problems) + ".")


@dataclass(frozen=True)
class Each:
    """Lines of a :class:`Chart`: one per entry of an array in the quantity's logged value.

    For per-module, per-parameter and per-layer values: ``Each("rms", names="modules")``
    draws ``activations``' ``{"modules": [...], "rms": [...]}`` as one line per module,
    ``Each("per_param")`` a ``per_param`` list as one line per tracked parameter. Entries
    are matched by name from step to step.

    Attributes:
        field: Path of the array in the value: one number per entry (one list per entry
            with ``reduce``).
        names: Path of the list naming the entries, as long as the array (``modules``);
            ``""``: the tracked parameters' names of the log header (a per-parameter array).
        reduce: ``"max"``, ``"min"`` or ``"mean"``: each entry is a list of numbers (e.g. one
            per attention head) drawn as its largest, smallest or mean value; ``""``: each
            entry is a number.

    """

    field: str
    names: str = ""
    reduce: str = ""

    def __post_init__(self) -> None:
        problems = _path_problems(self.field, "field") + _path_problems(self.names, "names", True)
        if self.reduce not in ("", *REDUCTIONS):
            problems.append(
                f"reduce must be one of {', '.join(map(repr, REDUCTIONS))} or '' (entries are "
                f"numbers), got {self.reduce!r}"
            )
        if problems:
            raise TypeError(f"Invalid Each {self.field!r}: " + "; ".join(problems) + ".")


@dataclass(frozen=True)
class Threshold:
    """A reference line of a :class:`Chart`, computed at each step from a logged quantity.

    Drawn as a dashed step line on the chart's panel, e.g. the SGD stability threshold
    ``2/lr`` that cockpit-curvature computes from ``optimizer_hparams`` for the sharpness.

    Attributes:
        quantity: Name of the quantity whose value it is computed from (any quantity, not
            only the instrument's).
        line: ``line(value) -> (y, name)``: the threshold of a step (``None`` where none
            applies, e.g. for Adam) and the line's name (``"stability threshold 2/lr"``).
            The name returned with the last value names the line, followed by
            `` = <last value>``. An exception counts as a value the view cannot draw.

    """

    quantity: str
    line: Callable[[Any], tuple[float | None, str]]

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.quantity, str) or not _NAME.match(self.quantity):
            problems.append(f"quantity {self.quantity!r} must be a snake_case quantity name")
        if not callable(self.line):
            problems.append("line must be a function line(value) -> (threshold or None, name)")
        if problems:
            raise TypeError(f"Invalid Threshold {self.quantity!r}: " + "; ".join(problems) + ".")


Fields = str | Line | Each | tuple[str | Line | Each, ...] | None
"""What a :class:`Chart`'s ``series`` gives for one quantity (field paths become lines)."""

Drawn = tuple[Line | Each, ...] | None
"""What a :class:`Chart` draws of one quantity: lines, or ``None`` for every number."""


@dataclass(frozen=True)
class Chart:
    """What an instrument's panel shows in a view that does not draw with matplotlib.

    The web view (cockpit-web) draws it as an interactive line chart with a colour per run;
    the matplotlib dashboard ignores it (it calls ``draw``). A quantity that no registered
    chart names gets a generic panel of every number it logs there.

    Attributes:
        series: ``{quantity name: what is drawn}``. What is drawn is a tuple of field paths
            (``"total"``, short for ``Line("total")``), :class:`Line` and :class:`Each`, or
            ``None``: every number in the value (the value itself when it is a number).
            The quantities need not be the instrument's. A quantity named in a chart shows
            only what charts list of it (``alpha``'s ``alpha``, not its ``exact`` flag); one
            tracked under a ``label`` gets a panel of its own per label.
        title: Title of the panel (default: the instrument's).
        name: Id of the panel, snake_case (default: the instrument's name).
        log_y: ``True``: logarithmic y axis; ``False``: linear; ``None``: logarithmic when
            every value shown is positive and the largest is over 20 times the smallest.
        y_title: Title of the y axis.
        thresholds: Reference lines computed from logged quantities (:class:`Threshold`).
        heatmap: A quantity whose 1-D histogram value (``{"hist": counts, "edges": ...}``)
            the panel shows as a heat map over steps instead of lines (steps on x, bins on
            y, colour ``log10(1 + count)``), one per run; ``series`` stays empty.

    Raises:
        TypeError: A field is not of the kind described, naming each.

    """

    series: Mapping[str, Fields] = field(default_factory=dict, hash=False)
    title: str = ""
    name: str = ""
    log_y: bool | None = False
    y_title: str = ""
    thresholds: tuple[Threshold, ...] = ()
    heatmap: str = ""

    def __post_init__(self) -> None:
        problems: list[str] = []
        object.__setattr__(self, "series", _series(self.series, problems))
        if isinstance(self.thresholds, Threshold):
            object.__setattr__(self, "thresholds", (self.thresholds,))
        elif isinstance(self.thresholds, list | tuple):
            object.__setattr__(self, "thresholds", tuple(self.thresholds))
        if not isinstance(self.thresholds, tuple) or not all(
            isinstance(t, Threshold) for t in self.thresholds
        ):
            problems.append("thresholds must be a tuple of cockpit_core.panel.Threshold")
        for attribute in ("title", "y_title"):
            if not isinstance(getattr(self, attribute), str):
                problems.append(f"{attribute} must be a string")
        if not isinstance(self.name, str) or (self.name and not _NAME.match(self.name)):
            problems.append(f"name {self.name!r} must be '' or snake_case, e.g. 'grad_norm'")
        if self.log_y not in (None, True, False):
            problems.append(f"log_y must be True, False or None (automatic), got {self.log_y!r}")
        if not isinstance(self.heatmap, str) or (self.heatmap and not _NAME.match(self.heatmap)):
            problems.append(f"heatmap {self.heatmap!r} must be '' or a snake_case quantity name")
        elif not self.series and not self.heatmap and not problems:
            problems.append("give series ({quantity name: fields}) or a heatmap quantity")
        elif self.series and self.heatmap:
            problems.append("give series or a heatmap quantity, not both (a panel each)")
        if problems:
            called = f" {self.name or self.title!r}" if self.name or self.title else ""
            raise TypeError(f"Invalid Chart{called}: " + "; ".join(problems) + ".")

    @property
    def drawn(self) -> Mapping[str, Drawn]:
        """``series`` as validated: each field path made a :class:`Line`, one item a tuple."""
        return self.series  # type: ignore[return-value]  # normalised in __post_init__

    @property
    def quantities(self) -> tuple[str, ...]:
        """The quantities it draws: those of ``series``, then ``heatmap``."""
        heatmap = (self.heatmap,) if self.heatmap and self.heatmap not in self.series else ()
        return tuple(self.series) + heatmap


@dataclass(frozen=True)
class Instrument:
    """A dashboard panel.

    Attributes:
        name: Unique snake_case id of the panel (conventionally the quantity name, or the
            quantity name plus a suffix such as ``grad_hist_1d_time``).
        title: Panel title shown above it (also how tests find a panel).
        topic: Group the panel is shown in: one of :data:`TOPICS` or the plugin's own topic
            (lower-case words), which gets a column group of its own.
        quantities: Quantity names that must all have been tracked for the panel to be
            drawn.
        draw: ``draw(ax, output, header)``. ``ax`` is a matplotlib ``Axes`` whose title is
            already set; ``output`` is ``{step: {name: value}}`` restricted to the panel's
            ``quantities`` and ``optional`` quantities that were tracked, keyed by quantity
            *name* (even when the user gave a ``label``), with only the steps where one of
            them has a value; ``header`` is the log header (``{}`` when unknown). ``draw``
            may add twin or inset axes; whatever it returns is ignored. An exception is
            shown inside the panel, it never breaks the dashboard.
        optional: Quantities the panel also shows when tracked. A panel with no required
            ``quantities`` is drawn when at least one optional quantity was tracked.
        order: Position within the topic (smaller first).
        size: Relative extent: height within a column group, width within the
            ``performance`` row.
        min_steps: Steps with values a required quantity needs before the panel is drawn.
        description: One line for ``docs``/``cockpit`` listings: what the panel shows.
        available: Optional ``available(output) -> bool`` on the same restricted output as
            ``draw``: a further condition on the data (e.g. per-parameter histograms were
            kept). When it returns ``False`` the panel is skipped and listed as such.
        overlay: How a run comparison (``render([run_a, run_b, ...])``) draws the panel:
            ``True`` calls ``draw`` once per run on the same axes and re-colours what each
            call adds in that run's colour; ``False`` draws one small panel per run side by
            side (heat maps, 2-D histograms, insets); ``None`` (the default) decides from
            the first run's drawing: side by side if it adds a colour-mapped mesh or image
            or inset axes, overlaid otherwise. See ``docs/dashboard.md#comparing-runs``.
        chart: The panel in views that do not draw with matplotlib (the web view of
            cockpit-web): a :class:`Chart`, a plotting-library-free description of the
            lines drawn (fields of logged values, one line per module or parameter, error
            bars, thresholds). ``None`` (the default): the view shows the instrument's
            quantities in generic panels, unless another instrument's chart names them. See
            ``docs/dashboard.md#web-view``.

    """

    name: str
    title: str
    topic: str
    quantities: tuple[str, ...]
    draw: Draw
    optional: tuple[str, ...] = ()
    order: int = 50
    size: float = 1.0
    min_steps: int = 1
    description: str = ""
    available: Callable[[Output], bool] | None = None
    overlay: bool | None = None
    chart: Chart | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "quantities", _names(self.quantities, "quantities"))
        object.__setattr__(self, "optional", _names(self.optional, "optional"))
        problems = []
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            problems.append(f"name {self.name!r} must be snake_case, e.g. 'grad_norm'")
        if not isinstance(self.title, str) or not self.title.strip():
            problems.append("title must be a non-empty string")
        if not isinstance(self.topic, str) or not self.topic.strip():
            problems.append(f"topic must be a non-empty string such as {TOPICS[0]!r}")
        elif self.topic != self.topic.lower():
            problems.append(f"topic {self.topic!r} must be lower-case, e.g. {TOPICS[1]!r}")
        if not callable(self.draw):
            problems.append("draw must be a function draw(ax, output, header)")
        if self.available is not None and not callable(self.available):
            problems.append("available must be None or a function available(output) -> bool")
        if self.overlay not in (None, True, False):
            problems.append(f"overlay must be None, True or False, got {self.overlay!r}")
        if self.chart is not None and not isinstance(self.chart, Chart):
            problems.append(
                f"chart must be None or a cockpit_core.panel.Chart, got {type(self.chart).__name__}"
            )
        if not self.quantities and not self.optional:
            problems.append("give at least one quantity name in quantities or optional")
        if not isinstance(self.size, (int, float)) or self.size <= 0:
            problems.append(f"size must be a positive number, got {self.size!r}")
        if not isinstance(self.min_steps, int) or self.min_steps < 1:
            problems.append(f"min_steps must be an integer >= 1, got {self.min_steps!r}")
        if problems:
            raise TypeError(f"Invalid Instrument {self.name!r}: " + "; ".join(problems) + ".")

    @property
    def all_quantities(self) -> tuple[str, ...]:
        """Required, then optional quantity names."""
        return self.quantities + tuple(q for q in self.optional if q not in self.quantities)


def _names(value: Any, field: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    try:
        names = tuple(value)
    except TypeError:
        raise TypeError(f"Instrument.{field} must be a tuple of quantity names.") from None
    for n in names:
        if not isinstance(n, str) or not _NAME.match(n):
            raise TypeError(f"Instrument.{field}: {n!r} is not a snake_case quantity name.")
    return names


def _path_problems(path: Any, name: str, optional: bool = False) -> list[str]:
    """What is wrong with a field path (``field/subfield``): ``[]`` when nothing."""
    if not isinstance(path, str):
        return [f"{name} must be a field path such as 'total' or 'nonfinite/nan', got {path!r}"]
    if optional and not path:
        return []
    if not path or any(not part.strip() or part != part.strip() for part in path.split("/")):
        return [f"{name} {path!r} is not a field path such as 'total' or 'nonfinite/nan'"]
    return []


def _series(value: Any, problems: list[str]) -> dict[str, Drawn]:
    """``series`` with each field path made a :class:`Line` (problems appended)."""
    if not isinstance(value, Mapping):
        problems.append(
            "series must be a dict {quantity name: fields}, e.g. {'grad_norm': ('total',)}, "
            f"got {type(value).__name__}"
        )
        return {}
    series: dict[str, Drawn] = {}
    for name, drawn in value.items():
        if not isinstance(name, str) or not _NAME.match(name):
            problems.append(f"series: {name!r} is not a snake_case quantity name")
            continue
        if drawn is None:
            series[name] = None
            continue
        if isinstance(drawn, str | Line | Each):
            drawn = (drawn,)
        if not isinstance(drawn, tuple | list) or not drawn:
            problems.append(
                f"series[{name!r}] must be a tuple of fields (paths such as 'total', Line or "
                f"Each) or None (every number), got {drawn!r}"
            )
            continue
        lines: list[Line | Each] = []
        for i, item in enumerate(drawn):
            if isinstance(item, str):
                found = _path_problems(item, f"series[{name!r}][{i}]")
                problems.extend(found)
                if not found:
                    lines.append(Line(item))
            elif isinstance(item, Line | Each):
                lines.append(item)
            else:
                problems.append(
                    f"series[{name!r}][{i}]: {item!r} is not a field path (a string such as "
                    "'total'), a Line or an Each"
                )
        series[name] = tuple(lines)
    return series
