"""The non-scalar values a web view keeps while it follows a log, bounded in size.

:class:`ArrayStore` takes the same ``header`` and ``values`` records as the follower's scalar
series and keeps, per run:

* the arrays the charts draw one line per entry of (:class:`~cockpit_core.panel.Each`:
  ``activations``' per-module ``rms``, ``update_ratio``'s ``per_param``, ...), for arrays
  of at most :data:`ENTRIES_MAX` entries, at most ``2 * PER_PARAM_STEPS + 1`` steps of each
  (:class:`Decimated`);
* per-parameter series: the ``per_param`` list of every other quantity that logs one (one
  number per tracked parameter: ``grad_norm``, ``distance``, ``hess_trace``, ...), while the
  run tracks at most :data:`PER_PARAM_MAX` parameters, bounded the same way;
* the 1-D histograms (``{"hist": counts, "edges": ...}``: ``grad_hist_1d``), at most
  ``2 * columns + 1`` of each however long the run (:class:`HistogramTrack`);
* the charts' thresholds (:class:`~cockpit_core.panel.Threshold`, e.g. the SGD stability
  threshold from ``optimizer_hparams``), computed from each value of their quantity.

Each record costs a few list copies; nothing here touches the training process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cockpit_core.panel import Each, Threshold

PER_PARAM_MAX = 64
"""Per-parameter series are kept only for runs tracking at most this many parameters."""

ENTRIES_MAX = 128
"""Arrays drawn one line per entry (:class:`~cockpit_core.panel.Each`) are kept up to this
many entries."""

PER_PARAM_STEPS = 2000
"""Steps of a per-parameter or per-entry series shown at most (:class:`Decimated`: twice
that kept)."""

HEATMAP_COLUMNS = 200
"""Steps (columns) of a gradient histogram heat map at most (evenly chosen, last kept)."""

_REDUCE: dict[str, Callable[[np.ndarray], Any]] = {"max": np.max, "min": np.min, "mean": np.mean}


class Decimated:
    """Values by step, decimated on arrival so that at most ``2 * limit + 1`` are kept.

    Every ``stride``-th value to arrive is kept; when more than ``2 * limit`` are kept,
    every other one is dropped and the stride doubles, so the kept ones stay evenly spaced
    (by arrival) however long the run. The latest value is always kept as well.

    Args:
        limit: Values shown at most (half the kept ones).

    """

    def __init__(self, limit: int):
        self.limit = max(int(limit), 1)
        self.stride = 1
        self.seen = 0
        self.kept: dict[int, Any] = {}
        self.latest: tuple[int, Any] | None = None

    def add(self, step: int, value: Any) -> None:
        """Take the value of ``step`` (a later one of the same step replaces it)."""
        if self.seen % self.stride == 0 or step in self.kept:
            self.kept[step] = value
        self.seen += 1
        self.latest = (step, value)
        if len(self.kept) > 2 * self.limit:
            self.kept = {s: self.kept[s] for s in sorted(self.kept)[::2]}
            self.stride *= 2

    def drop(self, step: int) -> None:
        """Forget the value of ``step`` (a later run records the step again)."""
        self.kept.pop(step, None)
        if self.latest is not None and self.latest[0] == step:
            self.latest = None

    def items(self) -> list[tuple[int, Any]]:
        """``(step, value)`` of every kept value and the latest, by step."""
        found = dict(self.kept)
        if self.latest is not None:
            found[self.latest[0]] = self.latest[1]
        return sorted(found.items())


class HistogramTrack(Decimated):
    """The 1-D histograms (``(counts, edges)`` by step) of one quantity, decimated.

    Args:
        columns: The heat map's columns at most.

    """

    def __init__(self, columns: int = HEATMAP_COLUMNS):
        super().__init__(columns)

    @property
    def columns(self) -> int:
        """The heat map's columns at most."""
        return self.limit

    def histograms(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """``(step, counts, edges)`` of at most ``columns`` steps, evenly chosen, last kept."""
        found = self.items()
        if len(found) > self.columns:
            index = np.round(np.linspace(0, len(found) - 1, self.columns)).astype(int)
            found = [found[i] for i in np.unique(index)]
        return [(step, counts, edges) for step, (counts, edges) in found]


def _finite(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def at(value: Any, path: str) -> Any:
    """The entry of ``value`` at ``path`` (``field/subfield``), ``None`` if there is none."""
    for part in path.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def is_histogram(value: Mapping[str, Any]) -> bool:
    """Whether a value is a 1-D histogram: ``hist`` counts and one more ``edges``."""
    counts, edges = value.get("hist"), value.get("edges")
    if counts is None or edges is None or np.ndim(counts) != 1 or np.ndim(edges) != 1:
        return False
    return bool(np.shape(edges)[0] == np.shape(counts)[0] + 1)


def entry_row(value: Any, each: Each) -> np.ndarray | None:
    """One number per entry of ``each.field`` in ``value`` (float64, NaN if not finite).

    ``None`` if the value has no such array.

    Raises:
        ValueError: The array holds lists and ``each`` has no ``reduce``, or an entry
            cannot be reduced.

    """
    found = at(value, each.field)
    if found is None or isinstance(found, str | bytes) or np.ndim(found) == 0:
        return None
    if each.reduce:
        reduce = _REDUCE[each.reduce]
        row = np.asarray([reduce(np.asarray(e, dtype=np.float64)) for e in found])
    else:
        row = np.asarray(found, dtype=np.float64)
        if row.ndim != 1:
            raise ValueError(f"{each.field!r} holds lists: the chart's Each needs a reduce")
    return np.where(np.isfinite(row), row, np.nan)


class ArrayStore:
    """Arrays, per-parameter series, histograms and thresholds of one log.

    Args:
        columns: Columns of the histogram heat map at most (:class:`HistogramTrack`).
        entries: ``{quantity name: (Each, ...)}``: the arrays the charts draw a line per
            entry of (:attr:`cockpit_web.panel.Layout.entries`).
        thresholds: The charts' thresholds (:attr:`cockpit_web.panel.Layout.thresholds`).

    Attributes:
        param_names: The tracked parameters' names, from the header.
        entries: ``{(output key, Each): Decimated}`` of ``(entry names or None, values)`` by
            step (``None``: the header's parameter names; values float64, NaN if not finite).
        per_param: ``{output key: Decimated}`` of ``[value per parameter]`` by step
            (non-finite: ``None``) of the quantities whose ``per_param`` no chart draws.
        histograms: ``{output key: HistogramTrack}`` of the 1-D histogram quantities.
        thresholds: ``{step: (value or None per threshold)}`` of the steps that logged a
            threshold's quantity, in the order of ``threshold_specs``.
        threshold_specs: The thresholds, in that order.
        threshold_names: The name of each threshold's last value (``""`` before one).

    """

    def __init__(
        self,
        columns: int = HEATMAP_COLUMNS,
        entries: Mapping[str, Sequence[Each]] | None = None,
        thresholds: Sequence[Threshold] = (),
    ):
        self.columns = columns
        self.param_names: list[str] = []
        self.wanted = {name: tuple(found) for name, found in (entries or {}).items()}
        self.entries: dict[tuple[str, Each], Decimated] = {}
        self.per_param: dict[str, Decimated] = {}
        self.histograms: dict[str, HistogramTrack] = {}
        self.threshold_specs = tuple(thresholds)
        self.threshold_names = [""] * len(self.threshold_specs)
        self.thresholds: dict[int, tuple[float | None, ...]] = {}
        self._sources = {t.quantity for t in self.threshold_specs}
        self._names: tuple[str, ...] | None = None  # the last entry names kept (shared)

    def keeps(self, name: str) -> bool:
        """Whether a value of quantity ``name`` that is not a dict matters here."""
        return name in self._sources

    def header(self, record: Mapping[str, Any]) -> None:
        """Take the parameter names of a ``header`` record."""
        params = record.get("params") or []
        self.param_names = [str(p.get("name", i)) for i, p in enumerate(params)]

    def drop(self, step: int) -> None:
        """Forget what ``step`` held: a later run of the log records it again (``read_run``)."""
        tracks = (*self.entries.values(), *self.per_param.values(), *self.histograms.values())
        for track in tracks:
            track.drop(step)
        self.thresholds.pop(step, None)

    def values(self, step: int, values: Mapping[str, Any], names: Mapping[str, str]) -> None:
        """Take one ``values`` record: ``{output key: value}``, ``names`` as the follower's."""
        for key, value in values.items():
            name = names.get(key, key)
            if name in self._sources:
                self._threshold(step, name, value)
            if not isinstance(value, Mapping):
                continue
            wanted = self.wanted.get(name, ())
            for each in wanted:
                self._entries(str(key), each, step, value)
            if is_histogram(value):
                self._histogram(str(key), step, value)
            elif "per_param" in value and not any(e.field == "per_param" for e in wanted):
                self._per_param(str(key), step, value["per_param"])

    def _entries(self, key: str, each: Each, step: int, value: Mapping[str, Any]) -> None:
        row = entry_row(value, each)
        if row is None or not 0 < row.size <= ENTRIES_MAX:
            return
        names: tuple[str, ...] | None = None
        if each.names:
            listed = at(value, each.names)
            if listed is None or isinstance(listed, str) or len(listed) != row.size:
                raise ValueError(f"{each.names!r} does not name each entry of {each.field!r}")
            names = tuple(str(n) for n in listed)
            if names == self._names:
                names = self._names  # one tuple for the steps of unchanged entries
            self._names = names
        elif self.param_names and row.size != len(self.param_names):
            return  # not one value per parameter
        self.entries.setdefault((key, each), Decimated(PER_PARAM_STEPS)).add(step, (names, row))

    def _per_param(self, key: str, step: int, values: Any) -> None:
        if np.ndim(values) != 1:
            return
        count = np.shape(values)[0]
        known = len(self.param_names)
        if count == 0 or count > PER_PARAM_MAX or (known and count != known):
            return
        try:
            row = [_finite(v) for v in values]
        except (TypeError, ValueError):
            return
        self.per_param.setdefault(key, Decimated(PER_PARAM_STEPS)).add(step, row)

    def _histogram(self, key: str, step: int, value: Mapping[str, Any]) -> None:
        counts = np.asarray(value["hist"], dtype=np.float64)
        edges = np.asarray(value["edges"], dtype=np.float64)
        if not np.isfinite(edges).all():
            return
        track = self.histograms.setdefault(key, HistogramTrack(self.columns))
        track.add(step, (counts, edges))

    def _threshold(self, step: int, name: str, value: Any) -> None:
        row = list(self.thresholds.get(step, (None,) * len(self.threshold_specs)))
        for i, spec in enumerate(self.threshold_specs):
            if spec.quantity != name:
                continue
            found, label = spec.line(value)
            row[i] = None if found is None else _finite(found)
            if row[i] is not None:
                self.threshold_names[i] = str(label)
        self.thresholds[step] = tuple(row)
