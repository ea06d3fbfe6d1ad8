"""Following one log as it grows: its scalar series, read incrementally.

A :class:`LogFollower` remembers how far it has read a JSON Lines log and, on each
:meth:`~LogFollower.poll`, decodes only the complete lines written since (with the log's
safe decoder, :func:`cockpit_core.log.loads`), so following a long run costs only what it
appended. Records become scalar series with the same naming as the tracker sinks
(:class:`cockpit_core.log.scalars.TagMap` without prefix): ``loss``, ``grad_norm/total``,
``metrics/valid_loss`` ... A later record of a step replaces the earlier value, as a later
run of the same log does in :func:`cockpit_core.log.read_run`. A consolidated ``.json``
(``cp.write``) is read whole again whenever it changes. The follower only reads: it never
locks, truncates or waits for the file, so the training process that writes it is not
slowed down. Per-parameter values, gradient histograms and stability thresholds go to
the follower's :class:`~cockpit_core.web.arrays.ArrayStore` (:attr:`LogFollower.arrays`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from cockpit_core.log import LogFormatError, loads, read_run
from cockpit_core.log.format import MAX_LINE_BYTES
from cockpit_core.log.scalars import Scalar, TagMap, quantity_entries
from cockpit_core.web.arrays import HEATMAP_COLUMNS, ArrayStore

READ_CHUNK = 16 << 20
"""Bytes read per poll at most; a longer backlog is read over the next polls."""


class LogFollower:
    """The scalar series of one log, brought up to date by :meth:`poll`.

    Args:
        path: A JSON Lines log (``log=...``; it may not exist yet) or a consolidated
            ``.json`` (``cp.write``).
        label: The run's name in legends.
        columns: Columns of the gradient histogram heat map at most (see
            :class:`~cockpit_core.web.arrays.HistogramTrack`).

    Attributes:
        series: ``{tag: {step: value}}``; a non-finite value is ``None`` (a gap).
        names: ``{output key: quantity name}`` from the headers (``cp.add`` included).
        findings: ``{id: finding record}`` of the log's ``finding`` records (diagnoses that
            ran while training).
        arrays: Per-parameter series, histograms and stability thresholds.
        records: Records read so far.
        error: The last problem reading the log (a damaged line is skipped), else ``None``.

    """

    def __init__(self, path: str | os.PathLike, label: str, columns: int = HEATMAP_COLUMNS):
        self.path = Path(path)
        self.label = label
        self.columns = columns
        self.arrays = ArrayStore(columns)
        self.series: dict[str, dict[int, float | None]] = {}
        self.names: dict[str, str] = {}
        self.findings: dict[str, dict[str, Any]] = {}
        self.records = 0
        self.error: str | None = None
        self._tags = TagMap("", per_param=False, histograms=False)
        self._offset = 0
        self._pending = b""
        self._identity: tuple[int, ...] | None = None

    @property
    def last_step(self) -> int | None:
        """The largest step with a value, ``None`` before the first."""
        return max((max(s) for s in self.series.values() if s), default=None)

    def poll(self) -> bool:
        """Read what was appended since the last poll; ``True`` if anything new arrived."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self.error = None if self._identity is None else f"{self.path} disappeared"
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
            self.error = f"{self.path}: a line longer than {MAX_LINE_BYTES} bytes was skipped"
            self._pending = b""
        before = self.records
        for line in lines:
            if line.strip():
                self._read_line(line)
        return self.records > before

    def _reset(self) -> None:
        self.series.clear()
        self.names.clear()
        self.findings.clear()
        self.arrays = ArrayStore(self.columns)
        self.records = 0
        self._tags = TagMap("", per_param=False, histograms=False)
        self._offset = 0
        self._pending = b""

    def _read_line(self, line: bytes) -> None:
        try:
            record = loads(line)
        except LogFormatError as err:
            self.error = f"{self.path}: a damaged line was skipped ({err})"
            return
        if isinstance(record, dict):
            self.records += 1
            self.apply(record)

    def _poll_whole(self, identity: tuple[int, ...]) -> bool:
        if identity == self._identity:
            return False
        self._identity = identity
        try:
            data = read_run(self.path)
        except (LogFormatError, OSError) as err:
            self.error = str(err)
            return False
        self._reset()
        self._identity = identity
        self.apply({"kind": "header", **data.header})
        for step, values in data.output.items():
            self.apply({"kind": "values", "step": step, "values": values})
        for finding in data.findings:
            self.apply({"kind": "finding", **finding})
        self.records = 1 + len(data.output)
        self.error = None
        return True

    def apply(self, record: dict[str, Any]) -> None:
        """Take one decoded record (header, quantity_added, values, metrics, finding)."""
        kind = record.get("kind")
        step = record.get("step")
        if kind == "header":
            self._tags.header(record)
            self.arrays.header(record)
            for key, entry in quantity_entries(record.get("quantities")).items():
                self.names[key] = str(entry.get("name", key))
        elif kind == "quantity_added" and isinstance(record.get("quantity"), dict):
            quantity = record["quantity"]
            self._tags.quantity_added(quantity)
            self.names[str(quantity.get("key"))] = str(quantity.get("name"))
        elif kind == "values" and type(step) is int and isinstance(record.get("values"), dict):
            self._add(step, self._tags.values(record["values"]))
            self.arrays.values(step, record["values"], self.names)
        elif kind == "metrics" and type(step) is int and isinstance(record.get("metrics"), dict):
            self._add(step, self._tags.metrics(record["metrics"]))
        elif kind == "finding" and isinstance(record.get("id"), str):
            self.findings[record["id"]] = {k: v for k, v in record.items() if k != "kind"}

    def _add(self, step: int, events: Any) -> None:
        for event in events:
            if isinstance(event, Scalar):
                value = event.value if math.isfinite(event.value) else None
                self.series.setdefault(event.tag, {})[step] = value

    def __repr__(self) -> str:
        return f"LogFollower({str(self.path)!r}, label={self.label!r})"
