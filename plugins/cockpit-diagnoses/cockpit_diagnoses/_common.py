"""Shared by the rules: how long a condition must last, and numbers in messages."""

from __future__ import annotations

import math

from pydantic import Field

from cockpit_core.diagnosis import DiagnosisConfig


class PersistenceConfig(DiagnosisConfig):
    """A condition counts when it holds at ``fraction`` of ``window`` consecutive tracked steps."""

    window: int = Field(10, ge=1, description="Consecutive tracked steps looked at together.")
    fraction: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="Share of the window's steps at which the condition must hold.",
    )


def fmt(value: float) -> str:
    """A number for a message: 4 significant digits."""
    return f"{value:.4g}"


def change_by(start: float, end: float) -> str:
    """How ``end`` compares with ``start`` in percent: ``"fell by 12 %"``, ``"rose by 0.56 %"``.

    The verb follows the sign of ``end - start`` and the percentage is its size relative to
    ``|start|``, so that no message says that something "fell by -0.56 %". Without a
    percentage (``start`` is 0 or not finite) just ``"rose"`` or ``"fell"``; ``"did not
    change"`` when ``end == start``.
    """
    if end == start:
        return "did not change"
    verb = "rose" if end > start else "fell"
    if start == 0 or not math.isfinite(start) or not math.isfinite(end):
        return verb
    return f"{verb} by {fmt(100 * abs(end - start) / abs(start))} %"


def change_factor(before: float, after: float, up: str = "rose to", down: str = "fell to") -> str:
    """How ``after`` compares with ``before`` as a factor: ``"fell to 0.05x"``, ``"rose to 3x"``.

    ``up`` is the verb when ``after > before`` (``"grew"``: ``"grew 120x"``), ``down``
    otherwise; ``"stayed at 1x"`` when they are equal. ``before`` must be positive.
    """
    ratio = after / before
    if ratio == 1:
        return "stayed at 1x"
    return f"{up if ratio > 1 else down} {fmt(ratio)}x"


def relation(value: float, limit: float) -> str:
    """``">"``, ``"<"`` or ``"="``: how ``value`` compares with ``limit``, for a message."""
    return ">" if value > limit else "<" if value < limit else "="
