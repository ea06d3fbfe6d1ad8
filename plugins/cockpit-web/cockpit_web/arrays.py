"""The non-scalar values a web view keeps while it follows a log, bounded in size.

:class:`ArrayStore` takes the same ``header`` and ``values`` records as the follower's scalar
series and keeps, per run:

* per-parameter series: the ``per_param`` list of every quantity that logs one (one number
  per tracked parameter: ``grad_norm``, ``distance``, ``update_size``, ``hess_trace``,
  ``tic_diag``, ...), while the run tracks at most :data:`PER_PARAM_MAX` parameters, at
  most ``2 * PER_PARAM_STEPS + 1`` steps of each (:class:`Decimated`);
* the ``grad_hist_1d`` histograms (counts and edges), at most ``2 * columns + 1`` of each
  however long the run (:class:`HistogramTrack`);
* the SGD stability threshold of each logged ``optimizer_hparams`` value, computed with
  cockpit-curvature's :func:`cockpit_curvature.stability.threshold` (a dependency).

Each record costs a few list copies; nothing here touches the training process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from cockpit_curvature.stability import threshold

PER_PARAM_MAX = 64
"""Per-parameter series are kept only for runs tracking at most this many parameters."""

PER_PARAM_STEPS = 2000
"""Steps of a per-parameter series shown at most (:class:`Decimated`: twice that kept)."""

HEATMAP_COLUMNS = 200
"""Steps (columns) of a gradient histogram heat map at most (evenly chosen, last kept)."""

HISTOGRAM = "grad_hist_1d"
SHARPNESS = "hess_max_ev"
HPARAMS = "optimizer_hparams"


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


def plain_formula(formula: str) -> str:
    r"""A threshold formula in plain text: ``$2(1+\beta)/\eta$`` -> ``2(1+momentum)/lr``."""
    text = formula.strip("$").replace(r"\eta", "lr").replace(r"\beta", "momentum")
    return text.replace("(1+momentum)", "(1 + momentum)").replace("-wd", " - weight_decay")


class ArrayStore:
    """Per-parameter series, gradient histograms and stability thresholds of one log.

    Args:
        columns: Columns of the histogram heat map at most (:class:`HistogramTrack`).

    Attributes:
        param_names: The tracked parameters' names, from the header.
        per_param: ``{output key: Decimated}`` of ``[value per parameter]`` by step
            (non-finite: ``None``).
        histograms: ``{output key: HistogramTrack}`` of the ``grad_hist_1d`` quantities.
        thresholds: ``{step: threshold}`` of ``optimizer_hparams`` (``None``: none applies,
            e.g. for Adam).
        formula: The last drawn threshold's formula in plain text (``2/lr``, ...).

    """

    def __init__(self, columns: int = HEATMAP_COLUMNS):
        self.columns = columns
        self.param_names: list[str] = []
        self.per_param: dict[str, Decimated] = {}
        self.histograms: dict[str, HistogramTrack] = {}
        self.thresholds: dict[int, float | None] = {}
        self.formula = ""

    def header(self, record: Mapping[str, Any]) -> None:
        """Take the parameter names of a ``header`` record."""
        params = record.get("params") or []
        self.param_names = [str(p.get("name", i)) for i, p in enumerate(params)]

    def drop(self, step: int) -> None:
        """Forget what ``step`` held: a later run of the log records it again (``read_run``)."""
        for track in (*self.per_param.values(), *self.histograms.values()):
            track.drop(step)
        self.thresholds.pop(step, None)

    def values(self, step: int, values: Mapping[str, Any], names: Mapping[str, str]) -> None:
        """Take one ``values`` record: ``{output key: value}``, ``names`` as the follower's."""
        for key, value in values.items():
            name = names.get(key, key)
            if name == HPARAMS:
                self._hparams(step, value)
            if not isinstance(value, Mapping):
                continue
            if name == HISTOGRAM:
                self._histogram(str(key), step, value)
            elif "per_param" in value:
                self._per_param(str(key), step, value["per_param"])

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
        counts, edges = value.get("hist"), value.get("edges")
        if counts is None or edges is None or np.ndim(counts) != 1 or np.ndim(edges) != 1:
            return
        counts = np.asarray(counts, dtype=np.float64)
        edges = np.asarray(edges, dtype=np.float64)
        if edges.size != counts.size + 1 or not np.isfinite(edges).all():
            return
        track = self.histograms.setdefault(key, HistogramTrack(self.columns))
        track.add(step, (counts, edges))

    def _hparams(self, step: int, value: Any) -> None:
        found, formula = threshold(value)
        shown = _finite(found)
        self.thresholds[step] = shown
        if shown is not None:
            self.formula = plain_formula(formula)
