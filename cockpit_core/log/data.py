"""A log loaded back, :class:`LogData`, and how records fold into it.

:meth:`LogData.add` folds the records of one run as it is written (what a running
Cockpit's sinks receive); :func:`merge_runs` folds the records of a whole JSON Lines log,
which may hold several runs: for every step the latest run that recorded it wins. Reading
files (limits, format checks) is :mod:`cockpit_core.log.read`'s job; here the records
are already checked. See :mod:`cockpit_core.log`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cockpit_core.engine.metrics import METRICS_KEY, metrics_of


@dataclass
class LogData:
    """A log loaded back: what the dashboard and analysis code read.

    Attributes:
        header: The last header record (without ``kind``), ``{}`` if the file has none.
        output: ``{step: {quantity_key: value}}``, steps sorted. A step that several runs
            recorded holds the values of the latest of them. Metrics logged with
            ``cp.log`` are under the key ``"metrics"`` (``{name: value}``), as in
            ``cp.get_output()``; of a step whose metrics several runs logged, the latest
            run's metrics are kept.
        errors: The ``error`` records (quantities that failed at a step, values written as
            placeholders), except those of steps that a later run recorded again.
        skipped: The ``skipped`` records (steps whose quantities were not computed, e.g.
            because the loss was not finite), likewise.
        headers: Every run's header, in file order (``header`` is the last). A quantity
            added with ``cp.add`` is listed in its run's header with ``added_at``.
        added: ``{"step": s, "quantity": {"name", "key", options...}}`` for each quantity
            added with ``cp.add`` during a run (every run, in file order); ``step`` is the
            first step it applies to.
        removed: The same for each quantity removed with ``cp.remove``; ``step`` is the
            first step it no longer applies to. Its run's header lists it with
            ``removed_at``.
        resumed: ``{"step": s, "from_run": r}`` for each run that continues an earlier one
            from a checkpoint (``cp.load_state_dict``): ``s`` is the checkpoint's last step,
            ``r`` the run that saved it. Values such a run records under steps up to ``s``
            (two-step quantities that started before the checkpoint) complete that step's
            values instead of replacing them.
        findings: The ``finding`` records (without ``kind``) that diagnoses reported while
            training (every run, in file order, the last record of each id; see
            ``docs/diagnoses.md``).
        cost: The ``cost`` records (what cockpit cost at each tracked step, see
            :mod:`cockpit_core.engine.cost`), by run in file order, except those of steps that a
            later run recorded again.

    """

    header: dict[str, Any] = field(default_factory=dict)
    output: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, Any]] = field(default_factory=list)
    added: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    resumed: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    cost: list[dict[str, Any]] = field(default_factory=list)

    @property
    def metrics(self) -> dict[int, dict[str, Any]]:
        """``{step: {name: value}}`` of the steps with metrics logged by ``cp.log``."""
        return metrics_of(self.output)

    def add(self, record: Mapping[str, Any]) -> None:
        """Fold one record of a running Cockpit (what its sinks receive) into this data.

        For readers that follow a single run as it is written (the live plot, sinks that
        draw the dashboard); :func:`~cockpit_core.log.read_run` reads whole files with several
        runs.
        """
        kind = record.get("kind")
        if kind == "header":
            self.header = {k: v for k, v in record.items() if k != "kind"}
        elif kind == "values":
            self.output.setdefault(int(record["step"]), {}).update(record["values"])
        elif kind == "metrics":
            row = self.output.setdefault(int(record["step"]), {})
            row[METRICS_KEY] = {**row.get(METRICS_KEY, {}), **record["metrics"]}
        elif kind == "error":
            self.errors.append(dict(record))
        elif kind == "skipped":
            self.skipped.append(dict(record))
        elif kind in ("quantity_added", "quantity_removed"):
            change = {"step": record["step"], "quantity": dict(record["quantity"])}
            (self.added if kind == "quantity_added" else self.removed).append(change)
            quantities = list(self.header.get("quantities") or [])
            self.header = {**self.header, "quantities": listed(quantities, [(kind, change)])}
        elif kind == "resumed":
            self.resumed.append({k: v for k, v in record.items() if k != "kind"})
        elif kind == "finding":
            add_finding(self.findings, record)
        elif kind == "cost":
            self.cost.append(dict(record))


def listed(quantities: list[Any], changes: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Any]:
    """A header's ``quantities`` after ``cp.add``/``cp.remove`` changes, in their order.

    An added quantity is appended with ``added_at``; a removed one gains ``removed_at`` on
    the last entry of its key that has none.
    """
    out = [dict(q) if isinstance(q, dict) else q for q in quantities]
    for kind, change in changes:
        if kind == "quantity_added":
            out.append({**change["quantity"], "added_at": change["step"]})
            continue
        key = change["quantity"].get("key")
        for entry in reversed(out):
            if isinstance(entry, dict) and entry.get("key") == key and "removed_at" not in entry:
                entry["removed_at"] = change["step"]
                break
    return out


def add_finding(findings: list[dict[str, Any]], record: Mapping[str, Any]) -> None:
    """Append a ``finding`` record (without ``kind``), or replace the one with its id.

    A finding is logged again with the same id when its stretch grew after it was first
    reported (``docs/log_format.md``); the last record of an id is the finding.
    """
    finding = {k: v for k, v in record.items() if k != "kind"}
    for i, earlier in enumerate(findings):
        if earlier.get("id") == finding.get("id"):
            findings[i] = finding
            return
    findings.append(finding)


def _new_run(header: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "header": header,
        "steps": set(),
        "values": {},
        "events": [],
        "metrics": {},
        "changes": [],
        "resumed": None,
        "findings": [],
        "cost": [],
    }


def merge_runs(records: Iterable[dict[str, Any]]) -> LogData:
    """Merge the runs of a log: the latest run that records a step decides that step.

    Args:
        records: The records of a JSON Lines log in file order, already checked (as
            :func:`~cockpit_core.log.read_records` gives them); a ``header`` record after
            other records starts a new run.

    Returns:
        The log's :class:`LogData` (see its attributes for what each run contributes).

    """
    runs = [_new_run()]
    for record in records:
        kind = record.get("kind")
        run = runs[-1]
        if kind == "header":
            header = {k: v for k, v in record.items() if k != "kind"}
            if run["header"] is None and not run["steps"] and not run["events"]:
                run["header"] = header
            else:
                runs.append(_new_run(header))
        elif kind == "values":
            run["values"].setdefault(record["step"], {}).update(record["values"])
            run["steps"].add(record["step"])
        elif kind in ("error", "skipped"):
            if "step" in record:
                run["steps"].add(record["step"])
            run["events"].append(record)
        elif kind == "metrics":  # metrics claim their step apart from the quantities' values
            run["metrics"].setdefault(record["step"], {}).update(record["metrics"])
        elif kind in ("quantity_added", "quantity_removed"):
            change = {"step": record["step"], "quantity": dict(record["quantity"])}
            run["changes"].append((kind, change))
        elif kind == "resumed":
            run["resumed"] = {k: v for k, v in record.items() if k != "kind"}
        elif kind == "finding":
            add_finding(run["findings"], record)
        elif kind == "cost":
            run["cost"].append(record)
    data = LogData()
    claimed: set[int] = set()
    kept: list[list[dict[str, Any]]] = []
    completions: dict[int, list[dict[str, Any]]] = {}  # of resumed runs, latest first
    for run in reversed(runs):
        resumed = run["resumed"]["step"] if run["resumed"] is not None else None
        for step, values in run["values"].items():
            if step in claimed:
                continue
            if resumed is not None and step <= resumed:  # completes the earlier run's step
                completions.setdefault(step, []).append(values)
            else:
                data.output[step] = values
        kept.append([e for e in run["events"] if e.get("step") not in claimed])
        run["cost"] = [c for c in run["cost"] if c["step"] not in claimed]
        claimed |= {s for s in run["steps"] if resumed is None or s > resumed}
    for step, parts in completions.items():
        merged = dict(data.output.get(step, {}))
        for values in reversed(parts):
            merged.update(values)
        data.output[step] = merged
    for events in reversed(kept):
        for event in events:
            (data.errors if event["kind"] == "error" else data.skipped).append(event)
    logged: set[int] = set()
    for run in reversed(runs):
        for step, metrics in run["metrics"].items():
            if step not in logged:
                data.output[step] = {**data.output.get(step, {}), METRICS_KEY: metrics}
        logged |= set(run["metrics"])
    for run in runs:
        for kind, change in run["changes"]:
            (data.added if kind == "quantity_added" else data.removed).append(change)
        if run["resumed"] is not None:
            data.resumed.append(run["resumed"])
        for finding in run["findings"]:
            add_finding(data.findings, finding)
        data.cost.extend(run["cost"])
        if run["changes"]:
            header = dict(run["header"] or {})
            quantities = header.get("quantities")
            header["quantities"] = listed(
                quantities if isinstance(quantities, list) else [], run["changes"]
            )
            run["header"] = header
    data.headers = [run["header"] for run in runs if run["header"] is not None]
    data.header = data.headers[-1] if data.headers else {}
    data.output = dict(sorted(data.output.items()))
    return data
