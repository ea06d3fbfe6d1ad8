"""Shared options of the rules: how long a condition must last to be reported."""

from __future__ import annotations

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
