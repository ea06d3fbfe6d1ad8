"""The streaming log: one JSON record per line, flushed as it is written.

A log file (``.jsonl``) holds a ``header`` record (versions, config, parameters), then
``values`` records (``{"kind": "values", "step": s, "values": {name: value}}``) and
``error`` records. Values are encoded with json-tricks (numpy arrays, NaN and inf
survive). A run that is killed keeps every complete line; :func:`read_log` skips a torn
last line with a warning.

Reading never executes code from the file: json-tricks would by default import and
instantiate any class named in the file, so the reader uses an explicit list of safe hooks
(numpy arrays and scalars of numeric dtypes only) and rejects everything else.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import json_tricks
from json_tricks.decoders import json_complex_hook, json_numpy_obj_hook

from cockpit_core.errors import CockpitError

_SAFE_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 "
    "complex64 complex128".split()
)
_ALLOWED_MARKERS = frozenset({"__ndarray__", "__complex__"})


class UnsafeLogError(CockpitError):
    """A log file contains an entry that would import or build arbitrary objects."""


def dumps(value: Any) -> str:
    """Encode one record on a single line (numpy arrays, NaN and inf preserved)."""
    return json_tricks.dumps(value, allow_nan=True, separators=(",", ":"))


def _safe_hook(dct: Any) -> Any:
    """The only decoding hook: numeric numpy arrays and complex numbers, nothing else."""
    if not isinstance(dct, dict):
        return dct
    markers = [k for k in dct if isinstance(k, str) and k.startswith("__") and k.endswith("__")]
    for marker in markers:
        if marker not in _ALLOWED_MARKERS:
            raise UnsafeLogError(
                f"refusing to decode a '{marker}' entry: cockpit logs hold only numbers, strings "
                "and numeric arrays, so this file was not written by cockpit or was altered. "
                "Nothing from it was imported or run."
            )
    if "__ndarray__" in dct:
        dtype = dct.get("dtype")
        if dtype not in _SAFE_DTYPES:
            raise UnsafeLogError(
                f"refusing numpy dtype {dtype!r}: only numeric dtypes are allowed."
            )
        return json_numpy_obj_hook(dct)
    if "__complex__" in dct:
        return json_complex_hook(dct)
    return dct


def loads(text: str) -> Any:
    """Decode one record safely (see the module docstring)."""
    return json_tricks.loads(text, obj_pairs_hooks=[_safe_hook], preserve_order=False)


class LogWriter:
    """Appends records to a JSON Lines file, flushing each and fsyncing every ``fsync_every`` s.

    Args:
        path: File to write (parent folders are created; an existing file is replaced).
        fsync_every: Seconds between ``os.fsync`` calls; ``None`` disables fsync.

    """

    def __init__(self, path: str | Path, fsync_every: float | None = 5.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - kept open
        self._fsync_every = fsync_every
        self._last_sync = time.monotonic()

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line."""
        self._file.write(dumps(dict(record)) + "\n")
        self._file.flush()
        now = time.monotonic()
        if self._fsync_every is not None and now - self._last_sync >= self._fsync_every:
            os.fsync(self._file.fileno())
            self._last_sync = now

    def close(self) -> None:
        """Flush, fsync and close the file."""
        if not self._file.closed:
            self._file.flush()
            if self._fsync_every is not None:
                os.fsync(self._file.fileno())
            self._file.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a log; a torn last line is skipped with a warning."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                warnings.warn(
                    f"{path}: skipped a torn last line (the run was probably killed while writing).",
                    stacklevel=2,
                )
                continue
            raise CockpitError(f"{path}: line {i + 1} is not valid JSON.") from None
    return records


def read_log(path: str | Path) -> dict[int, dict[str, Any]]:
    """Load a JSON Lines log or a consolidated JSON file into ``{step: {name: value}}``."""
    path = Path(path)
    text_start = path.read_text(encoding="utf-8")[:1]
    if path.suffix == ".json" and text_start == "{":
        data = loads(path.read_text(encoding="utf-8"))
        return {int(step): values for step, values in data.get("output", data).items()}
    output: dict[int, dict[str, Any]] = {}
    for record in read_records(path):
        if record.get("kind") == "values":
            output.setdefault(int(record["step"]), {}).update(record["values"])
    return dict(sorted(output.items()))
