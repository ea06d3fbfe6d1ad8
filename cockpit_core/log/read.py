"""Reading log files back, bounded: :func:`read_run`, :func:`read_log`, :func:`read_records`.

Reads a JSON Lines log (several runs; for every step the latest run that recorded it wins)
or a consolidated JSON file into a :class:`~cockpit_core.log.data.LogData` (the records
are folded by :mod:`cockpit_core.log.data`). A line may hold at most
:data:`~cockpit_core.log.MAX_LINE_BYTES` bytes, the arrays of a file at most
:data:`~cockpit_core.log.MAX_DECODED_BYTES` plus :data:`~cockpit_core.log.MAX_DECODED_RATIO`
bytes per byte read, a torn last line is skipped with a warning, and every malformed input
raises :class:`~cockpit_core.log.LogFormatError` naming the file and the line, or saying
that the file as a whole is not a cockpit log. See :mod:`cockpit_core.log`.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import cockpit_core.log.format as log_format
from cockpit_core.diagnosis import SEVERITIES as FINDING_SEVERITIES
from cockpit_core.errors import CockpitWarning
from cockpit_core.log.data import LogData, merge_runs
from cockpit_core.log.decode import Budget, LogFormatError, decode_value
from cockpit_core.log.format import RECORD_START


def _limits(max_line_bytes: int | None, max_array_elements: int | None) -> tuple[int, int]:
    return (
        log_format.MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes,
        log_format.MAX_ARRAY_ELEMENTS if max_array_elements is None else max_array_elements,
    )


def _only_blank_after(f: IO[bytes]) -> bool:
    while chunk := f.read(1 << 20):
        if chunk.strip():
            return False
    return True


def check_record(record: Any) -> str | None:
    """What is wrong with the shape of one decoded record, ``None`` if nothing.

    The one set of shape checks of every reader (:func:`read_run`, :func:`read_records`,
    the web view's follower): a JSON object; an integer ``step`` where the kind has one;
    ``values``/``metrics`` objects; ``quantity`` entries with string ``name`` and ``key``;
    a header's ``quantities`` and ``params`` lists; complete ``finding`` records.
    """
    if not isinstance(record, dict):
        return "is not a JSON object."
    kind = record.get("kind")
    if kind in (
        "values",
        "metrics",
        "quantity_added",
        "quantity_removed",
        "cost",
        "resumed",
    ) or (kind in ("error", "skipped") and "step" in record):
        step = record.get("step")
        if type(step) is not int:
            return f"'step' must be an integer, got {step!r:.40}."
    if kind == "values" and not isinstance(record.get("values"), dict):
        return "'values' must be a JSON object."
    if kind == "metrics" and not isinstance(record.get("metrics"), dict):
        return "'metrics' must be a JSON object."
    if kind in ("quantity_added", "quantity_removed") and not _is_quantity_entry(
        record.get("quantity")
    ):
        return "'quantity' must be a JSON object with string 'name' and 'key'."
    if kind == "header":
        for name in ("quantities", "params"):
            listed = record.get(name)
            if listed is not None and not isinstance(listed, list):
                return f"a header's {name!r} must be a list, got {listed!r:.40}."
    if kind == "finding" and not _is_finding(record):
        return (
            "a 'finding' record needs string 'id', 'diagnosis' and 'message', integer "
            f"'first_step' and 'last_step', a 'severity' of {', '.join(FINDING_SEVERITIES)} "
            "and an object 'evidence'."
        )
    return None


def decode_record(
    line: bytes | str, max_elements: int | None = None, budget: Budget | None = None
) -> dict[str, Any]:
    """One line of a JSON Lines log as a checked record: the one decoder of every reader.

    Args:
        line: The line (UTF-8).
        max_elements: Largest array decoded (default :data:`MAX_ARRAY_ELEMENTS`).
        budget: The decoding budget of the read it belongs to (default: a new one).

    Raises:
        json.JSONDecodeError, UnicodeDecodeError: Not (complete) JSON text.
        LogFormatError: A malformed entry, a limit exceeded, or a record of the wrong
            shape (:func:`check_record`).

    """
    if max_elements is None:
        max_elements = log_format.MAX_ARRAY_ELEMENTS
    text = line.decode("utf-8") if isinstance(line, (bytes, bytearray)) else line
    record = decode_value(text, max_elements, budget)
    problem = check_record(record)
    if problem is not None:
        raise LogFormatError(problem)
    assert isinstance(record, dict)  # check_record checked it
    return record


def _iter_records(
    f: IO[bytes],
    path: Path,
    max_line_bytes: int,
    max_elements: int,
    budget: Budget,
    skipped: list[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Every complete record (checked); a torn last line is skipped with a warning.

    With ``skipped`` a damaged or malformed line is skipped and its problem appended there
    (``"line N: ..."``) instead of raising.
    """
    number = 0
    while line := f.readline(max_line_bytes + 1):
        number += 1
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            raise LogFormatError(
                f"{path}, line {number} is longer than the limit of {max_line_bytes} bytes; "
                "pass a larger max_line_bytes to read it anyway."
            )
        if not line.strip():
            continue
        try:
            record = decode_record(line, max_elements, budget)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if _only_blank_after(f):
                warnings.warn(
                    f"{path}: skipped a torn last line (the run was probably killed while "
                    "writing it); every complete record before it was read.",
                    CockpitWarning,
                    stacklevel=4,
                )
                return
            if skipped is not None:
                skipped.append(f"line {number}: not valid JSON")
                continue
            raise LogFormatError(
                f"{path}, line {number} is not valid JSON (only the last line of a killed run "
                "may be incomplete); the file is damaged."
            ) from None
        except LogFormatError as err:
            if skipped is not None:
                skipped.append(f"line {number}: {err}")
                continue
            if str(err) == "is not a JSON object.":
                raise type(err)(f"{path}, line {number} is not a JSON object.") from None
            raise type(err)(f"{path}, line {number}: {err}") from None
        yield record


def _is_finding(record: Any) -> bool:
    """A ``finding``: string id/diagnosis/message, integer steps, a known severity."""
    return (
        isinstance(record, dict)
        and all(isinstance(record.get(k), str) for k in ("id", "diagnosis", "message"))
        and all(type(record.get(k)) is int for k in ("first_step", "last_step"))
        and record.get("severity") in FINDING_SEVERITIES
        and isinstance(record.get("evidence", {}), dict)
    )


def read_records(
    path: str | Path,
    *,
    max_line_bytes: int | None = None,
    max_array_elements: int | None = None,
    max_decoded_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """Every complete record of a JSON Lines log; a torn last line is skipped with a warning.

    Args:
        path: The log.
        max_line_bytes: Longest line read (default :data:`MAX_LINE_BYTES`).
        max_array_elements: Largest array read (default :data:`MAX_ARRAY_ELEMENTS`).
        max_decoded_bytes: Bytes the file's arrays may take besides
            :data:`MAX_DECODED_RATIO` per byte read (default :data:`MAX_DECODED_BYTES`).

    Raises:
        UnsafeLogError: An entry would import or build objects (see :mod:`cockpit_core.log`).
        LogFormatError: A line other than the last is not valid JSON, or any line holds a
            malformed entry or exceeds a limit.

    """
    path = Path(path)
    line_limit, elements = _limits(max_line_bytes, max_array_elements)
    with open(path, "rb") as f:
        return list(_iter_records(f, path, line_limit, elements, Budget(max_decoded_bytes)))


def _is_quantity_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and isinstance(entry.get("key"), str)
    )


def _not_a_log(path: Path, why: str) -> LogFormatError:
    """The error about the file as a whole (not one of its lines)."""
    return LogFormatError(f"{path} is not a cockpit log: the file {why}.")


def _from_consolidated(data: Any, path: Path) -> LogData:
    if not isinstance(data, dict):
        raise _not_a_log(path, "holds a single number or array entry, not a JSON object")
    if "output" not in data:
        raise _not_a_log(
            path,
            "is a JSON object without 'output' (write a log with Cockpit(..., "
            "log='run/log.jsonl') or cp.write('run/output.json'))",
        )
    output = data["output"]
    bad = LogFormatError(f"{path}: 'output' must map step numbers to values.")
    if not isinstance(output, dict):
        raise bad
    steps = {}
    for key, values in output.items():
        if not (re.fullmatch(r"-?\d{1,20}", key) and isinstance(values, dict)):
            raise bad
        steps[int(key)] = dict(values)
    header = data.get("header") or {}
    lists = {name: data.get(name) or [] for name in ("errors", "skipped")}
    if not isinstance(header, dict) or not all(
        isinstance(v, list) and all(isinstance(e, dict) for e in v) for v in lists.values()
    ):
        raise LogFormatError(
            f"{path}: 'header' must be an object, 'errors' and 'skipped' lists of objects."
        )
    listed = header.get("quantities")
    entries = [q for q in (listed if isinstance(listed, list) else []) if isinstance(q, dict)]
    marks = ("added_at", "removed_at")
    added, removed = (
        [
            {"step": q[mark], "quantity": {k: v for k, v in q.items() if k not in marks}}
            for q in entries
            if type(q.get(mark)) is int
        ]
        for mark in marks
    )
    findings = data.get("findings") or []
    if not (isinstance(findings, list) and all(_is_finding(f) for f in findings)):
        raise LogFormatError(
            f"{path}: 'findings' must be a list of finding objects (see docs/log_format.md)."
        )
    return LogData(
        header=dict(header),
        output=dict(sorted(steps.items())),
        errors=list(lists["errors"]),
        skipped=list(lists["skipped"]),
        headers=[dict(header)] if header else [],
        added=added,
        removed=removed,
        findings=[dict(f) for f in findings],
    )


def _read_consolidated(
    f: IO[bytes], path: Path, line_limit: int, elements: int, budget: Budget
) -> LogData:
    f.seek(0)
    raw = f.read(line_limit + 1)
    if len(raw) > line_limit:
        raise LogFormatError(
            f"{path} is a JSON file of more than {line_limit} bytes; pass a larger "
            "max_line_bytes to read it anyway."
        )
    lines = raw.count(b"\n", 0, len(raw.rstrip())) + 1
    try:
        data = decode_value(raw.decode("utf-8"), elements, budget)
    except json.JSONDecodeError as err:
        raise LogFormatError(
            f"{path}, line {err.lineno}: not valid JSON ({err.msg}); a file cut short, or not "
            "a cockpit log."
        ) from None
    except UnicodeDecodeError:
        raise _not_a_log(path, "is not UTF-8 text") from None
    except LogFormatError as err:
        where = "line 1" if lines == 1 else f"lines 1-{lines}"
        raise type(err)(f"{path}, {where}: {err}") from None
    return _from_consolidated(data, path)


def read_run(
    path: str | Path,
    *,
    max_line_bytes: int | None = None,
    max_array_elements: int | None = None,
    max_decoded_bytes: int | None = None,
    skipped: list[str] | None = None,
) -> LogData:
    """Load a JSON Lines log or a consolidated JSON file (header, values, errors).

    A JSON Lines log may hold several runs (a resumed training appends one): for every
    step, the latest run that recorded it wins; ``header`` is the last run's header.

    Args:
        path: The file.
        max_line_bytes: Longest line (or consolidated file) read (default
            :data:`MAX_LINE_BYTES`).
        max_array_elements: Largest array read (default :data:`MAX_ARRAY_ELEMENTS`).
        max_decoded_bytes: Bytes the file's arrays may take besides
            :data:`MAX_DECODED_RATIO` per byte read (default :data:`MAX_DECODED_BYTES`).
        skipped: If given, a line of a JSON Lines log that is damaged or holds a record of
            the wrong shape is skipped and its problem (``"line N: ..."``) appended here,
            instead of raising (what the web view does; the rest is folded as usual).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UnsafeLogError: An entry would import or build objects; nothing was run.
        LogFormatError: The file is not a cockpit log (the message says so of the file as
            a whole), is damaged before its last line, holds a malformed entry or exceeds
            a limit (the message names the line).

    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no log file at {path}")
    line_limit, elements = _limits(max_line_bytes, max_array_elements)
    new_budget = functools.partial(Budget, max_decoded_bytes)  # one for each pass
    with open(path, "rb") as f:
        first, number = b"", 0
        while not first.strip():
            first, number = f.readline(line_limit + 1), number + 1
            if not first:
                raise _not_a_log(path, "is empty or blank")
        if not first.lstrip().startswith(b"{"):
            raise _not_a_log(path, "does not start with a JSON object")
        if not RECORD_START.match(first):
            if len(first) > line_limit and not first.endswith(b"\n"):
                return _read_consolidated(f, path, line_limit, elements, new_budget())
            try:
                single = decode_value(first.decode("utf-8"), elements, new_budget())
            except (json.JSONDecodeError, UnicodeDecodeError):  # pretty-printed or cut short
                return _read_consolidated(f, path, line_limit, elements, new_budget())
            except LogFormatError as err:
                raise type(err)(f"{path}, line {number}: {err}") from None
            if not (isinstance(single, dict) and "kind" in single) and _only_blank_after(f):
                return _from_consolidated(single, path)
            del single
        del first
        f.seek(0)
        return merge_runs(_iter_records(f, path, line_limit, elements, new_budget(), skipped))


def read_log(
    path: str | Path,
    *,
    max_line_bytes: int | None = None,
    max_array_elements: int | None = None,
    max_decoded_bytes: int | None = None,
) -> dict[int, dict[str, Any]]:
    """Load a JSON Lines log or a consolidated JSON file into ``{step: {name: value}}``.

    Both forms give the same structure; a torn last line of a JSON Lines log is skipped
    with a warning, and of steps recorded by several runs the latest run wins. Nothing in
    the file is ever imported or executed (see :class:`UnsafeLogError`); limits as in
    :func:`read_run`.
    """
    return read_run(
        path,
        max_line_bytes=max_line_bytes,
        max_array_elements=max_array_elements,
        max_decoded_bytes=max_decoded_bytes,
    ).output
