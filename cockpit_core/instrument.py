"""The :class:`Instrument`: one dashboard panel, contributed by a plugin.

Plugins register instruments through the ``register_instruments`` hook (see
``docs/hooks.md`` and ``docs/dashboard.md``). This module imports no plotting library, so
plugins can import it at discovery time for free.

Stability: the fields below are part of the plugin protocol (version 1). New fields are
only ever added with defaults; ``draw`` keeps its three positional arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Output = Mapping[int, Mapping[str, Any]]
"""``{step: {quantity_name: value}}`` as the dashboard hands it to ``draw``."""

Draw = Callable[[Any, Output, Mapping[str, Any]], Any]
"""``draw(ax, output, header)``: draw a panel on a matplotlib ``Axes``."""

TOPICS: tuple[str, ...] = ("step size", "gradient", "curvature", "performance")
"""The standard topics, in layout order. ``performance`` is the bottom row; every other
topic (standard or a plugin's own) is a column group."""

_NAME = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")


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
