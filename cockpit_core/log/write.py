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
import stat
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import cockpit_core.log.format as log_format
from cockpit_core.errors import CockpitWarning
from cockpit_core.log.decode import LogFormatError, decode_value
from cockpit_core.log.encode import encode_value, placeholder
from cockpit_core.log.format import HEADER_START, RECORD_START, unescape
from cockpit_core.log.lock import lock_log, unlock_log


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

    A log has one writer at a time: the writer locks the log file (``fcntl.flock``,
    exclusive, without waiting) before it reads or changes it, writes its PID into
    ``.NAME.lock`` next to it, and holds the lock until :meth:`close` or the end of the
    process; a second writer, in this or another process, raises :class:`LogLockedError`
    (see :mod:`cockpit_core.log.lock` for why the log file itself is locked). Every repair
    of the end of the file (a torn line at opening, what a failed write left) is measured
    on the file itself (``os.fstat``) under that lock, and a failed write only ever cuts
    the bytes after the last complete line of its own.

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
        LogLockedError: Another writer (another Cockpit, in this or another process) is
            writing ``path``; the message names its PID.
        OSError: The file cannot be opened, or is not a regular file (see
            :func:`check_log_path`, run first).

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
        self._dirty = False  # a write failed: the file may end in a part of a line
        self._write_start = 0  # where the end of the file was when the last write began
        self._warned: set[str] = set()
        fd = _open_regular(self.path)
        try:
            lock_log(fd, self.path)  # before anything in the file is read or changed
            # O_APPEND: every write goes to the real end of the file; reads seek freely
            self._file: IO[bytes] = open(fd, "r+b", buffering=0)  # noqa: SIM115 - kept open
        except BaseException:
            os.close(fd)
            raise
        try:
            if os.fstat(fd).st_size:
                self._prepare_existing()
        except BaseException:
            self._release()
            raise
        self._last_sync = time.monotonic()

    # -- opening an existing log ----------------------------------------------------------

    def _prepare_existing(self) -> None:
        f = self._file
        if not self._cut_torn_tail(f):
            return
        with open(os.dup(f.fileno()), "rb", closefd=True) as reader:  # buffered, same file
            reader.seek(0)
            self.run = _last_run(reader) + 1
        self._appending = True
        warnings.warn(
            f"cockpit log: {self.path} already holds a log; appending run {self.run} to it "
            "(readers show, for every step, the values of the latest run that recorded it).",
            CockpitWarning,
            stacklevel=3,
        )

    def _cut_torn_tail(self, f: IO[bytes]) -> bool:
        """Cut an incomplete last line; whether anything is left (run under the lock)."""
        size = os.fstat(f.fileno()).st_size  # the real end, not what another open saw
        if not size:
            return False
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
                    decode_value(tail.decode("utf-8"), log_format.MAX_ARRAY_ELEMENTS), dict
                )
            except (json.JSONDecodeError, UnicodeDecodeError):
                complete = False
            except LogFormatError:  # valid JSON, however wrong: not a torn line, keep it
                complete = True
            if complete:
                f.write(b"\n")  # O_APPEND: at the real end
                return True
        os.ftruncate(f.fileno(), start)
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
        return (encode_value(record)[0] + "\n").encode("utf-8")

    def _lines(self, record: dict[str, Any]) -> list[bytes]:
        """The record's line, smaller values replacing too large ones (with error records)."""
        text, notes = encode_value(record)
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
            error = {"kind": "error", "step": step, "quantity": unescape(key)}
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

    def _repair(self) -> None:
        """Cut what a failed write left of a line, measured on the file, under the lock.

        The file is cut back to where that write began (the end of the last complete line
        before it; every line of the write stays in the buffer and is written again), and
        only if what follows is this writer's own: a prefix of the buffered lines. It is
        measured on the file (``os.fstat``), never extends it, and never cuts a byte that
        this writer did not write: a tail that is not its own (another program ignored the
        lock) is left alone, with a warning.
        """
        fd = self._file.fileno()
        end = os.fstat(fd).st_size  # the real end of the file, not a size kept in memory
        start = self._write_start
        if end > start:
            data = b"".join(self._pending)
            written = _read_at(fd, start, end - start)
            if not data.startswith(written):
                if "foreign tail" not in self._warned:
                    self._warned.add("foreign tail")
                    warnings.warn(
                        f"cockpit log: {self.path} was changed by another program while this "
                        "writer held it; its end was left as it is.",
                        CockpitWarning,
                        stacklevel=5,
                    )
            else:
                os.ftruncate(fd, start)
        self._dirty = False

    def _flush_pending(self) -> None:
        """Write the buffered lines; on an OS error keep them for the next try."""
        if not self._pending:
            return
        try:
            if self._dirty:  # drop what a failed write left of a line
                self._repair()
            data = b"".join(self._pending)
            self._write_start = os.fstat(self._file.fileno()).st_size
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
        if self._dirty:
            with contextlib.suppress(OSError):  # drop what the failed write left of a line
                self._repair()
        if self._pending:
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
        self._release()

    def _release(self) -> None:
        """Release the lock (deleting the PID sidecar) and close the file; never raises."""
        with contextlib.suppress(OSError, ValueError):
            unlock_log(self._file.fileno(), self.path)
        with contextlib.suppress(OSError):
            self._file.close()

    def __repr__(self) -> str:
        return f"LogWriter({str(self.path)!r})"


def _read_at(fd: int, offset: int, size: int) -> bytes:
    """``size`` bytes of the open file ``fd`` from ``offset`` (fewer at its end)."""
    chunks = []
    while size > 0:
        if hasattr(os, "pread"):
            chunk = os.pread(fd, size, offset)
        else:  # Windows
            os.lseek(fd, offset, os.SEEK_SET)
            chunk = os.read(fd, size)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)


_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _not_regular(path: str | Path, mode: int) -> OSError:
    kind = _KINDS.get(stat.S_IFMT(mode), "a special file")
    return OSError(
        f"{path} is {kind}, not a regular file; a cockpit log must be a regular file (it is "
        "never opened otherwise): choose another log path."
    )


def _open_regular(path: Path) -> int:
    """Open (or create) the log for reading and appending; refuse anything but a file.

    ``O_NONBLOCK`` keeps the open of a FIFO put in the path's place since
    :func:`check_log_path` from blocking; the opened file is checked with ``fstat``.
    """
    nonblock = getattr(os, "O_NONBLOCK", 0)
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | nonblock | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, 0o666)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        if nonblock:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _last_run(f: IO[bytes]) -> int:
    """The highest run number in a log (headers without ``run`` count 1, 2, ...)."""
    headers = last = 0
    for line in f:
        if HEADER_START.match(line):
            headers += 1
            run = None
            with contextlib.suppress(Exception):
                run = decode_value(line.decode("utf-8"), log_format.MAX_ARRAY_ELEMENTS).get("run")
            last = max(last, run if type(run) is int else headers)
    return max(last, headers, 1)


def check_log_path(path: str | Path) -> None:
    """Raise what :class:`LogWriter` would raise on opening ``path``; creates and changes nothing.

    The one check of a log path: the writer runs it before it creates a folder or opens the
    file, and ``cockpit validate`` runs it on a config's ``log``. A file that does not exist
    yet (in folders that may not exist yet either) passes: the writer creates them.

    It never opens anything but a regular file, so a FIFO never blocks it. It does not
    check whether another writer holds the log (see :class:`LogWriter`).

    Raises:
        LogFormatError: ``path`` exists, is not empty and is not a JSON Lines log.
        OSError: ``path`` is a folder (or a string ending in a slash, which names one), a
            FIFO, a device, a socket or a symbolic link to nothing (a
            ``FileNotFoundError``: the writer never creates a link's target), lies under a
            file (the nearest existing path above it), or cannot be read or written.

    """
    if isinstance(path, str) and path.endswith(("/", os.sep)):
        why = f"{os.strerror(errno.EISDIR)} (the path ends with a slash)"
        raise IsADirectoryError(errno.EISDIR, why, path)
    path = Path(path)
    try:
        mode: int | None = os.stat(path).st_mode  # of the target of a symbolic link
    except OSError:
        mode = None
    if mode is None and os.path.islink(path):
        raise FileNotFoundError(
            f"{path} is a symbolic link to {os.readlink(path)}, which does not exist; cockpit "
            "does not create a link's target: give the path of a file (or of one to be "
            "created), or fix or remove the link."
        )
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if mode is not None and not stat.S_ISREG(mode):
        raise _not_regular(path, mode)
    if mode is not None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with open(fd, "rb") as f:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):  # replaced since the check above
                raise _not_regular(path, mode)
            head = f.read(64)
        torn_start = b"\n" not in head and b'{"kind":'.startswith(head.strip()[:8])
        if head and not RECORD_START.match(head) and not torn_start:
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
