"""One writer per log: an advisory lock on the log file, its holder's PID in a sidecar.

:class:`~cockpit_core.log.LogWriter` calls :func:`lock_log` on the file descriptor it
writes through, before it reads or changes anything in the file, and :func:`unlock_log` on
:meth:`~cockpit_core.log.LogWriter.close`.

**What is locked.** The lock is ``fcntl.flock(fd, LOCK_EX | LOCK_NB)`` on the log file
itself (the open file that the writer appends to), not on a separate lock file:

* it protects the very file (inode) that is written: a renamed or moved log keeps its lock,
  and no stale, deleted or replaced lock file can ever let two writers in;
* it needs nothing else to exist or be writable, and leaves nothing behind that could be
  mistaken for a held lock: the kernel releases it when the writer closes the file and when
  the process dies (even with ``kill -9``);
* ``flock`` locks belong to an open file, not to a process, so a second writer in the same
  process (a second ``Cockpit`` on the same path) is refused just like one in another
  process.

A lock on the log file cannot carry the holder's PID (the log holds only records), so the
writer writes its PID into a small sidecar file, ``.NAME.lock`` next to the log, once it
holds the lock, and deletes it when it closes (before it releases the lock). The sidecar is
information only, for the error message of a refused writer: a stale one (left by a killed
process) is harmless and is overwritten by the next writer.

The lock is advisory: it keeps cockpit writers apart, not other programs that ignore it.
On platforms without ``fcntl`` (Windows) there is no lock: every writer opens the log (see
:data:`HAVE_LOCK`). A process forked while it holds the lock (e.g. a ``DataLoader``
worker started with ``fork``) shares it; :func:`unlock_log` releases it for all of them.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
from pathlib import Path

from cockpit_core.errors import LogLockedError

try:
    import fcntl
except ImportError:  # Windows: no flock; a log is not protected against a second writer
    fcntl = None  # type: ignore[assignment]

HAVE_LOCK = fcntl is not None
"""Whether logs are locked on this platform (``False`` where there is no ``fcntl``)."""


def sidecar_path(path: str | Path) -> Path:
    """The file next to the log ``path`` that names its writer's PID: ``.NAME.lock``.

    Symbolic links are followed: every name of a log shares the sidecar of its file.
    """
    path = Path(os.path.realpath(path))
    return path.with_name(f".{path.name}.lock")


def _try_flock(fd: int) -> bool:
    """Take the exclusive lock without waiting; whether it was free."""
    assert fcntl is not None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _holder_pid(path: Path) -> int | None:
    """The PID written in the sidecar of ``path``, if it can be read."""
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(sidecar_path(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        try:
            text = os.read(fd, 64)
        finally:
            os.close(fd)
        return int(text.split()[0])
    return None


def locked_message(path: str | Path, pid: int | None) -> str:
    """The message of :class:`~cockpit_core.errors.LogLockedError` for ``path``."""
    sidecar = sidecar_path(path)
    if pid is None:
        who = f"another process (its PID could not be read from {sidecar})"
    elif pid == os.getpid():
        who = f"another Cockpit (or LogWriter) in this process (PID {pid})"
    else:
        who = f"another process (PID {pid})"
    return (
        f"cockpit log: {path} is being written by {who}; a log has one writer at a time. "
        "Give this Cockpit another log path (log=...), or close the other Cockpit "
        "(cp.close()) or wait for that process to end, then try again."
    )


def lock_log(fd: int, path: str | Path) -> None:
    """Lock the open log file ``fd`` for this writer and write its PID into the sidecar.

    Call it before reading or changing the file. Does nothing where there is no ``fcntl``.

    Raises:
        LogLockedError: Another writer holds the lock (in this or another process); the
            message names ``path``, the holder's PID and what to do.

    """
    if fcntl is None:  # Windows: no advisory lock; one writer per log is up to the user
        return
    if not _try_flock(fd):
        pid = _holder_pid(Path(path))
        if pid == os.getpid():  # perhaps a writer of this process that is only garbage now
            gc.collect()
        if pid != os.getpid() or not _try_flock(fd):
            raise LogLockedError(locked_message(path, pid))
    with contextlib.suppress(OSError):  # information only: a log in a read-only folder
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        side = os.open(sidecar_path(path), flags | os.O_NONBLOCK, 0o644)
        try:
            os.write(side, f"{os.getpid()}\n".encode())
        finally:
            os.close(side)


def unlock_log(fd: int, path: str | Path) -> None:
    """Delete the sidecar (if it still names this process) and release the lock of ``fd``.

    Never raises. The sidecar goes first, so the next writer's PID is never deleted.
    """
    if fcntl is None:
        return
    if _holder_pid(Path(path)) == os.getpid():
        with contextlib.suppress(OSError):
            os.unlink(sidecar_path(path))
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
