"""Diagnosis findings on the dashboard: the banner, and which panels a finding marks.

:func:`findings_banner` writes the most severe findings (see ``docs/diagnoses.md``) as
lines of text above the panels, coloured by the worst severity. It only adds text to the
figure; :func:`cockpit_core.dashboard.render` calls it for one run with findings, and
:mod:`cockpit_core.dashboard.markers` shades each finding's steps on the panels it marks.

:func:`diagnosis_reads` and :func:`marks` decide which panels those are, for this
dashboard and the web view (:mod:`cockpit_core.web.findings`) alike: a panel that shows a
quantity the finding's diagnosis reads (looked up in the installed diagnoses). A
diagnosis not installed, or one that reads no quantity (``nonfinite``), marks no panel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from cockpit_core.diagnosis import Finding, severity_rank

if TYPE_CHECKING:
    from cockpit_core.registry import Registry

COLORS = {"info": "#1f77b4", "warning": "#d98c00", "error": "#c62828"}
"""Banner colour of each severity."""
FONT_SIZE = 9
"""Font size of the banner in points."""
CHAR_WIDTH = 0.6
"""Widest average character width of the banner's font, in ems: lines are cut to fit."""


def findings_banner(
    fig: Any, findings: Iterable[Finding | Mapping[str, Any]], most: int = 3, y: float = 0.995
) -> Any:
    """Write the ``most`` most severe findings across the top of ``fig``; return the text.

    Each line (:func:`banner_line`) is cut to the figure's width; ``cockpit diagnose``
    gives the whole message, the evidence and the suggestion.

    Args:
        fig: A matplotlib ``Figure``.
        findings: :class:`~cockpit_core.diagnosis.Finding` objects or ``finding`` records
            (``read_run(path).findings``).
        most: How many lines to show; a last line counts the others.
        y: Figure coordinate of the banner's top edge.

    Returns:
        The matplotlib ``Text`` artist, or ``None`` when there are no findings.

    """
    items = as_findings(findings)
    if not items:
        return None
    items.sort(key=lambda f: (-severity_rank(f.severity), f.first_step, f.id))
    fits = int(fig.get_figwidth() * 72 / (FONT_SIZE * CHAR_WIDTH)) - 4  # the box's padding
    lines = [banner_line(f, fits) for f in items[:most]]
    if len(items) > most:
        lines.append(f"... and {len(items) - most} more (cockpit diagnose LOG lists all)")
    worst = items[0].severity
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


def banner_line(finding: Finding, limit: int) -> str:
    """``SEVERITY diagnosis (steps a-b): message``, cut to ``limit`` characters with "…"."""
    line = f"{finding.severity.upper():7} {finding.diagnosis} ({finding.steps}): {finding.message}"
    return line if len(line) <= limit else line[: max(limit - 1, 0)].rstrip() + "…"


def as_findings(findings: Iterable[Finding | Mapping[str, Any]]) -> list[Finding]:
    """:class:`~cockpit_core.diagnosis.Finding` objects of findings or ``finding`` records."""
    return [f if isinstance(f, Finding) else Finding.from_record(f) for f in findings]


def diagnosis_reads(registry: Registry | None = None) -> dict[str, tuple[str, ...]]:
    """``{diagnosis name: quantity names it reads}`` of the diagnoses of ``registry``.

    Args:
        registry: Where the diagnoses come from (default: every installed plugin's).

    """
    if registry is None:
        from cockpit_core.registry import default_registry

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
