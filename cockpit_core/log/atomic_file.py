"""Replace a file atomically through a fresh temporary file in its folder.

:func:`atomic_write` opens a new file made by :func:`tempfile.mkstemp` in the target's folder
(``.NAME.<random>.tmp``, created exclusively, so a symlink or file planted at a predictable
name is never opened or followed), lets the caller write it, and renames it over the target
with :func:`os.replace`: a reader sees the old file or the new one, whole. On any failure the
temporary file is removed and the target is unchanged. The new file gets the permissions of
the file it replaces, or those a plain ``open`` would give (``0o666`` less the umask).

Only the standard library is imported.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    """The process's umask, read without changing it where the system allows."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    umask = os.umask(0o022)  # no /proc: the portable (not thread-safe) way
    os.umask(umask)
    return umask


def _mode(path: Path) -> int:
    """The permission bits the new file gets: those of ``path`` if it exists."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "wb", durable: bool = False
) -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path``; on success rename it over ``path``.

    Args:
        path: The file to replace (its folder is created if missing).
        mode: ``"wb"`` (binary, default) or ``"w"`` (text, UTF-8).
        durable: fsync the new file before the rename, and the folder after it (POSIX),
            so that the new content survives a power loss, not only a killed process.

    Yields:
        The open temporary file; write the whole content to it.

    Raises:
        OSError: The file cannot be written; ``path`` is unchanged and no temporary file
            is left behind.

    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write: mode must be 'wb' or 'w', got {mode!r}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    permissions = _mode(target)
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        encoding = "utf-8" if mode == "w" else None
        with os.fdopen(handle, mode, encoding=encoding) as out:
            yield out
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.chmod(temporary, permissions)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if durable and os.name == "posix":  # make the rename itself durable
        with contextlib.suppress(OSError):
            folder = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write`)."""
    with atomic_write(path, "w") as out:
        out.write(text)
    return Path(path)
