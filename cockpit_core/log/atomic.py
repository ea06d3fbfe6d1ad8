"""One JSON file replaced atomically: the consolidated output of ``Cockpit.write``."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import cockpit_core.log.format as log_format
from cockpit_core.errors import CockpitWarning
from cockpit_core.log.atomic_file import atomic_write
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
    data = (dumps(value) + "\n").encode("utf-8")
    with atomic_write(path, "wb", durable=True) as out:
        out.write(data)
    if len(data) > log_format.MAX_LINE_BYTES:
        warnings.warn(
            f"cockpit: {path} has {len(data)} bytes, more than the readers' default limit of "
            f"{log_format.MAX_LINE_BYTES}; read it with read_log(path, "
            f"max_line_bytes={len(data)}) or use the JSON Lines log (log=...) for long runs.",
            CockpitWarning,
            stacklevel=3,
        )
    return path
