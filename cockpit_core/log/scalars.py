"""Which tags (scalar keys) a record becomes in an experiment tracker: one bounded mapping.

The sinks for TensorBoard, Weights & Biases and MLflow all name their series with
:class:`TagMap`, so a value has the same tag in each. With ``prefix`` ``cockpit`` and a
quantity whose output key is ``K``:

* a number (``loss``) -> scalar ``cockpit/K``; booleans as 0/1 (``hess_max_ev``'s
  ``converged``, ``alpha``'s ``exact``);
* the ``time`` quantity (a Unix timestamp, which float32 cannot resolve) -> scalar
  ``cockpit/K`` with the seconds since the first tracked step, computed in float64;
* a dict -> scalar ``cockpit/K/<field>`` for each number in it, nested dicts as
  ``cockpit/K/<field>/<subfield>`` (``grad_norm/total``, ``hess_trace/std_error``,
  ``alpha/alpha``, ``grad_hist_1d/nonfinite/nan``);
* per-parameter fields (``per_param`` and ``<name>_per_param``, one number per tracked
  parameter) -> scalars ``cockpit/K/<param>`` and ``cockpit/K/<name>/<param>``, only while
  the run tracks at most ``per_param_max`` parameters (a parameter named like a field of the
  same dict, e.g. ``total``, goes to ``cockpit/K/per_param/<param>``);
* a 1-D histogram (``{"hist": counts[bins], "edges": [bins + 1]}``, ``grad_hist_1d``) ->
  a :class:`Histogram` ``cockpit/K`` with the counts and edges (no re-binning), and its
  per-parameter counts ``[P, bins]`` -> histograms ``cockpit/K/<param>`` (bounded as above);
* everything else is not written: other arrays and lists (``alpha``'s fit inputs,
  ``hess_max_ev``'s ``eigenvalues``, ``parameters``), strings, 2-D histograms
  (``grad_hist_2d``: only its scalar fields). The log keeps every value;
* metrics of ``cp.log(step, name=value)`` (``metrics`` records) -> scalars
  ``cockpit/metrics/<name>`` (:meth:`TagMap.metrics`).

A sink feeds the ``header`` and ``quantity_added`` records to :meth:`TagMap.header` and
:meth:`TagMap.quantity_added`, and turns each ``values`` record into events with
:meth:`TagMap.values`. Tags may hold any character of a quantity key or parameter name; a
tracker with stricter key rules maps them further (MLflow's sink does).
:func:`header_summary` gives the ``header`` record as a tracker's run configuration, its
size independent of the model's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TIME_QUANTITY = "time"


@dataclass(frozen=True)
class Scalar:
    """A scalar event: ``tag`` and its ``value``."""

    tag: str
    value: float


@dataclass(frozen=True)
class Histogram:
    """A histogram event: bin ``counts`` and their ``edges`` (one more than the counts)."""

    tag: str
    counts: np.ndarray
    edges: np.ndarray


def join(*parts: str) -> str:
    """Join tag parts with ``/``, leaving out empty ones (an empty prefix)."""
    return "/".join(p for p in parts if p)


def real_number(value: Any) -> float | None:
    """The value as a float if it is a real number (bools as 0/1), else ``None``."""
    if isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)):
        try:
            return float(value)
        except OverflowError:  # an int beyond the float range
            return math.inf if value > 0 else -math.inf
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf":
        return float(value)
    return None


def _per_param_field(field: str) -> str | None:
    """For ``per_param`` -> ``""``, ``std_error_per_param`` -> ``"std_error"``, else ``None``."""
    if field == "per_param":
        return ""
    if field.endswith("_per_param") and len(field) > len("_per_param"):
        return field[: -len("_per_param")]
    return None


def _is_hist_1d(value: Mapping[str, Any]) -> bool:
    counts, edges = value.get("hist"), value.get("edges")
    if counts is None or edges is None or np.ndim(counts) != 1 or np.ndim(edges) != 1:
        return False
    return bool(np.shape(edges)[0] == np.shape(counts)[0] + 1)


class TagMap:
    """Turns cockpit records into scalar and histogram events, following the mapping above.

    Args:
        prefix: First part of every tag (``""`` for none).
        per_param: Write per-parameter scalars and histograms at all.
        per_param_max: Write them only while the run tracks at most this many parameters.
        histograms: Yield 1-D histograms.

    """

    def __init__(
        self,
        prefix: str = "cockpit",
        per_param: bool = True,
        per_param_max: int = 32,
        histograms: bool = True,
    ):
        self.prefix = prefix.strip("/")
        self.per_param = per_param
        self.per_param_max = per_param_max
        self.histograms = histograms
        self.param_names: list[str] = []
        self.time_keys: set[str] = set()
        self._time_origin: dict[str, float] = {}

    def tag(self, *parts: str) -> str:
        """The full tag of ``parts`` (prefix first)."""
        return join(self.prefix, *parts)

    def header(self, record: Mapping[str, Any]) -> None:
        """Take the parameter names and which output keys hold the ``time`` quantity."""
        self.param_names = [str(p.get("name")) for p in record.get("params") or []]
        for quantity in record.get("quantities") or []:
            self.quantity_added(quantity)

    def quantity_added(self, quantity: Mapping[str, Any]) -> None:
        """Note a quantity tracked from now on (``cp.add``)."""
        if quantity.get("name") == TIME_QUANTITY:
            self.time_keys.add(str(quantity.get("key", TIME_QUANTITY)))

    @property
    def writes_per_param(self) -> bool:
        """Whether per-parameter tags are written for this run."""
        return self.per_param and len(self.param_names) <= self.per_param_max

    def values(self, values: Mapping[str, Any]) -> Iterator[Scalar | Histogram]:
        """The events of one ``values`` record, ``{key: value}``."""
        for key, value in values.items():
            key = str(key)
            seconds = real_number(value)
            if key in self.time_keys and seconds is not None and math.isfinite(seconds):
                origin = self._time_origin.setdefault(key, seconds)
                yield Scalar(self.tag(key), seconds - origin)  # float64 difference
            else:
                yield from self._value(self.tag(key), value)

    def metrics(self, metrics: Mapping[str, Any]) -> Iterator[Scalar]:
        """The scalars of one ``metrics`` record's ``{name: value}``: ``<prefix>/metrics/<name>``.

        Only real numbers (not booleans) become scalars.
        """
        for name, value in metrics.items():
            number = None if isinstance(value, (bool, np.bool_)) else real_number(value)
            if number is not None:
                yield Scalar(self.tag("metrics", str(name)), number)

    def _value(self, tag: str, value: Any) -> Iterator[Scalar | Histogram]:
        number = real_number(value)
        if number is not None:
            yield Scalar(tag, number)
        elif isinstance(value, Mapping):
            yield from self._dict(tag, value)

    def _dict(self, tag: str, value: Mapping[str, Any]) -> Iterator[Scalar | Histogram]:
        skip: set[str] = set()
        if "hist" in value:
            skip = {"hist", "edges", "x_edges", "y_edges", "per_param"}
            if _is_hist_1d(value):
                yield from self._hist_1d(tag, value)
        fields = {str(f) for f in value}
        for field, sub in value.items():
            field = str(field)
            if field in skip:
                continue
            name = _per_param_field(field)
            if name is None:
                yield from self._value(join(tag, field), sub)
            elif self.writes_per_param:
                yield from self._per_param(join(tag, name), sub, fields)

    def _names(self, count: int, fields: set[str], tag: str) -> list[str] | None:
        """The parameter name of each row, ``None`` if ``count`` rows are not one per parameter."""
        names = self.param_names or [f"param_{i}" for i in range(count)]
        if count != len(names) or count > self.per_param_max:
            return None
        return [join(tag, "per_param", n) if n in fields else join(tag, n) for n in names]

    def _per_param(self, tag: str, values: Any, fields: set[str]) -> Iterator[Scalar]:
        if not isinstance(values, (np.ndarray, Sequence)) or isinstance(values, str):
            return
        numbers = [real_number(v) for v in values]
        tags = self._names(len(numbers), fields, tag)
        if tags is None or any(v is None for v in numbers):
            return
        for t, v in zip(tags, numbers):
            yield Scalar(t, v)  # type: ignore[arg-type]

    def _hist_1d(self, tag: str, value: Mapping[str, Any]) -> Iterator[Histogram]:
        if not self.histograms:
            return
        edges = np.asarray(value["edges"], dtype=np.float64)
        if not np.isfinite(edges).all():
            return
        yield Histogram(tag, np.asarray(value["hist"], dtype=np.float64), edges)
        per = value.get("per_param")
        if not self.writes_per_param or per is None or np.ndim(per) != 2:
            return
        per = np.asarray(per, dtype=np.float64)
        tags = self._names(per.shape[0], {str(f) for f in value}, tag)
        if tags is not None and per.shape[1] == edges.size - 1:
            for t, row in zip(tags, per):
                yield Histogram(t, row, edges)


def quantity_entries(quantities: Any) -> dict[str, dict[str, Any]]:
    """``{key: options}`` of the header's quantity entries (name, every, ... without key)."""
    entries: dict[str, dict[str, Any]] = {}
    for entry in quantities or []:
        if isinstance(entry, Mapping):
            key = str(entry.get("key", entry.get("name")))
            entries[key] = {str(k): v for k, v in entry.items() if k != "key"}
    return entries


def header_summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """The header without its per-parameter list, which grows with the model.

    ``params`` (one entry per parameter) becomes ``params`` (their number) and ``numel``
    (their elements in all); ``quantities`` becomes ``{key: options}``; every other field
    (versions, plugins, settings) is kept as it is.
    """
    summary: dict[str, Any] = {}
    for field, value in record.items():
        if field == "kind":
            continue
        if field == "params":
            params = [p for p in value or [] if isinstance(p, Mapping)]
            summary["params"] = len(params)
            summary["numel"] = sum(int(p.get("numel") or 0) for p in params)
        elif field == "quantities":
            summary["quantities"] = quantity_entries(value)
        else:
            summary[str(field)] = value
    return summary
