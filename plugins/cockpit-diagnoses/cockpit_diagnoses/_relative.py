"""Shared by the rules that compare a series with its own early value."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from cockpit_diagnoses._common import PersistenceConfig


class RelativeDropConfig(PersistenceConfig):
    """A value counts as collapsed below ``ratio`` x its median over the first tracked steps."""

    reference: int = Field(
        5, ge=1, description="First tracked steps whose median is the reference value."
    )


def reference_value(values: np.ndarray, count: int) -> float:
    """Median of the finite entries among the first ``count`` (NaN if there are none)."""
    head = values[:count]
    head = head[np.isfinite(head)]
    return float(np.median(head)) if len(head) else float("nan")
