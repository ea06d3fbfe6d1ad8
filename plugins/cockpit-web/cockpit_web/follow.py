"""Following one log as it grows: its scalar series, read incrementally, in bounded memory.

A :class:`LogFollower` remembers how far it has read a JSON Lines log and, on each
:meth:`~LogFollower.poll`, decodes only the complete lines written since, with the very
decoder and shape checks of :func:`cockpit_core.log.read_run`
(:func:`cockpit_core.log.read.decode_record`). A line that is damaged or holds a record of
the wrong shape is skipped and counted, and the page says so (``"2 records skipped: line
7: ..."``); the rest is shown.

Each record is folded as it arrives, as :func:`~cockpit_core.log.data.merge_runs` folds a
whole log: the latest run that records a step decides it (its earlier runs' values,
per-parameter values, histograms and thresholds of that step are dropped), a resumed run's
values up to its checkpoint complete the step, the latest run's metrics of a step win. A
record costs the update of its own step: the follower keeps the folded rows (numbers only)
of the latest :data:`WINDOW_STEPS` steps, and each scalar series as a
:class:`~cockpit_web.reduce.ReducedSeries` (at most ``points`` points, older values
reduced into min/max buckets), so its memory does not grow with the log. A record that
changes a step older than the kept rows (a run resumed from an early checkpoint; a
``resumed`` record after its run's first values) makes the follower fold the log again
from its start, streamed in two passes (:meth:`LogFollower._refold`; :attr:`refolds`
counts them). Series are named as the tracker sinks name them
(:class:`cockpit_core.log.scalars.TagMap` without prefix): ``loss``, ``grad_norm/total``,
``metrics/valid_loss`` ... (:func:`scalar_series`); the ``time`` quantity is counted from
its value at its first step. A consolidated ``.json`` (``cp.write``) is read whole again
whenever it changes. The follower only reads: it never locks, truncates or waits for the
file. The arrays the charts draw a line per entry of, per-parameter values, histograms and
the charts' thresholds go to the follower's :class:`~cockpit_web.arrays.ArrayStore`
(:attr:`LogFollower.arrays`); with ``diagnose`` the records the diagnoses read also go to
a bounded window (:class:`~cockpit_core.diagnosing.runner.DiagnosisRunner`'s, the latest
:data:`DIAGNOSE_STEPS` steps) that :meth:`LogFollower.diagnosed` checks.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cockpit_core.diagnosing.build import build_diagnoses
from cockpit_core.diagnosing.run import report_order, run_checks
from cockpit_core.diagnosing.runner import DiagnosisRunner
from cockpit_core.engine.metrics import METRICS_KEY
from cockpit_core.errors import CockpitWarning
from cockpit_core.log import LogData, LogFormatError, read_run
from cockpit_core.log.format import MAX_LINE_BYTES
from cockpit_core.log.read import decode_record
from cockpit_core.log.scalars import Scalar, TagMap, quantity_entries, real_number
from cockpit_web.arrays import HEATMAP_COLUMNS, ArrayStore
from cockpit_web.panel import Layout, default_layout
from cockpit_web.reduce import ReducedSeries

READ_CHUNK = 16 << 20
"""Bytes read per poll at most; a longer backlog is read over the next polls."""

WINDOW_STEPS = 512
"""Latest steps whose folded rows the follower keeps (a later record may still change them)."""

DIAGNOSE_STEPS = 10_000
"""Latest tracked steps the diagnoses' window keeps (:class:`DiagnosisRunner`'s ``max_steps``)."""

SHOWN_PROBLEMS = 3
"""Skipped lines whose problem the warning names (the count covers all)."""


def reduced(value: Any) -> Any:
    """What a value's scalar series need: numbers, and objects holding them; else ``None``.

    :class:`~cockpit_core.log.scalars.TagMap` (without per-parameter values and
    histograms) gives the same scalars for a value and for its reduced form.
    """
    if real_number(value) is not None:
        return value
    if isinstance(value, Mapping):
        return {k: reduced(v) for k, v in value.items()}
    return None


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


class _Keeper:
    """A :class:`~cockpit_core.diagnosing.runner.DiagnosisRunner` used as the bounded window.

    Fed record by record like the online runner (it keeps what its diagnoses read, of the
    latest ``max_steps`` steps) but without checking online; the checks run over its whole
    window when the page asks (:meth:`check`), as ``cockpit diagnose`` runs them over the
    whole log.
    """

    def __init__(self, max_steps: int):
        diagnoses = build_diagnoses(None, None, None)
        self.runner = DiagnosisRunner(diagnoses, max_steps=max_steps, check_online=False)
        self.observed = 0

    def observe(self, record: Mapping[str, Any]) -> None:
        self.observed += 1
        self.runner.observe(record)

    def drop(self, step: int) -> None:
        """A later run re-records ``step``: forget the earlier run's values and events."""
        self.runner.forget(step)

    def check(self) -> list[Any]:
        """Every finding of the diagnoses over the window (in ``cockpit diagnose``'s order)."""
        r = self.runner
        window = r.window()
        found = []
        for diagnosis in r.diagnoses:  # one by one: one that fails does not stop the others
            if diagnosis.name in r.failed:
                continue
            try:
                found += run_checks([diagnosis], window, r.failed)
            except Exception as err:  # noqa: BLE001 - a plugin's diagnosis, e.g. in applies()
                r.failed.add(diagnosis.name)
                warnings.warn(
                    f"cockpit: diagnosis '{diagnosis.name}' failed and was skipped: "
                    f"{type(err).__name__}: {err}"[:220],
                    CockpitWarning,
                    stacklevel=2,
                )
        return report_order(found)


class _Row:
    """One step's folded values (``None``: no run recorded values there) and metrics."""

    __slots__ = ("metrics", "metrics_run", "run", "values")

    def __init__(self) -> None:
        self.values: dict[str, Any] | None = None
        self.run = -1  # the run whose values these are
        self.metrics: dict[str, Any] | None = None
        self.metrics_run = -1

    def folded(self) -> dict[str, Any] | None:
        if self.metrics is None:
            return None if self.values is None else self.values
        return {**(self.values or {}), METRICS_KEY: self.metrics}


class LogFollower:
    """The scalar series of one log, brought up to date by :meth:`poll`, bounded in size.

    Records are folded one by one as :func:`~cockpit_core.log.read_run` folds a whole log
    (:func:`~cockpit_core.log.data.merge_runs`): the latest run that records a step decides
    it, a resumed run completes the steps up to its checkpoint. A record costs the update
    of its step's row and series; only the latest :data:`WINDOW_STEPS` steps keep their
    rows. A record that changes a step older than that (a run resumed from an early
    checkpoint, a ``resumed`` record after a run's first values) makes the follower fold
    the log again from its start (streamed, in bounded memory: :meth:`_refold`).

    Args:
        path: A JSON Lines log (``log=...``; it may not exist yet) or a consolidated
            ``.json`` (``cp.write``).
        label: The run's name in legends.
        columns: Columns of the gradient histogram heat map at most (see
            :class:`~cockpit_web.arrays.HistogramTrack`).
        points: Points of a scalar series kept and shown at most
            (:class:`~cockpit_web.reduce.ReducedSeries`).
        diagnose: Keep the diagnoses' window (:meth:`diagnose`).
        layout: The panels shown (what :attr:`arrays` keeps for them; default: those of
            every installed plugin's instruments, :func:`~cockpit_web.panel.default_layout`).

    Attributes:
        reduced_series: ``{tag: ReducedSeries}``.
        names: ``{output key: quantity name}`` from the headers (``cp.add`` included).
        findings: ``{id: finding record}`` of the log's ``finding`` records.
        arrays: Per-entry and per-parameter series, histograms and thresholds (the same
            fold).
        records: Records read so far.
        applied: Records folded (counts a refold again): what a change cost.
        refolds: How often the log was folded again from its start.
        skipped: Lines skipped so far (damaged, or records of the wrong shape), and values
            the view could not draw.
        problems: The first :data:`SHOWN_PROBLEMS` of those problems (``"line N: ..."``).

    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        label: str,
        columns: int = HEATMAP_COLUMNS,
        points: int = 2000,
        diagnose: bool = False,
        layout: Layout | None = None,
    ):
        self.path = Path(path)
        self.layout = layout if layout is not None else default_layout()
        self.label = label
        self.columns = columns
        self.points = points
        self.diagnose = diagnose
        self.diagnose_steps = DIAGNOSE_STEPS
        self.records = 0
        self.skipped = 0
        self.applied = 0
        self.refolds = 0
        self.problems: list[str] = []
        self._error: str | None = None
        self._identity: tuple[int, ...] | None = None
        self._clear()

    def _clear(self) -> None:
        """Forget the fold (not the reading position)."""
        self.arrays = ArrayStore(self.columns, self.layout.entries, self.layout.thresholds)
        self.names: dict[str, str] = {}
        self.findings: dict[str, dict[str, Any]] = {}
        self.reduced_series: dict[str, ReducedSeries] = {}
        self.keeper = _Keeper(self.diagnose_steps) if self.diagnose else None
        self._time_keys: set[str] = set()
        self._tags = TagMap("", per_param=False, histograms=False)
        self._rows: dict[int, _Row] = {}
        self._step_tags: dict[int, list[str]] = {}
        self._floor: int | None = None  # the largest step whose row was let go
        self._touched: set[int] = set()
        self._headers: list[dict[str, Any]] = []
        self._run = 0
        self._run_open = True  # the run may still take a header as its own
        self._run_touched = False  # the run recorded values, errors or skipped steps
        self._resumed: int | None = None
        self._plan: list[tuple[int | None, set[int], set[int]]] | None = None  # refold
        self._last_step: int | None = None

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
        """``{tag: {step: value}}`` of the points shown (:func:`scalar_series` while short)."""
        return {
            tag: series.points(tag in self._time_keys)
            for tag, series in self.reduced_series.items()
            if series.exact or series.buckets
        }

    @property
    def data(self) -> LogData:
        """The folded rows of the latest :data:`WINDOW_STEPS` steps (reduced), headers, findings."""
        output = {}
        for step in sorted(self._rows):
            row = self._rows[step].folded()
            if row is not None:
                output[step] = row
        return LogData(
            header=self._headers[-1] if self._headers else {},
            output=output,
            headers=list(self._headers),
            findings=list(self.findings.values()),
        )

    @property
    def last_step(self) -> int | None:
        """The largest step with a value, ``None`` before the first."""
        return self._last_step

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
        refold = False
        for line in lines:
            self._line += 1
            if not line.strip():
                continue
            if refold:  # folded below: only counted now
                self.records += self._decode(line, self._line, True) is not None
                continue
            try:
                self._read_line(line)
            except _Refold:
                refold = True
            if len(self._touched) > WINDOW_STEPS:
                self._update()
        if refold:
            self._refold()
        self._update()
        return (self.records, self.skipped) != before

    def _reset(self) -> None:
        self.records = self.skipped = self.applied = 0
        self._line = self._offset = 0
        self.problems = []
        self._pending = b""
        self._clear()

    _offset = 0
    _line = 0
    _pending = b""

    def _skip(self, problem: str) -> None:
        self.skipped += 1
        if len(self.problems) < SHOWN_PROBLEMS:
            self.problems.append(problem)

    def _decode(self, line: bytes, number: int, count: bool) -> dict[str, Any] | None:
        try:
            return decode_record(line)
        except (LogFormatError, ValueError) as err:  # JSON and UTF-8 errors included
            if count:
                why = err if isinstance(err, LogFormatError) else "not valid JSON"
                self._skip(f"line {number}: {why}")
            return None

    def _read_line(self, line: bytes) -> None:
        record = self._decode(line, self._line, True)
        if record is None:
            return
        self.records += 1
        self._reading_line = self._line
        self.apply(record)

    _reading_line = 0

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
        self._update()
        return True

    # -- the fold ------------------------------------------------------------------------

    def apply(self, record: dict[str, Any]) -> None:
        """Fold one checked record (:func:`~cockpit_core.log.read.decode_record`'s).

        Raises :class:`_Refold` (caught by :meth:`poll`) when it changes a step whose row
        was let go; call :meth:`_update` after the last of a batch.
        """
        self.applied += 1
        kind = record.get("kind")
        plan = self._plan
        if kind == "header":
            if not self._run_open:
                self._run += 1
                self._resumed = plan[self._run][0] if plan else None
                self._run_touched = False
            self._run_open = False
            self._header(record)
        elif kind == "quantity_added":
            quantity = record["quantity"]
            self.names[str(quantity.get("key"))] = str(quantity.get("name"))
            self._time_keys |= _time_keys([quantity])
        elif kind == "resumed":
            if plan is None:
                if self._run_touched:
                    raise _Refold  # its earlier values were claims, now completions
                self._resumed = record["step"]
        elif kind == "finding":
            add_finding_to(self.findings, record)
        elif kind in ("values", "error", "skipped", "metrics"):
            self._step_record(kind, record)
        keeper = self.keeper
        if keeper is not None and kind in ("header", "skipped", "cost"):
            step = record.get("step")
            if kind == "header" or not (isinstance(step, int) and self._claimed_later(step)):
                keeper.observe(record)

    def _header(self, record: dict[str, Any]) -> None:
        header = {k: v for k, v in record.items() if k != "kind"}
        self._headers.append({k: v for k, v in header.items() if k not in ("params", "config")})
        params = record.get("params")
        listed = [p for p in params if isinstance(p, Mapping)] if params else []
        self.arrays.header({"params": listed})
        for key, entry in quantity_entries(record.get("quantities")).items():
            self.names[key] = str(entry.get("name", key))
        self._time_keys |= _time_keys(record.get("quantities"))

    def _claimed_later(self, step: int) -> bool:
        """In a refold: whether a later run records ``step`` (so this run's is dropped)."""
        plan = self._plan
        return plan is not None and any(step in p[1] for p in plan[self._run + 1 :])

    def _step_record(self, kind: str, record: dict[str, Any]) -> None:
        step = record["step"] if kind != "skipped" or "step" in record else None
        if kind != "metrics":
            self._run_open = False
            self._run_touched = True
        if kind in ("error", "skipped"):
            if step is None:
                return
        assert step is not None
        plan = self._plan
        if kind == "metrics":
            if plan is not None and any(step in p[2] for p in plan[self._run + 1 :]):
                return
            row = self._row(step)
            if row.metrics_run != self._run or row.metrics is None:
                row.metrics, row.metrics_run = {}, self._run
            row.metrics.update({k: reduced(v) for k, v in record["metrics"].items()})
            self._touched.add(step)
            return
        if self._claimed_later(step):
            return
        completes = self._resumed is not None and step <= self._resumed
        row = self._row(step)
        if not completes and 0 <= row.run != self._run:  # this run claims the step
            row.values = None
            self.arrays.drop(step)
            if self.keeper is not None:
                self.keeper.drop(step)
        row.run = self._run
        if kind != "values":
            self._touched.add(step)
            return
        if row.values is None:
            row.values = {}
        row.values.update({k: reduced(v) for k, v in record["values"].items()})
        self._touched.add(step)
        for key, value in record["values"].items():
            if not isinstance(value, Mapping) and not self.arrays.keeps(self.names.get(key, key)):
                continue  # nothing the ArrayStore keeps
            try:
                with np.errstate(all="ignore"):
                    self.arrays.values(step, {key: value}, self.names)
            except Exception as err:  # noqa: BLE001 - a value the view cannot draw
                if self._plan is None:
                    self._skip(
                        f"line {self._reading_line}: the value {key!r:.40} of step {step} "
                        f"cannot be drawn ({type(err).__name__}: {str(err):.80})"
                    )
        if self.keeper is not None:
            self.keeper.observe(record)

    def _row(self, step: int) -> _Row:
        row = self._rows.get(step)
        if row is None:
            if self._floor is not None and step <= self._floor and self._plan is None:
                raise _Refold  # its row was let go: fold again from the start
            row = self._rows[step] = _Row()
        return row

    def _update(self) -> None:
        """Bring the series of the steps touched since the last update up to date."""
        for step in sorted(self._touched):
            row = self._rows.get(step)
            folded = row.folded() if row is not None else None
            found = _row_scalars(self._tags, folded) if folded is not None else {}
            for tag in self._step_tags.pop(step, ()):
                if tag not in found:
                    self.reduced_series[tag].remove(step)
            for tag, value in found.items():
                series = self.reduced_series.get(tag)
                if series is None:
                    series = self.reduced_series[tag] = ReducedSeries(self.points)
                series.set(step, value)
            if found:
                self._step_tags[step] = list(found)
                if self._last_step is None or step > self._last_step:
                    self._last_step = step
        self._touched.clear()
        if len(self._rows) > WINDOW_STEPS:
            for oldest in sorted(self._rows)[: len(self._rows) - WINDOW_STEPS]:
                del self._rows[oldest]
                self._step_tags.pop(oldest, None)
                self._floor = oldest if self._floor is None else max(self._floor, oldest)

    def _lines(self) -> Any:
        """``(number, line)`` of the complete lines read so far, streamed from the file."""
        end = self._offset - len(self._pending)
        done = 0
        number = 0
        with open(self.path, "rb") as f:
            while done < end:
                line = f.readline(min(MAX_LINE_BYTES + 1, end - done))
                if not line:
                    return
                done += len(line)
                number += 1
                if line.strip():
                    yield number, line.rstrip(b"\n")

    def _refold(self) -> None:
        """Fold the log again from its start, in two streamed passes, in bounded memory.

        The first pass finds each run's resume point and the steps it records (what a
        later run takes over); the second folds every record that stays, as
        :func:`~cockpit_core.log.data.merge_runs` keeps them.
        """
        self.refolds += 1
        runs: list[tuple[int | None, set[int], set[int]]] = [(None, set(), set())]
        open_run = True
        resumed: list[int | None] = [None]
        for number, line in self._lines():
            record = self._decode(line, number, False)
            if record is None:
                continue
            kind = record.get("kind")
            if kind == "header":
                if not open_run:
                    runs.append((None, set(), set()))
                    resumed.append(None)
                open_run = False
            elif kind == "resumed":
                resumed[-1] = record["step"]
            elif kind == "metrics":
                runs[-1][2].add(record["step"])
            elif kind in ("values", "error", "skipped"):
                open_run = False
                if "step" in record:
                    runs[-1][1].add(record["step"])
        plan = [
            (r, {s for s in steps if r is None or s > r}, metrics)
            for r, (_, steps, metrics) in zip(resumed, runs)
        ]
        applied, reading = self.applied, self._reading_line
        self._clear()
        self._plan = plan
        self._resumed = plan[0][0]
        for number, line in self._lines():
            record = self._decode(line, number, False)
            if record is not None:
                self._reading_line = number
                self.apply(record)
                if len(self._touched) > WINDOW_STEPS:
                    self._update()
        self._update()
        self._plan = None
        self.applied += applied
        self._reading_line = reading

    def keep_all_steps(self) -> None:
        """Let the diagnoses' window keep every step (a page written once, whole)."""
        if self.diagnose_steps == sys.maxsize:
            return
        self.diagnose_steps = sys.maxsize
        if self.keeper is not None and self.records and self.path.suffix != ".json":
            self._refold()  # what the window let go
        elif self.keeper is not None:
            self.keeper.runner.max_steps = sys.maxsize

    def diagnosed(self) -> list[Any]:
        """The diagnoses' findings over the kept window (``[]`` without ``diagnose``)."""
        return self.keeper.check() if self.keeper is not None else []

    def __repr__(self) -> str:
        return f"LogFollower({str(self.path)!r}, label={self.label!r})"


class _Refold(Exception):
    """A record changes a step whose row the follower let go: fold the log again."""


def add_finding_to(findings: dict[str, dict[str, Any]], record: Mapping[str, Any]) -> None:
    """Keep a ``finding`` record (without ``kind``) by id: the last of an id wins, in place."""
    finding = {k: v for k, v in record.items() if k != "kind"}
    findings[finding["id"]] = finding
