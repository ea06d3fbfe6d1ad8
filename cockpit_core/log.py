"""The streaming log: one JSON record per line, flushed as it is written.

A log file (``.jsonl``) holds a ``header`` record (versions, config, parameters), then
``values`` records (``{"kind": "values", "step": s, "values": {name: value}}``) and
``error`` records. Values are encoded with json-tricks (numpy arrays, NaN and inf
survive). Every record is flushed to the operating system as soon as it is written and
``fsync``-ed to disk at most every ``fsync_every`` seconds, so a run that is killed keeps
every complete line; :func:`read_records` skips a torn last line with a warning.

``Cockpit.write(path)`` writes the same content as one consolidated JSON object
(``{"header": ..., "output": {step: {name: value}}, "errors": [...]}``);
:func:`read_log` and :func:`read_run` load either form into the same structure.

Reading never executes code from the file: json-tricks would by default import and
instantiate any class named in the file (``__instance_type__``), build enums and paths, and
accept any numpy dtype (``object`` arrays). The reader uses one explicit hook that accepts
numpy arrays of numeric dtypes and complex numbers and rejects every other ``__marker__``
entry with :class:`UnsafeLogError`. See ``docs/log_format.md``.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import json_tricks
import numpy as np
from json_tricks.decoders import json_complex_hook, json_numpy_obj_hook

from cockpit_core.errors import CockpitError

LOG_FORMAT_VERSION = 1
"""Version of the record layout; written into each header as ``log_format``."""

_SAFE_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 "
    "complex64 complex128".split()
)
_ALLOWED_MARKERS = frozenset({"__ndarray__", "__complex__"})
_NDARRAY_KEYS = frozenset({"__ndarray__", "dtype", "shape", "Corder", "endian"})


class UnsafeLogError(CockpitError):
    """A log file contains an entry that would import or build arbitrary objects."""


class LogFormatError(CockpitError):
    """A log file is not a cockpit log, or is damaged somewhere other than its last line."""


# -- encoding -----------------------------------------------------------------------------


def _prepare(value: Any, warned: set[str] | None = None) -> Any:
    """Turn ``value`` into plain JSON types and numeric numpy arrays (recursively).

    numpy scalars and 0-d arrays become Python numbers, tuples become lists, dict keys become strings,
    tensors become numpy arrays. Anything else is logged as its ``repr`` string (with one
    warning per type), so that an odd value never stops the log.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return _prepare(value.item(), warned)
        if value.dtype.name in _SAFE_DTYPES:
            return value
        return _prepare(value.tolist(), warned)
    if isinstance(value, Mapping):
        return {str(k): _prepare(v, warned) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_prepare(v, warned) for v in value]
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        array = value.detach().cpu().numpy()
        return array.item() if array.ndim == 0 else _prepare(array, warned)
    kind = type(value).__name__
    if warned is None or kind not in warned:
        if warned is not None:
            warned.add(kind)
        warnings.warn(
            f"cockpit log: a value of type {kind} is not a number, array, list or dict; "
            "it is written as its repr string.",
            stacklevel=3,
        )
    return repr(value)


def dumps(value: Any, *, _warned: set[str] | None = None) -> str:
    """Encode one record on a single line (numpy arrays, NaN and inf preserved)."""
    return json_tricks.dumps(_prepare(value, _warned), allow_nan=True, separators=(",", ":"))


# -- decoding -----------------------------------------------------------------------------


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
        if not isinstance(dtype, str) or dtype not in _SAFE_DTYPES:
            raise UnsafeLogError(
                f"refusing numpy dtype {dtype!r}: cockpit logs hold only numeric arrays "
                f"({', '.join(sorted(_SAFE_DTYPES))}). Nothing from the file was imported or run."
            )
        extra = set(dct) - _NDARRAY_KEYS
        if extra:
            raise UnsafeLogError(f"unexpected keys {sorted(extra)} in a numpy array entry.")
        data = dct["__ndarray__"]
        if not isinstance(data, (list, str, int, float)):
            raise UnsafeLogError("a numpy array entry holds neither numbers nor encoded bytes.")
        try:
            array = json_numpy_obj_hook(dct)
        except (ValueError, TypeError) as err:
            raise LogFormatError(f"malformed numpy array entry: {err}") from None
        return array.item() if isinstance(array, np.generic) else array
    if "__complex__" in dct:
        return json_complex_hook(dct)
    return dct


def loads(text: str) -> Any:
    """Decode one record safely (see the module docstring)."""
    return json_tricks.loads(
        text, obj_pairs_hooks=[_safe_hook], preserve_order=False, ignore_comments=False
    )


# -- writing ------------------------------------------------------------------------------


class LogWriter:
    """Appends records to a JSON Lines file: flushed per record, fsync-ed at an interval.

    Use it as a sink (``writer(record)``); :class:`~cockpit_core.Cockpit` makes one when
    given ``log=path``.

    Args:
        path: File to write (parent folders are created; an existing file is replaced).
        fsync_every: Seconds between ``os.fsync`` calls (``0`` syncs every record, ``None``
            never; ``close`` always syncs unless ``None``). Flushing each record already
            survives a killed process; fsync also survives a crash of the machine.

    """

    def __init__(self, path: str | Path, fsync_every: float | None = 5.0):
        if fsync_every is not None and fsync_every < 0:
            raise ValueError(f"fsync_every must be >= 0 seconds or None, got {fsync_every}.")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - kept open
        self.fsync_every = fsync_every
        self._last_sync = time.monotonic()
        self._warned: set[str] = set()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._file.closed

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line, flush it, fsync if the interval has passed."""
        if self._file.closed:
            raise ValueError(f"the log {self.path} is closed.")
        record = dict(record)
        if record.get("kind") == "header":
            record.setdefault("log_format", LOG_FORMAT_VERSION)
        line = dumps(record, _warned=self._warned)
        self._file.write(line + "\n")
        self._file.flush()
        now = time.monotonic()
        if self.fsync_every is not None and now - self._last_sync >= self.fsync_every:
            os.fsync(self._file.fileno())
            self._last_sync = now

    def close(self) -> None:
        """Flush, fsync and close the file (idempotent)."""
        if not self._file.closed:
            self._file.flush()
            if self.fsync_every is not None:
                os.fsync(self._file.fileno())
            self._file.close()

    def __repr__(self) -> str:
        return f"LogWriter({str(self.path)!r})"


# -- reading ------------------------------------------------------------------------------


@dataclass
class LogData:
    """A log loaded back: what the dashboard and analysis code read.

    Attributes:
        header: The header record (without ``kind``), ``{}`` if the file has none.
        output: ``{step: {quantity_key: value}}``, steps sorted.
        errors: The ``error`` records (quantities that failed at a step).
        skipped: The ``skipped`` records (steps whose quantities were not computed, e.g.
            because the loss was not finite).

    """

    header: dict[str, Any] = field(default_factory=dict)
    output: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a JSON Lines log; a torn last line is skipped with a warning.

    Raises:
        UnsafeLogError: An entry would import or build objects (see the module docstring).
        LogFormatError: A line other than the last is not valid JSON.

    """
    return _records(Path(path).read_bytes(), Path(path))


def _records(raw: bytes, path: Path) -> list[dict[str, Any]]:
    lines = raw.split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = loads(line.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            if i == len(lines) - 1:
                warnings.warn(
                    f"{path}: skipped a torn last line (the run was probably killed while "
                    "writing it); every complete record before it was read.",
                    stacklevel=3,
                )
                continue
            raise LogFormatError(
                f"{path}: line {i + 1} is not valid JSON (only the last line of a killed "
                "run may be incomplete); the file is damaged."
            ) from None
        if not isinstance(record, dict):
            raise LogFormatError(f"{path}: line {i + 1} is not a JSON object.")
        records.append(record)
    return records


def _consolidated(raw: bytes, path: Path) -> dict[str, Any] | None:
    """The content of a consolidated JSON file, or ``None`` if ``raw`` is JSON Lines."""
    body = raw.strip()
    if not body.startswith(b"{"):
        raise LogFormatError(f"{path} is not a cockpit log: it does not start with a JSON object.")
    if b"\n" in body:
        try:  # JSON Lines if the first line is a record on its own
            json.loads(body.split(b"\n", 1)[0])
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass  # perhaps a pretty-printed consolidated file
    try:
        data = loads(body.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # a JSON Lines log whose only line is torn
    if isinstance(data, dict) and "kind" not in data:
        return data
    return None


def read_run(path: str | Path) -> LogData:
    """Load a JSON Lines log or a consolidated JSON file (header, values, errors).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UnsafeLogError: An entry would import or build objects; nothing was run.
        LogFormatError: The file is not a cockpit log or is damaged before its last line.

    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no log file at {path}")
    raw = path.read_bytes()
    if not raw.strip():
        raise LogFormatError(f"{path} is empty: not a cockpit log.")
    data = _consolidated(raw, path)
    if data is not None:
        if "output" not in data:
            raise LogFormatError(
                f"{path} is a JSON object without 'output': not a cockpit log (write one with "
                "Cockpit(..., log='run/log.jsonl') or cp.write('run/output.json'))."
            )
        try:
            output = {int(step): dict(values) for step, values in data["output"].items()}
        except (ValueError, TypeError, AttributeError):
            raise LogFormatError(f"{path}: 'output' must map step numbers to values.") from None
        return LogData(
            header=dict(data.get("header") or {}),
            output=dict(sorted(output.items())),
            errors=list(data.get("errors") or []),
            skipped=list(data.get("skipped") or []),
        )
    run = LogData()
    for record in _records(raw, path):
        kind = record.get("kind")
        if kind == "header":
            run.header = {k: v for k, v in record.items() if k != "kind"}
        elif kind == "values":
            try:
                step = int(record["step"])
                values = dict(record["values"])
            except (KeyError, ValueError, TypeError):
                raise LogFormatError(f"{path}: malformed values record {record!r:.200}") from None
            run.output.setdefault(step, {}).update(values)
        elif kind == "error":
            run.errors.append(record)
        elif kind == "skipped":
            run.skipped.append(record)
    run.output = dict(sorted(run.output.items()))
    return run


def read_log(path: str | Path) -> dict[int, dict[str, Any]]:
    """Load a JSON Lines log or a consolidated JSON file into ``{step: {name: value}}``.

    Both forms give the same structure; a torn last line of a JSON Lines log is skipped
    with a warning. Nothing in the file is ever imported or executed (see
    :class:`UnsafeLogError`).
    """
    return read_run(path).output
