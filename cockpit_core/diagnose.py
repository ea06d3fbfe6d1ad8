"""Running diagnoses: on a log (:func:`diagnose`, ``cockpit diagnose``) and while training.

Offline, :func:`diagnose` reads a log with :func:`cockpit_core.log.read_run` and runs every
installed diagnosis (or the named ones) over all of it. While training,
:class:`cockpit_core.diagnosis_runner.DiagnosisRunner` runs them on the records a run emits.
A diagnosis that raises never stops either: it is skipped with a warning. See
``docs/diagnoses.md``.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from cockpit_core.diagnosis import (
    SEVERITIES,
    Diagnosis,
    Finding,
    UnknownDiagnosisError,
    Window,
    severity_rank,
)
from cockpit_core.errors import CockpitWarning, ConfigError

if TYPE_CHECKING:  # the registry imports the protocol; the runner looks it up lazily
    from cockpit_core.log import LogData
    from cockpit_core.registry import Registry

USAGE_EXIT = 2
"""Exit code of ``cockpit diagnose`` for a log that cannot be read or an unknown name."""


def build_diagnoses(
    specs: Iterable[str | Mapping[str, Any]] | None = None, registry: Registry | None = None
) -> list[Diagnosis]:
    """Diagnosis objects from names or ``{"name": ..., **options}`` dicts (``None``: all).

    Raises:
        UnknownDiagnosisError: A name no installed plugin registers (with the closest one).
        ConfigError: Invalid options of a diagnosis (``diagnoses.<name>.<option>: ...``).

    """
    if registry is None:
        from cockpit_core.registry import default_registry

        registry = default_registry()
    table = registry.diagnoses
    if specs is None:
        return [entry.cls() for _, entry in sorted(table.items())]
    out = []
    for spec in specs:
        if isinstance(spec, Mapping):
            name, options = spec["name"], {k: v for k, v in spec.items() if k != "name"}
        else:
            name, options = spec, {}
        entry = table.lookup(name)
        if entry is None:
            raise UnknownDiagnosisError(name, [n for n, _ in table.items()])
        try:
            out.append(entry.cls(**options))
        except ValidationError as err:
            raise ConfigError(
                [
                    (".".join(["diagnoses", name, *map(str, e["loc"])]), e["msg"])
                    for e in err.errors()
                ]
            ) from None
    return out


def run_checks(
    diagnoses: Sequence[Diagnosis], window: Window, failed: set[str] | None = None
) -> list[Finding]:
    """Every finding of ``diagnoses`` in ``window``; a diagnosis that raises is warned about.

    With ``failed``, a diagnosis that raised is added to it and skipped from then on.
    """
    found: list[Finding] = []
    for diagnosis in diagnoses:
        if (failed is not None and diagnosis.name in failed) or not diagnosis.applies(window):
            continue
        try:
            found.extend(diagnosis.check(window))
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except Exception as err:  # noqa: BLE001 - plugin code must not stop a run or a report
            if failed is not None:
                failed.add(diagnosis.name)
            warnings.warn(
                f"cockpit: diagnosis '{diagnosis.name}' failed and was skipped: "
                f"{type(err).__name__}: {err}",
                CockpitWarning,
                stacklevel=2,
            )
    return sort_findings(found)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """By first step, the most severe first within a step, then by id."""
    return sorted(findings, key=lambda f: (f.first_step, -severity_rank(f.severity), f.id))


def diagnose(
    log_or_output: str | Path | LogData | Mapping[int, Mapping[str, Any]],
    registry: Registry | None = None,
    names: Iterable[str | Mapping[str, Any]] | None = None,
    *,
    include_logged: bool = True,
) -> list[Finding]:
    """Run diagnoses over a whole log and return their findings, sorted by step.

    Args:
        log_or_output: A log path (``.jsonl`` or consolidated ``.json``), a
            :class:`~cockpit_core.log.LogData`, or ``{step: {key: value}}`` (e.g.
            ``cp.get_output()``).
        registry: Where the diagnoses come from (default: the installed plugins).
        names: Names or ``{"name": ..., **options}`` of the diagnoses to run (default all).
        include_logged: Also return the findings recorded in the log while training whose
            id no diagnosis found again (e.g. of a diagnosis not installed here).

    Raises:
        FileNotFoundError: No file at the path.
        LogFormatError: The file is not a readable cockpit log.
        UnknownDiagnosisError: A name in ``names`` is not installed.

    """
    from cockpit_core.log import LogData, read_run

    if isinstance(log_or_output, (str, Path)):
        data = read_run(log_or_output)
    elif isinstance(log_or_output, LogData):
        data = log_or_output
    else:
        data = LogData(output={s: dict(v) for s, v in log_or_output.items()})
    wanted = None if names is None else list(names)
    found = run_checks(
        build_diagnoses(wanted, registry),
        Window(data.output, data.skipped, data.header, data.cost),
    )
    if include_logged:
        seen = {f.id for f in found}
        chosen = (
            None if wanted is None else {w if isinstance(w, str) else w["name"] for w in wanted}
        )
        for record in data.findings:
            if record["id"] in seen or (chosen is not None and record["diagnosis"] not in chosen):
                continue
            seen.add(record["id"])
            found.append(Finding.from_record(record))
    return sort_findings(found)


# -- the command line ---------------------------------------------------------------------


def exit_code(findings: Iterable[Finding]) -> int:
    """0 if no finding is of severity ``warning`` or above, else 1."""
    return int(any(severity_rank(f.severity) >= severity_rank("warning") for f in findings))


def report_text(path: str, findings: Sequence[Finding]) -> str:
    """The terminal report of one log: a summary line, then each finding with its evidence."""
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    summary = ", ".join(f"{n} {s}{'s' * (n > 1)}" for s, n in counts.items() if n)
    summary = summary or "no findings"
    lines = [f"{path}: {summary}"]
    for f in findings:
        lines.append(f"  {f.line()}")
        if f.evidence:
            shown = ", ".join(f"{k}={_short(v)}" for k, v in f.evidence.items())
            lines.append(f"      evidence: {shown}")
        if f.suggestion:
            lines.append(f"      suggestion: {f.suggestion}")
        if f.source:
            lines.append(f"      source: {f.source}")
    return "\n".join(lines)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and len(value) > 6:
        return "[" + ", ".join(_short(v) for v in value[:6]) + f", ... ({len(value)} in all)]"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def run_cli(logs: Sequence[str], as_json: bool = False, only: str | None = None) -> int:
    """``cockpit diagnose LOG... [--json] [--only NAME,...]``; returns the exit code.

    0: no finding of severity warning or above; 1: some; 2 (:data:`USAGE_EXIT`): a log
    cannot be read or a name in ``only`` is not installed (message on standard error).
    """
    from cockpit_core.log import LogFormatError

    names = None if only is None else [n.strip() for n in only.split(",") if n.strip()]
    results = []
    try:
        for path in logs:
            results.append((path, diagnose(path, names=names)))
    except (OSError, LogFormatError, UnknownDiagnosisError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT
    everything = [f for _, found in results for f in found]
    if as_json:
        payload = {
            "logs": [{"path": p, "findings": [f.to_record() for f in fs]} for p, fs in results],
            "exit_code": exit_code(everything),
        }
        print(json.dumps(payload, indent=2, allow_nan=True))
    else:
        print("\n".join(report_text(p, fs) for p, fs in results))
    return exit_code(everything)
