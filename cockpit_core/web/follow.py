"""Following one log as it grows: its scalar series, read incrementally.

A :class:`LogFollower` remembers how far it has read a JSON Lines log and, on each
:meth:`~LogFollower.poll`, decodes only the complete lines written since, with the very
decoder and shape checks of :func:`cockpit_core.log.read_run`
(:func:`cockpit_core.log.read.decode_record`). A line that is damaged or holds a record of
the wrong shape (a ``finding`` whose ``first_step`` is a string, a header whose
``quantities`` is a number, ...) is skipped and counted, and the page says so (``"2
records skipped: line 7: ..."``); the rest is shown. The records are folded by the same
function as :func:`~cockpit_core.log.read_run`'s (:func:`cockpit_core.log.data.merge_runs`),
so a log holding several runs (a resumed training re-recording some steps) shows exactly
the steps and values that ``read_run`` gives. For that the follower keeps each record
reduced to what its scalar series need (numbers and the objects holding them; arrays and
strings dropped) and folds them again when new ones arrived.

Records become scalar series with the same naming as the tracker sinks
(:class:`cockpit_core.log.scalars.TagMap` without prefix): ``loss``, ``grad_norm/total``,
``metrics/valid_loss`` ... (:func:`scalar_series`). A consolidated ``.json``
(``cp.write``) is read whole again whenever it changes. The follower only reads: it never
locks, truncates or waits for the file, so the training process that writes it is not
slowed down. Per-parameter values, gradient histograms and stability thresholds go to
the follower's :class:`~cockpit_core.web.arrays.ArrayStore` (:attr:`LogFollower.arrays`),
as the records arrive (a later record of a step replaces the earlier one); a value it
cannot draw (histogram counts that are strings, a ragged ``per_param``, ...) is left out
and counted like a skipped record.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cockpit_core.log import LogData, LogFormatError, read_run
from cockpit_core.log.data import merge_runs
from cockpit_core.log.format import MAX_LINE_BYTES
from cockpit_core.log.read import decode_record
from cockpit_core.log.scalars import Scalar, TagMap, _number, quantity_entries
from cockpit_core.metrics import METRICS_KEY
from cockpit_core.web.arrays import HEATMAP_COLUMNS, ArrayStore

READ_CHUNK = 16 << 20
"""Bytes read per poll at most; a longer backlog is read over the next polls."""

SHOWN_PROBLEMS = 3
"""Skipped lines whose problem the warning names (the count covers all)."""


def reduced(value: Any) -> Any:
    """What a value's scalar series need: numbers, and objects holding them; else ``None``.

    :class:`~cockpit_core.log.scalars.TagMap` (without per-parameter values and
    histograms) gives the same scalars for a value and for its reduced form.
    """
    if _number(value) is not None:
        return value
    if isinstance(value, Mapping):
        return {k: reduced(v) for k, v in value.items()}
    return None


def _reduced_record(record: dict[str, Any]) -> dict[str, Any]:
    kind = record.get("kind")
    if kind == "values":
        return {**record, "values": {k: reduced(v) for k, v in record["values"].items()}}
    if kind == "metrics":
        return {**record, "metrics": {k: reduced(v) for k, v in record["metrics"].items()}}
    if kind == "header":
        return {k: v for k, v in record.items() if k not in ("params", "config")}
    return record


def _time_keys(quantities: Any) -> set[str]:
    """Output keys of the ``time`` quantity among a header's (or ``cp.add``'s) entries."""
    probe = TagMap("", per_param=False, histograms=False)
    for quantity in quantities if isinstance(quantities, list) else []:
        if isinstance(quantity, Mapping):
            probe.quantity_added(quantity)
    return probe.time_keys


def _row_scalars(tags: TagMap, row: Mapping[str, Any]) -> dict[str, float | None]:
    """``{tag: value}`` of one step's folded row (its values and its ``metrics``)."""
    values = {k: v for k, v in row.items() if k != METRICS_KEY}
    events = list(tags.values(values))
    metrics = row.get(METRICS_KEY)
    if isinstance(metrics, Mapping):
        events += list(tags.metrics(metrics))
    return {
        e.tag: (e.value if math.isfinite(e.value) else None)
        for e in events
        if isinstance(e, Scalar)
    }


def _shifted(
    raw: dict[str, dict[int, float | None]], time_keys: set[str]
) -> dict[str, dict[int, float | None]]:
    """The series with each ``time`` series counted from its value at its first step."""
    if not time_keys.intersection(raw):
        return raw
    out = dict(raw)
    for key in time_keys.intersection(raw):
        found = [(s, v) for s, v in raw[key].items() if v is not None]
        if found:
            origin = min(found)[1]
            out[key] = {s: None if v is None else v - origin for s, v in raw[key].items()}
    return out


def scalar_series(data: LogData) -> dict[str, dict[int, float | None]]:
    """``{tag: {step: value}}`` of a log's folded data (non-finite values: ``None``).

    Tags as :class:`~cockpit_core.log.scalars.TagMap` without prefix names them; each
    step's quantities' values and its ``metrics``; the ``time`` quantity counted from its
    value at the first step that has one.
    """
    tags = TagMap("", per_param=False, histograms=False)
    raw: dict[str, dict[int, float | None]] = {}
    for step, row in sorted(data.output.items()):
        for tag, value in _row_scalars(tags, row).items():
            raw.setdefault(tag, {})[step] = value
    time_keys: set[str] = set()
    for header in data.headers:
        time_keys |= _time_keys(header.get("quantities"))
    time_keys |= _time_keys([change["quantity"] for change in data.added])
    return _shifted(raw, time_keys)


class LogFollower:
    """The scalar series of one log, brought up to date by :meth:`poll`.

    Args:
        path: A JSON Lines log (``log=...``; it may not exist yet) or a consolidated
            ``.json`` (``cp.write``).
        label: The run's name in legends.
        columns: Columns of the gradient histogram heat map at most (see
            :class:`~cockpit_core.web.arrays.HistogramTrack`).

    Attributes:
        series: ``{tag: {step: value}}``; a non-finite value is ``None`` (a gap); those of
            :func:`scalar_series` of :attr:`data`.
        names: ``{output key: quantity name}`` from the headers (``cp.add`` included).
        findings: ``{id: finding record}`` of the log's ``finding`` records (diagnoses that
            ran while training).
        arrays: Per-parameter series, histograms and stability thresholds.
        data: The records read so far, reduced (see the module) and folded as
            :func:`~cockpit_core.log.read_run` folds them.
        records: Records read so far.
        skipped: Lines skipped so far (damaged, or records of the wrong shape), and values
            the view could not draw.
        problems: The first :data:`SHOWN_PROBLEMS` of those problems (``"line N: ..."``).

    """

    def __init__(self, path: str | os.PathLike, label: str, columns: int = HEATMAP_COLUMNS):
        self.path = Path(path)
        self.label = label
        self.columns = columns
        self.arrays = ArrayStore(columns)
        self.names: dict[str, str] = {}
        self.findings: dict[str, dict[str, Any]] = {}
        self.data = LogData()
        self.records = 0
        self.skipped = 0
        self.problems: list[str] = []
        self._error: str | None = None
        self._kept: list[dict[str, Any]] = []
        self._raw: dict[str, dict[int, float | None]] = {}
        self._time_keys: set[str] = set()
        self._tags = TagMap("", per_param=False, histograms=False)
        self._step_tags: dict[int, list[str]] = {}
        self._touched: set[int] = set()
        self._several = False  # several runs (or a resumed one): fold all again
        self._line = 0
        self._offset = 0
        self._pending = b""
        self._identity: tuple[int, ...] | None = None

    @property
    def error(self) -> str | None:
        """The problems reading the log (skipped lines counted), else ``None``."""
        parts = [self._error] if self._error else []
        if self.skipped:
            s = "" if self.skipped == 1 else "s"
            more = " ..." if self.skipped > len(self.problems) else ""
            parts.append(
                f"{self.skipped} record{s} skipped: {'; '.join(self.problems)}{more} (each "
                "damaged line was skipped; everything else is shown)"
            )
        return "; ".join(parts) or None

    @error.setter
    def error(self, message: str | None) -> None:
        self._error = message

    @property
    def series(self) -> dict[str, dict[int, float | None]]:
        """``{tag: {step: value}}`` (see the class): :func:`scalar_series` of :attr:`data`."""
        return _shifted(self._raw, self._time_keys)

    @property
    def last_step(self) -> int | None:
        """The largest step with a value, ``None`` before the first."""
        return max((max(s) for s in self.series.values() if s), default=None)

    def poll(self) -> bool:
        """Read what was appended since the last poll; ``True`` if anything new arrived."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._error = None if self._identity is None else f"{self.path} disappeared"
            return False
        if self.path.suffix == ".json":
            return self._poll_whole((stat.st_ino, stat.st_size, stat.st_mtime_ns))
        if self._identity != (stat.st_ino,) or stat.st_size < self._offset:
            self._reset()  # a new file under the same name, or a truncated one
            self._identity = (stat.st_ino,)
        if stat.st_size == self._offset:
            return False
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(READ_CHUNK)
        self._offset += len(chunk)
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        if len(self._pending) > MAX_LINE_BYTES:
            self._skip(f"a line longer than {MAX_LINE_BYTES} bytes")
            self._pending = b""
        before = (self.records, self.skipped)
        for line in lines:
            self._line += 1
            if line.strip():
                self._read_line(line)
        if self.records > before[0]:
            self._fold()
        return (self.records, self.skipped) != before

    def _reset(self) -> None:
        self.names.clear()
        self.findings.clear()
        self.arrays = ArrayStore(self.columns)
        self.data = LogData()
        self.records = self.skipped = self._line = self._offset = 0
        self.problems = []
        self._kept = []
        self._raw = {}
        self._time_keys = set()
        self._step_tags = {}
        self._touched = set()
        self._several = False
        self._pending = b""

    def _skip(self, problem: str) -> None:
        self.skipped += 1
        if len(self.problems) < SHOWN_PROBLEMS:
            self.problems.append(problem)

    def _read_line(self, line: bytes) -> None:
        try:
            record = decode_record(line)
        except (LogFormatError, ValueError) as err:  # JSON and UTF-8 errors included
            why = err if isinstance(err, LogFormatError) else "not valid JSON"
            self._skip(f"line {self._line}: {why}")
            return
        self.records += 1
        self.apply(record)

    def _poll_whole(self, identity: tuple[int, ...]) -> bool:
        if identity == self._identity:
            return False
        self._identity = identity
        try:
            data = read_run(self.path)
        except (LogFormatError, OSError) as err:
            self._error = str(err)
            return False
        self._reset()
        self._identity = identity
        self.apply({"kind": "header", **data.header})
        for step, values in data.output.items():
            self.apply({"kind": "values", "step": step, "values": values})
        for finding in data.findings:
            self.apply({"kind": "finding", **finding})
        self.records = 1 + len(data.output)
        self._error = None
        self._fold()
        return True

    def apply(self, record: dict[str, Any]) -> None:
        """Take one checked record (:func:`~cockpit_core.log.read.decode_record`'s).

        Call :meth:`_fold` after the last of a batch to bring :attr:`series` up to date.
        """
        kind = record.get("kind")
        kept = _reduced_record(record)
        first = not self._kept
        self._kept.append(kept)
        if kind == "header":
            params = record.get("params")
            listed = [p for p in params if isinstance(p, Mapping)] if params else []
            self.arrays.header({"params": listed})
            for key, entry in quantity_entries(record.get("quantities")).items():
                self.names[key] = str(entry.get("name", key))
            self._time_keys |= _time_keys(record.get("quantities"))
        elif kind == "quantity_added":
            quantity = record["quantity"]
            self.names[str(quantity.get("key"))] = str(quantity.get("name"))
            self._time_keys |= _time_keys([quantity])
        elif kind == "values":
            step = record["step"]
            for key, value in record["values"].items():
                try:
                    with np.errstate(all="ignore"):
                        self.arrays.values(step, {key: value}, self.names)
                except Exception as err:  # noqa: BLE001 - a value the view cannot draw
                    self._skip(
                        f"line {self._line}: the value {key!r:.40} of step {step} cannot be "
                        f"drawn ({type(err).__name__}: {str(err):.80})"
                    )
        if (
            (kind == "header" and not first)
            or kind == "resumed"
            or (kind == "values" and METRICS_KEY in record["values"])
        ):
            self._several = True  # merge_runs decides which run's steps are shown
        if not self._several:  # one run so far: LogData.add folds it as merge_runs does
            self.data.add(kept)
            if kind == "header":
                self.data.headers = [self.data.header]
            if kind in ("values", "metrics"):
                self._touched.add(kept["step"])

    def _fold(self) -> None:
        """Fold the kept records as :func:`~cockpit_core.log.read_run` does; new series.

        While the log holds one run, only the steps that new records touched are
        converted again; with several (or a resumed run) every record is folded again by
        :func:`~cockpit_core.log.data.merge_runs`.
        """
        if self._several:
            self.data = merge_runs(self._kept)
            self._raw = {}
            self._step_tags = {}
            for step, row in self.data.output.items():
                for tag, value in _row_scalars(self._tags, row).items():
                    self._raw.setdefault(tag, {})[step] = value
        else:
            for step in sorted(self._touched):
                for tag in self._step_tags.pop(step, ()):
                    series = self._raw[tag]
                    del series[step]
                    if not series:
                        del self._raw[tag]
                found = _row_scalars(self._tags, self.data.output[step])
                for tag, value in found.items():
                    self._raw.setdefault(tag, {})[step] = value
                self._step_tags[step] = list(found)
        self._touched.clear()
        self.findings = {f["id"]: f for f in self.data.findings}

    def __repr__(self) -> str:
        return f"LogFollower({str(self.path)!r}, label={self.label!r})"
