"""A banner of diagnosis findings across the top of a dashboard figure.

:func:`findings_banner` writes the most severe findings (see ``docs/diagnoses.md``) as
lines of text above the panels, coloured by the worst severity. It only adds text to the
figure; :func:`cockpit_core.dashboard.render` calls it for one run with findings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cockpit_core.diagnosis import Finding, severity_rank

COLORS = {"info": "#1f77b4", "warning": "#d98c00", "error": "#c62828"}
"""Banner colour of each severity."""


def findings_banner(
    fig: Any, findings: Iterable[Finding | Mapping[str, Any]], most: int = 3, y: float = 0.995
) -> Any:
    """Write the ``most`` most severe findings across the top of ``fig``; return the text.

    Args:
        fig: A matplotlib ``Figure``.
        findings: :class:`~cockpit_core.diagnosis.Finding` objects or ``finding`` records
            (``read_run(path).findings``).
        most: How many lines to show; a last line counts the others.
        y: Figure coordinate of the banner's top edge.

    Returns:
        The matplotlib ``Text`` artist, or ``None`` when there are no findings.

    """
    items = [f if isinstance(f, Finding) else Finding.from_record(f) for f in findings]
    if not items:
        return None
    items.sort(key=lambda f: (-severity_rank(f.severity), f.first_step, f.id))
    lines = [f.line() for f in items[:most]]
    if len(items) > most:
        lines.append(f"... and {len(items) - most} more (cockpit diagnose LOG lists all)")
    worst = items[0].severity
    return fig.text(
        0.01,
        y,
        "\n".join(lines),
        ha="left",
        va="top",
        fontsize=9,
        color="white",
        bbox={"boxstyle": "round,pad=0.4", "facecolor": COLORS[worst], "edgecolor": "none"},
        gid="cockpit-findings-banner",
    )
