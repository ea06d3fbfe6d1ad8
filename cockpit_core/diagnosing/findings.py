"""Diagnosis findings for the views of a run: which ones, in which order, on which panels.

:func:`run_findings` gives a run's findings as ``cockpit diagnose`` does: the installed
diagnoses run over the whole log (:func:`cockpit_core.diagnosing.run.diagnose`), merged with the
findings recorded while training, each once. A diagnosis that fails is skipped and named
in the returned problems; the dashboards (cockpit-dashboard's picture, the web view) use it.
:func:`by_diagnosis` groups findings, the most severe diagnosis first (the order of a
dashboard's banner).

:func:`diagnosis_reads` and :func:`marks` decide which panels a finding marks, for every
view alike: a panel that shows a quantity the finding's diagnosis reads (looked up in the
installed diagnoses). A diagnosis not installed, or one that reads no quantity
(``nonfinite``), marks no panel.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cockpit_core.diagnosis import Finding, severity_rank
from cockpit_core.errors import CockpitWarning

if TYPE_CHECKING:
    from cockpit_core.log import LogData
    from cockpit_core.plugin.registry import Registry


def by_diagnosis(findings: Sequence[Finding]) -> list[list[Finding]]:
    """The findings grouped by diagnosis, the most severe group first.

    Within a group, and between groups of the same worst severity, the order of
    ``findings`` is kept (the sort is stable): the first finding of a group is its most
    severe one, the earliest given.
    """
    ranked = sorted(findings, key=lambda f: -_rank(f.severity))
    groups: dict[str, list[Finding]] = {}
    for finding in ranked:
        groups.setdefault(finding.diagnosis, []).append(finding)
    return list(groups.values())


def _rank(severity: Any) -> int:
    try:
        return severity_rank(str(severity))
    except ValueError:
        return 0


def _kind(finding: Finding) -> str:
    """What a finding is about, without where: its id up to the last ``@``."""
    return finding.id.rsplit("@", 1)[0]


def merge(found: Sequence[Finding], logged: Sequence[Finding] = ()) -> list[Finding]:
    """The findings ``found`` now, then those ``logged`` while training, each once.

    A finding whose id came before is left out, and so is a logged finding whose stretch
    a finding of the same kind found now overlaps: seeing only the latest steps while
    training, the diagnoses may have dated the same condition differently (another id).

    Args:
        found: Findings of the diagnoses over the whole log (in their order).
        logged: Findings recorded in the log while training (in file order).

    """
    out: list[Finding] = []
    seen: set[str] = set()
    for f in found:
        if f.id not in seen:
            seen.add(f.id)
            out.append(f)
    for f in logged:
        if f.id in seen or any(
            _kind(g) == _kind(f) and g.first_step <= f.last_step and f.first_step <= g.last_step
            for g in found
        ):
            continue
        seen.add(f.id)
        out.append(f)
    return out


def run_findings(
    data: LogData, registry: Registry | None = None, *, offline: bool = True
) -> tuple[list[Finding], list[str]]:
    """A run's findings, as ``cockpit diagnose`` reports them, and what went wrong.

    With ``offline`` the diagnoses of ``registry`` run over all of ``data``
    (:func:`cockpit_core.diagnosing.run.diagnose`, in the order it reports them) and the
    findings recorded while training follow (:func:`merge`); else only the recorded ones
    count, in the order they were reported (:func:`cockpit_core.diagnosing.run.sort_findings`).
    Nothing here raises for a diagnosis: one that fails is skipped (and, if the diagnoses
    cannot run together, each is run alone), and the failure is one of the problems
    returned.

    Args:
        data: The run (:func:`cockpit_core.log.read_run`, or a Cockpit's data).
        registry: Where the diagnoses come from (default: every installed plugin's).
        offline: Run the diagnoses over ``data``; ``False``: the recorded findings only.

    Returns:
        ``(findings, problems)``: the findings, each once; one line per diagnosis that
        failed, or that could not run.

    """
    from cockpit_core.diagnosing.run import diagnose, sort_findings

    logged = list({f.id: f for f in as_findings(data.findings)}.values())  # last of an id
    if not offline:
        return sort_findings(merge([], logged)), []
    problems: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            found = diagnose(data, registry, include_logged=False)
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException:  # noqa: BLE001 - a plugin's diagnosis must not break a plot
            found = _one_by_one(data, registry, problems)
    for w in caught:  # run_checks warns about a diagnosis that raised and was skipped
        if issubclass(w.category, CockpitWarning):
            problems.append(str(w.message).removeprefix("cockpit: "))
    return merge(found, logged), problems


def _one_by_one(data: LogData, registry: Registry | None, problems: list[str]) -> list[Finding]:
    """Each installed diagnosis run alone; those that fail are named in ``problems``."""
    from cockpit_core.diagnosing.run import diagnose

    if registry is None:
        from cockpit_core.plugin.registry import default_registry

        registry = default_registry()
    found: list[Finding] = []
    for name, _ in sorted(registry.diagnoses.items()):
        try:
            found.extend(diagnose(data, registry, [name], include_logged=False))
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as err:  # noqa: BLE001 - skip it, say so
            problems.append(f"diagnosis '{name}' failed and was skipped: {_short(err)}")
    return found


def _short(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:200]


def as_findings(findings: Iterable[Finding | Mapping[str, Any]]) -> list[Finding]:
    """:class:`~cockpit_core.diagnosis.Finding` objects of findings or ``finding`` records."""
    return [f if isinstance(f, Finding) else Finding.from_record(f) for f in findings]


def diagnosis_reads(registry: Registry | None = None) -> dict[str, tuple[str, ...]]:
    """``{diagnosis name: quantity names it reads}`` of the diagnoses of ``registry``.

    Args:
        registry: Where the diagnoses come from (default: every installed plugin's).

    """
    if registry is None:
        from cockpit_core.plugin.registry import default_registry

        registry = default_registry()
    return {name: tuple(entry.cls.reads) for name, entry in registry.diagnoses.items()}


def marks(diagnosis: Any, shown: Iterable[str], reads: Mapping[str, Iterable[str]]) -> bool:
    """Whether a finding of ``diagnosis`` marks a panel showing the quantities ``shown``.

    Args:
        diagnosis: The finding's diagnosis name.
        shown: Names of the quantities the panel shows.
        reads: ``{diagnosis name: quantity names}`` (:func:`diagnosis_reads`).

    """
    return not set(reads.get(str(diagnosis), ())).isdisjoint(shown)
