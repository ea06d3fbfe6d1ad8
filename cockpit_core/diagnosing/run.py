"""Running diagnoses: on a log (:func:`diagnose`, ``cockpit diagnose``) and while training.

Offline, :func:`diagnose` reads a log with :func:`cockpit_core.log.read_run` and runs every
installed diagnosis (or the named ones) over all of it. While training,
:class:`cockpit_core.diagnosing.runner.DiagnosisRunner` runs them on the records a run emits.
A diagnosis that raises never stops either: it is skipped with a warning.

The report of a log (:func:`report_entries`, :func:`report_text`, ``--json``) lists the
findings the most severe first, then the latest stretch first; the findings of one
diagnosis with the same severity and advice form one :class:`Entry` listing their
stretches; and when two findings advise opposite directions on one knob
(:attr:`~cockpit_core.diagnosis.Finding.advice`) over overlapping steps, the
:class:`~cockpit_core.diagnosis.Precedence` rules of the installed diagnoses say whose
evidence wins (the other is listed under it as overruled) or, when none decides, one
conflict entry names both. See ``docs/diagnoses.md``.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit_core.diagnosing.build import build_diagnoses
from cockpit_core.diagnosing.options import config_diagnoses, options_from_settings, select_only
from cockpit_core.diagnosis import (
    SEVERITIES,
    Diagnosis,
    Finding,
    Precedence,
    UnknownDiagnosisError,
    Window,
    severity_rank,
)
from cockpit_core.errors import CockpitWarning, ConfigError

if TYPE_CHECKING:  # the registry imports the protocol; the runner looks it up lazily
    from cockpit_core.log import LogData
    from cockpit_core.plugin.registry import Registry

USAGE_EXIT = 2
"""Exit code of ``cockpit diagnose`` for a log that cannot be read, an unknown name or bad options."""


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
    """In time order: by first step, the most severe first within a step, then by id.

    The order in which findings are reported while training; a report of a log uses
    :func:`report_order`.
    """
    return sorted(findings, key=lambda f: (f.first_step, -severity_rank(f.severity), f.id))


def rank_key(finding: Finding) -> tuple[int, int, int, bool, str]:
    """The sort key of :func:`report_order`."""
    return (
        -severity_rank(finding.severity),
        -finding.last_step,
        finding.first_step,
        bool(finding.advice),
        finding.id,
    )


def report_order(findings: Iterable[Finding]) -> list[Finding]:
    """The most severe first, then the latest stretch first (by last step).

    Ties (a condition that lasts to the end of the log often ends with others): the longer
    stretch first; then a finding that advises no knob (a defect to fix, such as dead
    layers) before one that advises tuning a knob; then by id.
    """
    return sorted(findings, key=rank_key)


def diagnose(
    log_or_output: str | Path | LogData | Mapping[int, Mapping[str, Any]],
    registry: Registry | None = None,
    names: Iterable[str | Mapping[str, Any]] | None = None,
    *,
    include_logged: bool = True,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Finding]:
    """Run diagnoses over a whole log and return their findings in :func:`report_order`.

    Every finding is returned, each stretch on its own; :func:`report_entries` groups them
    and resolves opposite advice as ``cockpit diagnose`` shows them.

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
    return report_order(found)


# -- the report: order, grouping and opposite advice -------------------------------------


@dataclass(frozen=True)
class Overruled:
    """A finding whose advice on ``knob`` yields to the opposite advice of finding ``by``.

    Attributes:
        finding: The overruled finding.
        by: Id of the finding whose evidence wins.
        knob: The knob they advise opposite directions on.
        because: Why ``by``'s evidence wins (:attr:`~cockpit_core.diagnosis.Precedence.because`).

    """

    finding: Finding
    by: str
    knob: str
    because: str

    def to_json(self) -> dict[str, Any]:
        """``{"id", "by", "knob", "direction", "because"}``."""
        direction = self.finding.advice.get(self.knob, "")
        return {
            "id": self.finding.id,
            "by": self.by,
            "knob": self.knob,
            "direction": direction,
            "because": self.because,
        }


@dataclass(frozen=True)
class Entry:
    """One entry of a report: a group of findings, or a conflict between findings.

    A group holds the findings of one diagnosis with the same severity and advice, latest
    stretch first (:func:`report_order`): one finding, or the stretches of a condition that
    came back. A conflict (``conflict`` names its knobs) holds findings of several
    diagnoses that advise opposite directions on those knobs over overlapping steps with no
    :class:`~cockpit_core.diagnosis.Precedence` rule to decide, in report order.

    Attributes:
        findings: The findings, in report order (the first is the entry's head).
        overruled: Findings folded into this entry: its evidence outranks their opposite
            advice.
        conflict: The knobs of a conflict; empty for a group.

    """

    findings: tuple[Finding, ...]
    overruled: tuple[Overruled, ...] = ()
    conflict: tuple[str, ...] = ()

    @property
    def head(self) -> Finding:
        """The first finding: the most severe, and latest, of the entry."""
        return self.findings[0]

    @property
    def severity(self) -> str:
        """The severity of the entry (of its most severe finding)."""
        return self.head.severity

    def to_json(self) -> dict[str, Any]:
        """The entry for ``cockpit diagnose --json``.

        ``{"kind": "group" | "conflict", "diagnosis", "severity", "message", "advice",
        "ids", "stretches": [[first, last], ...], "overruled": [...]}``; a conflict has
        ``"diagnosis": null``, its ``"knobs"`` and ``"sides": {knob: {"up": [ids], "down":
        [ids]}}`` instead of ``advice``.
        """
        out: dict[str, Any] = {
            "kind": "conflict" if self.conflict else "group",
            "diagnosis": None if self.conflict else self.head.diagnosis,
            "severity": self.severity,
            "message": _conflict_message(self) if self.conflict else self.head.message,
            "ids": [f.id for f in self.findings],
            "stretches": [[f.first_step, f.last_step] for f in self.findings],
            "overruled": [o.to_json() for o in self.overruled],
        }
        if self.conflict:
            out["knobs"] = list(self.conflict)
            out["sides"] = {
                knob: {
                    d: [f.id for f in self.findings if f.advice.get(knob) == d]
                    for d in ("up", "down")
                }
                for knob in self.conflict
            }
        else:
            out["advice"] = dict(self.head.advice)
        return out


def precedence_rules(registry: Registry | None = None) -> list[Precedence]:
    """The :class:`~cockpit_core.diagnosis.Precedence` rules of the installed diagnoses.

    Args:
        registry: Where the diagnoses come from (default: the installed plugins).

    Returns:
        Every rule of every diagnosis's ``precedence``, each once, by diagnosis name.

    """
    if registry is None:
        from cockpit_core.plugin.registry import default_registry

        registry = default_registry()
    rules: list[Precedence] = []
    for _, entry in sorted(registry.diagnoses.items()):
        rules.extend(r for r in entry.cls.precedence if r not in rules)
    return rules


def report_entries(
    findings: Iterable[Finding], rules: Sequence[Precedence] | None = None
) -> list[Entry]:
    """The entries of the report of one run: ordered, grouped, opposite advice resolved.

    1. Two findings whose stretches overlap and whose advice turns a knob opposite ways:
       when a rule makes one's evidence win (and no rule the other's), the other is
       overruled and listed under the winner's entry; otherwise they are in conflict.
       An overruled finding's advice no longer counts, so it is in no conflict.
    2. Findings in conflict (linked by conflicts, on any knob) form one conflict entry.
    3. The other findings form groups: one per diagnosis, severity and advice.
    4. Entries in :func:`report_order` of their head: the most severe, then the latest first.

    Args:
        findings: The findings of one run (:func:`diagnose`).
        rules: The precedence rules (default: :func:`precedence_rules` of the installed
            diagnoses).

    Returns:
        The entries; together with their ``overruled`` they hold every finding once.

    """
    ordered = report_order(findings)
    if rules is None:
        rules = precedence_rules()
    beaten: dict[int, list[tuple[int, str, str]]] = {}  # loser: [(winner, knob, because)]
    clashes: list[tuple[int, int, str]] = []
    advised = [i for i, f in enumerate(ordered) if f.advice]
    for i, j in combinations(advised, 2):
        a, b = ordered[i], ordered[j]
        if a.first_step > b.last_step or b.first_step > a.last_step:
            continue
        for knob in sorted(a.advice.keys() & b.advice.keys()):
            if a.advice[knob] == b.advice[knob]:
                continue
            a_wins, b_wins = _rule(rules, a, b, knob), _rule(rules, b, a, knob)
            if a_wins is not None and b_wins is None:
                beaten.setdefault(j, []).append((i, knob, a_wins.because))
            elif b_wins is not None and a_wins is None:
                beaten.setdefault(i, []).append((j, knob, b_wins.because))
            else:
                clashes.append((i, j, knob))
    hosts: dict[int, tuple[int, Overruled]] = {}  # overruled: (finding shown, record)
    for loser, wins in beaten.items():
        for winner, knob, because in sorted(wins):  # the first winner in report order
            host = _host(winner, beaten, {loser})
            if host is not None:
                record = Overruled(ordered[loser], ordered[winner].id, knob, because)
                hosts[loser] = (host, record)
                break
    group_of = {i: i for i in range(len(ordered))}  # union-find over the conflicts

    def root(i: int) -> int:
        while group_of[i] != i:
            i = group_of[i]
        return i

    knobs: dict[int, set[str]] = {}
    for i, j, knob in clashes:
        if i in hosts or j in hosts:
            continue
        ri, rj = root(i), root(j)
        group_of[max(ri, rj)] = min(ri, rj)
        knobs.setdefault(i, set()).add(knob)
        knobs.setdefault(j, set()).add(knob)
    members: dict[tuple[Any, ...], list[int]] = {}
    for i, f in enumerate(ordered):
        if i in hosts:
            continue
        if i in knobs:
            key: tuple[Any, ...] = ("conflict", root(i))
        else:
            key = ("group", f.diagnosis, f.severity, tuple(sorted(f.advice.items())))
        members.setdefault(key, []).append(i)
    entries = []
    for indices in members.values():
        shown = set(indices)
        overruled = tuple(o for host, o in hosts.values() if host in shown)
        conflict = sorted({k for i in indices for k in knobs.get(i, ())})
        entries.append(Entry(tuple(ordered[i] for i in indices), overruled, tuple(conflict)))
    return sorted(entries, key=lambda e: rank_key(e.head))


def _rule(
    rules: Sequence[Precedence], winner: Finding, loser: Finding, knob: str
) -> Precedence | None:
    """The first rule that makes ``winner``'s advice on ``knob`` outrank ``loser``'s."""
    return next((r for r in rules if r.decides(winner, loser, knob)), None)


def _host(i: int, beaten: Mapping[int, list[tuple[int, str, str]]], seen: set[int]) -> int | None:
    """The finding shown on its own under which finding ``i`` is listed.

    ``i`` itself when nothing overrules it, else its first winner's host; ``None`` in a
    cycle of rules.
    """
    if i not in beaten:
        return i
    for winner, _, _ in sorted(beaten[i]):
        if winner not in seen:
            host = _host(winner, beaten, seen | {i})
            if host is not None:
                return host
    return None


# -- the command line ---------------------------------------------------------------------


def exit_code(findings: Iterable[Finding]) -> int:
    """0 if no finding is of severity ``warning`` or above, else 1."""
    return int(any(severity_rank(f.severity) >= severity_rank("warning") for f in findings))


def report_text(
    path: str, findings: Sequence[Finding], entries: Sequence[Entry] | None = None
) -> str:
    """The terminal report of one log: a summary line, then each entry with its evidence.

    Args:
        path: The log, for the summary line.
        findings: Every finding of the log (the summary counts them).
        entries: The entries to show (default: :func:`report_entries` of ``findings`` with
            the installed diagnoses' rules).

    """
    if entries is None:
        entries = report_entries(findings)
    counts = {s: sum(f.severity == s for f in findings) for s in reversed(SEVERITIES)}
    summary = ", ".join(f"{n} {s}{'s' * (n > 1)}" for s, n in counts.items() if n)
    if summary and len(entries) < len(findings):
        summary += f" in {len(entries)} entr{'ies' if len(entries) > 1 else 'y'}"
    lines = [f"{path}: {summary or 'no findings'}"]
    for entry in entries:
        lines.extend(_conflict_lines(entry) if entry.conflict else _group_lines(entry))
        for o in entry.overruled:
            f = o.finding
            lines.append(f"      overrules {f.diagnosis} ({f.severity}, {f.steps}): {f.message}")
            lines.append(f'          not "{_advice_words(o.knob, f.advice[o.knob])}": {o.because}')
    return "\n".join(lines)


def _group_lines(entry: Entry) -> list[str]:
    """A group: its head's line, its stretches, evidence, suggestion and source."""
    f = entry.head
    if len(entry.findings) == 1:
        lines = [f"  {f.line()}"]
    else:
        n = len(entry.findings)
        named = len({g.case for g in entry.findings}) > 1  # e.g. norm_test and inner_test
        stretches = [
            (str(g.first_step) if g.first_step == g.last_step else f"{g.first_step}-{g.last_step}")
            + f" ({g.case})" * named
            for g in entry.findings
        ]
        lines = [
            f"  {f.severity.upper():7} {f.diagnosis}: {f.message} ({f.steps}; {n} stretches)",
            f"      stretches (latest first): {', '.join(stretches)}",
        ]
    if f.evidence:
        shown = ", ".join(f"{k}={_short(v)}" for k, v in f.evidence.items())
        lines.append(f"      evidence{f' ({f.steps})' * (len(entry.findings) > 1)}: {shown}")
    if f.suggestion:
        lines.append(f"      suggestion: {f.suggestion}")
    if f.source:
        lines.append(f"      source: {f.source}")
    return lines


def _conflict_lines(entry: Entry) -> list[str]:
    """A conflict: what disagrees, then each finding with its advice and suggestion."""
    lines = [f"  {entry.severity.upper():7} conflict: {_conflict_message(entry)}"]
    for f in entry.findings:
        advice = "; ".join(_advice_words(k, f.advice[k]) for k in entry.conflict if k in f.advice)
        lines.append(f"      {advice}: {f.diagnosis} ({f.severity}, {f.steps}): {f.message}")
        if f.suggestion:
            lines.append(f"          suggestion: {f.suggestion}")
    return lines


def _conflict_message(entry: Entry) -> str:
    """``opposite advice on the learning rate over steps a-b, and no rule ...``."""
    first = min(f.first_step for f in entry.findings)
    last = max(f.last_step for f in entry.findings)
    knobs = " and ".join(f"the {k.replace('_', ' ')}" for k in entry.conflict)
    names = ", ".join(dict.fromkeys(f.diagnosis for f in entry.findings))
    return (
        f"{names} advise opposite directions on {knobs} over steps {first}-{last}, and no "
        "rule says whose evidence wins: read both findings before you turn it"
    )


def _advice_words(knob: str, direction: str) -> str:
    """``raise the learning rate`` for ``("learning_rate", "up")``."""
    verb = {"up": "raise", "down": "lower"}.get(direction, direction)
    return f"{verb} the {knob.replace('_', ' ')}"


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

    Which diagnoses run with which options: :mod:`cockpit_core.diagnosing.options`.

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
    from cockpit_core.errors import DuplicateNameError, escape_controls
    from cockpit_core.log import LogFormatError
    from cockpit_core.plugin.registry import default_registry

    names = None if only is None else [n.strip() for n in only.split(",") if n.strip()]
    results = []
    try:
        options = options_from_settings(settings)
    except ValueError as err:
        print(f"error: {escape_controls(str(err))}", file=sys.stderr)
        return USAGE_EXIT
    try:
        registry = default_registry()
        specs = None if config is None else config_diagnoses(config, registry)
        specs = select_only(specs, names, registry, config)
        build_diagnoses(specs, registry, options)  # every problem before reading a log
        for path in logs:
            results.append((path, diagnose(path, registry, specs, options=options)))
    except (OSError, LogFormatError, UnknownDiagnosisError, DuplicateNameError, ConfigError) as err:
        print(f"error: {escape_controls(str(err))}", file=sys.stderr)
        return USAGE_EXIT
    everything = [f for _, found in results for f in found]
    rules = precedence_rules(registry)
    reports = [(p, fs, report_entries(fs, rules)) for p, fs in results]
    if as_json:
        payload = {
            "logs": [{"path": p, **report_json(fs, es)} for p, fs, es in reports],
            "exit_code": exit_code(everything),
        }
        print(json.dumps(payload, indent=2, allow_nan=True))
    else:
        print("\n".join(report_text(p, fs, es) for p, fs, es in reports))
    return exit_code(everything)


def report_json(findings: Sequence[Finding], entries: Sequence[Entry]) -> dict[str, Any]:
    """``{"findings": [...], "entries": [...]}`` of one log for ``cockpit diagnose --json``.

    ``findings`` holds every finding's record in report order, each with ``entry``, the
    index of the entry that shows it, and, when overruled, ``overruled_by``: ``{"id",
    "knob", "because"}``. ``entries`` holds :meth:`Entry.to_json` of each entry.
    """
    where: dict[str, dict[str, Any]] = {}
    for k, entry in enumerate(entries):
        for f in entry.findings:
            where[f.id] = {"entry": k}
        for o in entry.overruled:
            by = {"id": o.by, "knob": o.knob, "because": o.because}
            where[o.finding.id] = {"entry": k, "overruled_by": by}
    return {
        "findings": [{**f.to_record(), **where.get(f.id, {})} for f in findings],
        "entries": [e.to_json() for e in entries],
    }
