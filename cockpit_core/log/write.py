"""The writer of JSON Lines logs: one record per line, flushed as it is written.

:class:`LogWriter` appends runs to a log and never truncates it; each record is flushed
to the operating system as soon as it is written and ``fsync``-ed at most every
``fsync_every`` seconds, and records that cannot be written (a full disk) wait in a
bounded buffer and are retried. See :mod:`cockpit_core.log`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import cockpit_core.log.format as log_format
from cockpit_core.errors import CockpitWarning
from cockpit_core.log.decode import LogFormatError, _decode
from cockpit_core.log.encode import _encode, placeholder
from cockpit_core.log.format import _HEADER_START, _RECORD_START, _unescape


class LogWriter:
    """Appends records to a JSON Lines file: flushed per record, fsync-ed at an interval.

    Use it as a sink (``writer(record)``); :class:`~cockpit_core.Cockpit` makes one when
    given ``log=path``. It never raises on a value (see :func:`clean_value`), nor when the
    disk is full: records it cannot write wait in a buffer of at most ``max_pending_bytes``
    and are retried with every new record and on :meth:`close`; it warns when writing
    fails, when it works again and how many records were lost. With
    ``keep_in_memory=False`` that buffer is the only copy of those records.

    An existing log is never truncated: the writer cuts off a torn last line (with a
    warning), then appends a new run whose header carries ``run`` = previous run + 1.

    Args:
        path: File to write (parent folders are created; an existing log is appended to).
        fsync_every: Seconds between ``os.fsync`` calls (``0`` syncs every record, ``None``
            never; ``close`` always syncs unless ``None``). Flushing each record already
            survives a killed process; fsync also survives a crash of the machine.
        max_pending_bytes: Bound of the buffer of unwritten records; when it is full,
            newer records are dropped (and counted in :attr:`lost`).

    Attributes:
        run: The run number written into this writer's header records.
        lost: Records dropped so far because they could not be written.

    Raises:
        LogFormatError: ``path`` exists, is not empty and is not a JSON Lines log.
        OSError: The file cannot be opened (see :func:`check_log_path`, run first).

    """

    def __init__(
        self,
        path: str | Path,
        fsync_every: float | None = 5.0,
        *,
        max_pending_bytes: int = log_format.MAX_PENDING_BYTES,
    ):
        if fsync_every is not None and fsync_every < 0:
            raise ValueError(f"fsync_every must be >= 0 seconds or None, got {fsync_every}.")
        check_log_path(path)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync_every = fsync_every
        self.max_pending_bytes = max_pending_bytes
        self.run = 1
        self.lost = 0
        self._appending = False
        self._started = False
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._error: OSError | None = None  # while writing fails
        self._last_error: OSError | None = None
        self._dirty = False
        self._warned: set[str] = set()
        if self.path.exists() and self.path.stat().st_size:
            self._prepare_existing()
        self._file: IO[bytes] = open(self.path, "ab", buffering=0)  # noqa: SIM115 - kept open
        self._good_size = os.fstat(self._file.fileno()).st_size
        self._last_sync = time.monotonic()

    # -- opening an existing log ----------------------------------------------------------

    def _prepare_existing(self) -> None:
        with open(self.path, "r+b") as f:
            if not self._cut_torn_tail(f):
                return
            f.seek(0)
            self.run = _last_run(f) + 1
        self._appending = True
        warnings.warn(
            f"cockpit log: {self.path} already holds a log; appending run {self.run} to it "
            "(readers show, for every step, the values of the latest run that recorded it).",
            CockpitWarning,
            stacklevel=3,
        )

    def _cut_torn_tail(self, f: IO[bytes]) -> bool:
        """Cut an incomplete last line; whether anything is left."""
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return True
        start = size
        while start > 0:
            step = min(1 << 16, start)
            f.seek(start - step)
            i = f.read(step).rfind(b"\n")
            if i >= 0:
                start = start - step + i + 1
                break
            start -= step
        f.seek(start)
        tail = f.read(min(size - start, log_format.MAX_LINE_BYTES + 1))
        if tail.strip() and len(tail) <= log_format.MAX_LINE_BYTES:
            try:
                complete = isinstance(
                    _decode(tail.decode("utf-8"), log_format.MAX_ARRAY_ELEMENTS), dict
                )
            except (json.JSONDecodeError, UnicodeDecodeError):
                complete = False
            except LogFormatError:  # valid JSON, however wrong: not a torn line, keep it
                complete = True
            if complete:
                f.seek(size)
                f.write(b"\n")
                return True
        f.truncate(start)
        if tail.strip():
            warnings.warn(
                f"cockpit log: {self.path} ended in an incomplete line of {size - start} "
                "bytes (a run killed while writing it); it was cut off before appending.",
                CockpitWarning,
                stacklevel=4,
            )
        return start > 0

    # -- writing --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._file.closed

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line, flush it, fsync if the interval has passed."""
        if self._file.closed:
            raise ValueError(f"the log {self.path} is closed.")
        record = dict(record)
        lines = []
        if record.get("kind") == "header":
            record.setdefault("log_format", log_format.LOG_FORMAT_VERSION)
            record.setdefault("run", self.run)
        elif self._appending and not self._started:  # a new run needs a header to start it
            header = {
                "kind": "header",
                "run": self.run,
                "log_format": log_format.LOG_FORMAT_VERSION,
            }
            lines.append(self._line(header))
        self._started = True
        lines.extend(self._lines(record))
        self._flush_pending()  # retry what is buffered first, making room for these lines
        for line in lines:
            self._enqueue(line)
        self._flush_pending()
        self._maybe_fsync()

    def _line(self, record: Mapping[str, Any]) -> bytes:
        return (_encode(record)[0] + "\n").encode("utf-8")

    def _lines(self, record: dict[str, Any]) -> list[bytes]:
        """The record's line, smaller values replacing too large ones (with error records)."""
        text, notes = _encode(record)
        for category, note in notes:
            if category not in self._warned:
                self._warned.add(category)
                warnings.warn(
                    f"cockpit log: a value in a '{record.get('kind')}' record cannot be "
                    f"logged as it is; it was written as the placeholder string '{note}'.",
                    CockpitWarning,
                    stacklevel=4,
                )
        if len(text) <= log_format.MAX_LINE_BYTES:
            return [(text + "\n").encode("utf-8")]
        data = json.loads(text)  # plain JSON: only its size matters here
        target = data["values"] if isinstance(data.get("values"), dict) else data
        share = log_format.MAX_LINE_BYTES // (2 * max(1, len(target)))
        replaced = []
        for key, value in list(target.items()):
            if target is data and key in ("kind", "step", "run"):
                continue
            size = len(json.dumps(value, allow_nan=True, separators=(",", ":")))
            if size > share:
                target[key] = placeholder(
                    f"value of {size} bytes, too large for one log line (the limit is "
                    f"{log_format.MAX_LINE_BYTES} bytes)"
                )
                replaced.append(key)
        lines = [(json.dumps(data, allow_nan=True, separators=(",", ":")) + "\n").encode()]
        step = record.get("step")
        for key in replaced:
            error = {"kind": "error", "step": step, "quantity": _unescape(key)}
            error.update(phase="serialize", error=f"UnserializableValue: {target[key]}")
            lines.append(self._line({**error, "traceback": []}))
        warnings.warn(
            f"cockpit log: a '{record.get('kind')}' record of {len(text)} bytes is larger than "
            f"the limit of {log_format.MAX_LINE_BYTES} bytes; {sorted(replaced)} were written as "
            "placeholders.",
            CockpitWarning,
            stacklevel=4,
        )
        return lines

    def _enqueue(self, line: bytes) -> None:
        if self._error is not None and self._pending_bytes + len(line) > self.max_pending_bytes:
            self.lost += 1
            if "buffer full" not in self._warned:
                self._warned.add("buffer full")
                warnings.warn(
                    f"cockpit log: the buffer of unwritten records for {self.path} is full "
                    f"({self.max_pending_bytes} bytes); newer records are dropped until "
                    "writing works again.",
                    CockpitWarning,
                    stacklevel=4,
                )
            return
        self._pending.append(line)
        self._pending_bytes += len(line)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._file.write(view)
            if not n:
                raise OSError(errno.EIO, "the file accepted no bytes")
            view = view[n:]

    def _flush_pending(self) -> None:
        """Write the buffered lines; on an OS error keep them for the next try."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        try:
            if self._dirty:  # drop what a failed write left of a line
                os.ftruncate(self._file.fileno(), self._good_size)
                self._dirty = False
            self._write_all(data)
        except OSError as err:
            self._dirty = True
            if self._error is None:
                warnings.warn(
                    f"cockpit log: cannot write to {self.path} ({err}); keeping unwritten "
                    f"records in memory (up to {self.max_pending_bytes} bytes) and retrying "
                    "with every new record. With keep_in_memory=False this buffer is the only "
                    "copy of them.",
                    CockpitWarning,
                    stacklevel=4,
                )
            self._error = self._last_error = err
            return
        self._good_size += len(data)
        if self._error is not None:
            warnings.warn(
                f"cockpit log: writing to {self.path} works again; {len(self._pending)} "
                "buffered records were written.",
                CockpitWarning,
                stacklevel=4,
            )
            self._error = None
        self._pending.clear()
        self._pending_bytes = 0

    def _fsync(self) -> None:
        try:
            os.fsync(self._file.fileno())
        except OSError as err:
            if "fsync" not in self._warned:
                self._warned.add("fsync")
                warnings.warn(
                    f"cockpit log: fsync of {self.path} failed ({err}); records are written "
                    "but may not survive a crash of the machine.",
                    CockpitWarning,
                    stacklevel=4,
                )

    def _maybe_fsync(self) -> None:
        now = time.monotonic()
        if self.fsync_every is not None and now - self._last_sync >= self.fsync_every:
            if self._error is None:
                self._fsync()
            self._last_sync = now

    def close(self) -> None:
        """Retry unwritten records once, fsync and close the file (idempotent; never raises)."""
        if self._file.closed:
            return
        self._flush_pending()
        if self._pending:
            with contextlib.suppress(OSError):  # drop what the failed write left of a line
                os.ftruncate(self._file.fileno(), self._good_size)
            self.lost += len(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
        if self.lost:
            warnings.warn(
                f"cockpit log: {self.lost} records could not be written to {self.path} and "
                f"are lost ({self._last_error}).",
                CockpitWarning,
                stacklevel=2,
            )
        if self.fsync_every is not None:
            self._fsync()
        with contextlib.suppress(OSError):
            self._file.close()

    def __repr__(self) -> str:
        return f"LogWriter({str(self.path)!r})"


def _last_run(f: IO[bytes]) -> int:
    """The highest run number in a log (headers without ``run`` count 1, 2, ...)."""
    headers = last = 0
    for line in f:
        if _HEADER_START.match(line):
            headers += 1
            run = None
            with contextlib.suppress(Exception):
                run = _decode(line.decode("utf-8"), log_format.MAX_ARRAY_ELEMENTS).get("run")
            last = max(last, run if type(run) is int else headers)
    return max(last, headers, 1)


def check_log_path(path: str | Path) -> None:
    """Raise what :class:`LogWriter` would raise on opening ``path``; creates and changes nothing.

    The one check of a log path: the writer runs it before it creates a folder or opens the
    file, and ``cockpit validate`` runs it on a config's ``log``. A file that does not exist
    yet (in folders that may not exist yet either) passes: the writer creates them.

    Raises:
        LogFormatError: ``path`` exists, is not empty and is not a JSON Lines log.
        OSError: ``path`` is a folder (or a string ending in a slash, which names one),
            lies under a file (the nearest existing path above it), or cannot be read or
            written.

    """
    if isinstance(path, str) and path.endswith(("/", os.sep)):
        why = f"{os.strerror(errno.EISDIR)} (the path ends with a slash)"
        raise IsADirectoryError(errno.EISDIR, why, path)
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if path.exists():
        with open(path, "rb") as f:
            head = f.read(64)
        torn_start = b"\n" not in head and b'{"kind":'.startswith(head.strip()[:8])
        if head and not _RECORD_START.match(head) and not torn_start:
            raise LogFormatError(
                f"{path} exists and is not a cockpit JSON Lines log (it does not start with a "
                "record); cockpit never overwrites a file: choose another log path, or move "
                "the file away."
            )
        target = path
    else:
        target = next(folder for folder in path.parents if folder.exists())
        if not target.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target))
    if not os.access(target, os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(target))
