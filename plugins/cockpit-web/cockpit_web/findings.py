"""Findings in the web view: the list above the panels and the shaded steps on the panels.

A finding (``docs/diagnoses.md``) comes from running the installed diagnoses over the log
(:func:`cockpit_core.diagnosing.findings.run_findings`, as ``cockpit diagnose`` does) or
from a ``finding`` record of the log (a diagnosis that ran while training), each once.
Each becomes an entry of the page's ``findings`` list, and a shaded span from its
``first_step`` to its ``last_step`` on every panel that shows a quantity its diagnosis
reads (looked up in the installed diagnoses; a diagnosis not installed here, or one that
reads no quantity such as ``nonfinite``, marks no panel). Which panels a finding marks is
decided as on the matplotlib dashboard (:func:`cockpit_core.diagnosing.findings.marks`).
The page lists them grouped (:func:`groups`): one row per diagnosis and run, its
stretches inside.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cockpit_core.diagnosing.findings import diagnosis_reads, marks
from cockpit_core.diagnosis import severity_rank

__all__ = ["COLORS", "OPACITY", "diagnosis_reads", "entries", "groups", "mark"]

COLORS = {"info": "#1f77b4", "warning": "#ff7f0e", "error": "#d62728"}
"""Fill colour of a finding's span (and its list entry) by severity."""

OPACITY = 0.15
"""Opacity of the shaded span: the curves stay readable."""


def entries(
    runs: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
    panels: Sequence[Mapping[str, Any]],
    reads: Mapping[str, Sequence[str]],
) -> list[dict[str, Any]]:
    """The page's findings list: each finding of each run, with the panels it marks.

    Args:
        runs: ``(run label, finding records)`` per run (``Finding.to_record()`` fields).
        panels: The page's panels (``id`` and ``quantities``, see
            :func:`cockpit_web.panels.figures`).
        reads: ``{diagnosis name: quantity names}`` (:func:`diagnosis_reads`).

    Returns:
        ``[{"run", "id", "diagnosis", "severity", "first_step", "last_step", "message",
        "suggestion", "source", "panels": [panel ids]}]``, the most severe first, else in
        the order given (``cockpit diagnose``'s, run by run).

    """
    out = []
    for label, findings in runs:
        for f in findings:
            out.append(
                {
                    "run": label,
                    **{
                        k: f.get(k)
                        for k in (
                            "id",
                            "diagnosis",
                            "severity",
                            "first_step",
                            "last_step",
                            "message",
                            "suggestion",
                            "source",
                        )
                    },
                    "panels": [
                        p["id"]
                        for p in panels
                        if marks(f.get("diagnosis"), p.get("quantities", ()), reads)
                    ],
                }
            )
    return sorted(out, key=lambda e: -_rank(e["severity"]))  # stable: the given order


def groups(findings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The findings list as the page shows it: one group per run and diagnosis.

    Args:
        findings: Entries of :func:`entries` (the most severe first).

    Returns:
        ``[{"run", "diagnosis", "id", "severity", "message", "suggestion", "source",
        "first_step", "last_step", "count", "panels", "stretches": [{"id", "severity",
        "first_step", "last_step", "message"}]}]`` in the order of their first entries:
        the group's id, severity, message, suggestion and source are those of its first
        (most severe) entry; its steps span all its stretches, which are sorted by first
        step.

    """
    out: dict[tuple[Any, Any], dict[str, Any]] = {}
    for f in findings:
        group = out.get((f["run"], f["diagnosis"]))
        if group is None:
            group = out[(f["run"], f["diagnosis"])] = {
                **{k: f.get(k) for k in ("run", "diagnosis", "id", "severity", "message")},
                **{k: f.get(k) for k in ("suggestion", "source")},
                "first_step": f.get("first_step"),
                "last_step": f.get("last_step"),
                "count": 0,
                "panels": [],
                "stretches": [],
            }
        group["count"] += 1
        group["panels"] += [p for p in f.get("panels", ()) if p not in group["panels"]]
        group["stretches"].append(
            {k: f.get(k) for k in ("id", "severity", "first_step", "last_step", "message")}
        )
        for key, pick in (("first_step", min), ("last_step", max)):
            steps = [s for s in (group[key], f.get(key)) if isinstance(s, int)]
            group[key] = pick(steps) if steps else None
    for group in out.values():
        group["stretches"].sort(key=lambda s: (_step(s["first_step"]), str(s["id"])))
    return list(out.values())


def _step(value: Any) -> int:
    return value if isinstance(value, int) else 0


def mark(panels: Sequence[dict[str, Any]], findings: Sequence[Mapping[str, Any]]) -> None:
    """Add each finding's shaded span to the layout of the panels it marks (in place).

    A span is a plotly rectangle over the full height, from ``first_step - 0.5`` to
    ``last_step + 0.5`` (a one-step finding stays visible), below the traces, named by the
    finding's id (``run: id`` with several runs).
    """
    several = len({f["run"] for f in findings}) > 1
    by_id = {p["id"]: p for p in panels}
    for f in findings:
        if not isinstance(f.get("first_step"), int) or not isinstance(f.get("last_step"), int):
            continue
        for panel_id in f["panels"]:
            layout = by_id[panel_id]["figure"]["layout"]
            layout.setdefault("shapes", []).append(
                {
                    "type": "rect",
                    "name": f"{f['run']}: {f['id']}" if several else f["id"],
                    "xref": "x",
                    "yref": "paper",
                    "x0": f["first_step"] - 0.5,
                    "x1": f["last_step"] + 0.5,
                    "y0": 0,
                    "y1": 1,
                    "fillcolor": COLORS.get(f["severity"], COLORS["info"]),
                    "opacity": OPACITY,
                    "line": {"width": 0},
                    "layer": "below",
                }
            )


def _rank(severity: Any) -> int:
    try:
        return severity_rank(str(severity))
    except ValueError:
        return 0
