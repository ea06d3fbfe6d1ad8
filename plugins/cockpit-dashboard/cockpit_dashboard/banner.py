"""The findings banner: the most severe diagnoses' findings as text above the panels.

:func:`findings_banner` writes the most severe findings (see ``docs/diagnoses.md``) as
lines of text above the panels, one line per diagnosis, coloured by the worst severity. It
only adds text to the figure; :func:`cockpit_dashboard.render` calls it for one run with
findings, and :mod:`cockpit_dashboard.markers` shades each finding's steps on the panels it
marks, in the same colours (:data:`COLORS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cockpit_core.diagnosing.findings import as_findings, by_diagnosis
from cockpit_core.diagnosis import Finding

COLORS = {"info": "#1f77b4", "warning": "#d98c00", "error": "#c62828"}
"""Banner colour of each severity."""
FONT_SIZE = 9
"""Font size of the banner in points."""
CHAR_WIDTH = 0.6
"""Widest average character width of the banner's font, in ems: lines are cut to fit."""


def findings_banner(
    fig: Any, findings: Iterable[Finding | Mapping[str, Any]], most: int = 3, y: float = 0.995
) -> Any:
    """Write the ``most`` most severe diagnoses' findings across the top of ``fig``.

    One line per diagnosis (:func:`~cockpit_core.diagnosing.findings.by_diagnosis`): its
    first finding of the most severe and how many stretches it found (:func:`banner_line`),
    cut to the figure's width; ``cockpit diagnose`` gives every finding with the evidence
    and the suggestion.

    Args:
        fig: A matplotlib ``Figure``.
        findings: :class:`~cockpit_core.diagnosis.Finding` objects or ``finding`` records
            (``read_run(path).findings``), in the order to show them within a severity
            (:func:`~cockpit_core.diagnosing.findings.run_findings` gives
            ``cockpit diagnose``'s order).
        most: How many diagnoses to show; a last line counts the findings of the others.
        y: Figure coordinate of the banner's top edge.

    Returns:
        The matplotlib ``Text`` artist, or ``None`` when there are no findings.

    """
    groups = by_diagnosis(as_findings(findings))
    if not groups:
        return None
    fits = int(fig.get_figwidth() * 72 / (FONT_SIZE * CHAR_WIDTH)) - 4  # the box's padding
    lines = [banner_line(group[0], fits, len(group)) for group in groups[:most]]
    if len(groups) > most:
        count = sum(len(group) for group in groups[most:])
        lines.append(f"... and {count} more (cockpit diagnose LOG lists all)")
    worst = groups[0][0].severity
    return fig.text(
        0.01,
        y,
        "\n".join(lines),
        ha="left",
        va="top",
        fontsize=FONT_SIZE,
        color="white",
        bbox={"boxstyle": "round,pad=0.4", "facecolor": COLORS[worst], "edgecolor": "none"},
        gid="cockpit-findings-banner",
    )


def banner_line(finding: Finding, limit: int, stretches: int = 1) -> str:
    """``SEVERITY diagnosis (steps a-b): message``, cut to ``limit`` characters with "…".

    A diagnosis that found several ``stretches`` reads ``(steps a-b; 4 stretches)``, as in
    ``cockpit diagnose``'s report.
    """
    steps = finding.steps + (f"; {stretches} stretches" if stretches > 1 else "")
    line = f"{finding.severity.upper():7} {finding.diagnosis} ({steps}): {finding.message}"
    return line if len(line) <= limit else line[: max(limit - 1, 0)].rstrip() + "…"
