"""One JSON file replaced atomically: the consolidated output of ``Cockpit.write``."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any

import cockpit_core.log.format as log_format
from cockpit_core.errors import CockpitWarning
from cockpit_core.log.encode import dumps


def write_json_atomic(path: str | Path, value: Any) -> Path:
    """Write ``value`` as one JSON line to ``path`` atomically.

    The text goes to a temporary file in the same folder (``.NAME.*.tmp``), is flushed and
    fsync-ed, and then renamed over ``path`` (``os.replace``): a process killed meanwhile
    leaves the previous file intact (and perhaps the temporary file, which may be deleted).

    Raises:
        OSError: The file cannot be written; ``path`` is unchanged.

    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (dumps(value) + "\n").encode("utf-8")
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if os.name == "posix":  # make the rename itself durable
        with contextlib.suppress(OSError):
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    if len(data) > log_format.MAX_LINE_BYTES:
        warnings.warn(
            f"cockpit: {path} has {len(data)} bytes, more than the readers' default limit of "
            f"{log_format.MAX_LINE_BYTES}; read it with read_log(path, "
            f"max_line_bytes={len(data)}) or use the JSON Lines log (log=...) for long runs.",
            CockpitWarning,
            stacklevel=3,
        )
    return path
