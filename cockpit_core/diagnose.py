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
    from cockpit_core.name_table import NameTable
    from cockpit_core.registry import Registry
    from cockpit_core.registry_entries import DiagnosisEntry

USAGE_EXIT = 2
"""Exit code of ``cockpit diagnose`` for a log that cannot be read, an unknown name or bad options."""


def build_diagnoses(
    specs: Iterable[str | Mapping[str, Any]] | None = None,
    registry: Registry | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Diagnosis]:
    """Diagnosis objects from names or ``{"name": ..., **options}`` dicts (``None``: all).

    Args:
        specs: Names or ``{"name": ..., **options}`` of the diagnoses (``None``: every
            installed diagnosis, with default options).
        registry: Where the diagnoses come from (default: the installed plugins).
        options: ``{name: {option: value}}`` set on top of ``specs``, on every entry of that
            name (``cockpit diagnose --set NAME.OPTION=VALUE``).

    Raises:
        UnknownDiagnosisError: A name no installed plugin registers (with the closest one).
        ConfigError: Invalid options of a diagnosis (``diagnoses.<name>.<option>: ...``), an
            entry without a name, or ``options`` of a diagnosis that is not in ``specs``.

    """
    if registry is None:
        from cockpit_core.registry import default_registry

        registry = default_registry()
    table = registry.diagnoses
    chosen: list[tuple[str, DiagnosisEntry, dict[str, Any]]] = []
    if specs is None:
        chosen = [(name, entry, {}) for name, entry in sorted(table.items())]
    else:
        for i, spec in enumerate(specs):
            if isinstance(spec, Mapping):
                name, opts = spec.get("name"), {k: v for k, v in spec.items() if k != "name"}
            else:
                name, opts = spec, {}
            if not isinstance(name, str):
                raise ConfigError([(f"diagnoses.{i}.name", "a diagnosis needs a name")])
            chosen.append((name, _entry(table, name), opts))
    extra = dict(options or {})
    _check_options(extra, {name for name, _, _ in chosen}, table)
    return [_build(name, entry, {**opts, **extra.get(name, {})}) for name, entry, opts in chosen]


def _entry(table: NameTable[DiagnosisEntry], name: str) -> DiagnosisEntry:
    """The registry entry of the diagnosis ``name``; unknown: the closest name in the error."""
    entry = table.lookup(name)
    if entry is None:
        raise UnknownDiagnosisError(name, [n for n, _ in table.items()])
    return entry


def _check_options(
    options: Mapping[str, Mapping[str, Any]], chosen: set[str], table: NameTable[DiagnosisEntry]
) -> None:
    """Raise if ``options`` name an unknown diagnosis, one not ``chosen``, or set ``name``."""
    errors = []
    for name, opts in options.items():
        _entry(table, name)
        if name not in chosen:
            errors.append(
                (
                    f"diagnoses.{name}",
                    "options of a diagnosis that does not run: select it too (those that "
                    f"run: {', '.join(sorted(chosen)) or 'none'})",
                )
            )
        if "name" in opts:
            errors.append((f"diagnoses.{name}.name", "the name is not an option"))
    if errors:
        raise ConfigError(errors)


def _build(name: str, entry: DiagnosisEntry, options: Mapping[str, Any]) -> Diagnosis:
    """``entry``'s diagnosis with ``options``, pydantic's errors as a :class:`ConfigError`."""
    try:
        return entry.cls(**options)
    except ValidationError as err:
        raise ConfigError(
            [(".".join(["diagnoses", name, *map(str, e["loc"])]), e["msg"]) for e in err.errors()]
        ) from None


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
    options: Mapping[str, Mapping[str, Any]] | None = None,
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
        options: ``{name: {option: value}}`` on top of ``names`` (or of every installed
            diagnosis): ``options={"cost": {"severity": "warning"}}``.

    Raises:
        FileNotFoundError: No file at the path.
        LogFormatError: The file is not a readable cockpit log.
        UnknownDiagnosisError: A name in ``names`` or ``options`` is not installed.
        ConfigError: Invalid options, or ``options`` of a diagnosis not in ``names``.

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
        build_diagnoses(wanted, registry, options),
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


def run_cli(
    logs: Sequence[str],
    as_json: bool = False,
    only: str | None = None,
    config: str | None = None,
    settings: Sequence[str] = (),
) -> int:
    """``cockpit diagnose LOG... [--json] [--only NAME,...] [--config FILE] [--set ...]``.

    Which diagnoses run with which options: :mod:`cockpit_core.diagnose_options`.

    Args:
        logs: The log files.
        as_json: Print JSON instead of the report.
        only: Comma-separated names of the diagnoses to run (``--only``).
        config: A config file whose ``diagnoses`` to run (``--config``).
        settings: ``NAME.OPTION=VALUE`` options on top (``--set``).

    Returns:
        The exit code. 0: no finding of severity warning or above; 1: some; 2
        (:data:`USAGE_EXIT`): a log cannot be read, or the diagnoses to run or their
        options are not valid (message on standard error).

    """
    from cockpit_core.diagnose_options import config_diagnoses, options_from_settings, select_only
    from cockpit_core.errors import DuplicateNameError
    from cockpit_core.log import LogFormatError
    from cockpit_core.registry import default_registry

    names = None if only is None else [n.strip() for n in only.split(",") if n.strip()]
    results = []
    try:
        options = options_from_settings(settings)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT
    try:
        registry = default_registry()
        specs = None if config is None else config_diagnoses(config, registry)
        specs = select_only(specs, names, registry, config)
        build_diagnoses(specs, registry, options)  # every problem before reading a log
        for path in logs:
            results.append((path, diagnose(path, registry, specs, options=options)))
    except (OSError, LogFormatError, UnknownDiagnosisError, DuplicateNameError, ConfigError) as err:
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
