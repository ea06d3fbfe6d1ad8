"""Combining a statistic's values of disjoint sets of samples, by its kind's ``combine`` rule.

The same rule serves blocks of samples of one layer (:mod:`cockpit_core.statistics.reduce`),
micro-batches of gradient accumulation (:mod:`cockpit_core.engine.accumulation`) and, through one
all-reduce, ``torch.distributed`` processes (:mod:`cockpit_core.distributed.batch`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cockpit_core.statistics.projection import Deferred, DeferredConcat


def combinable(stat: Any) -> bool:
    """Whether values of ``stat`` for disjoint sample sets can be combined."""
    return stat.combine is not None


def combine(stat: Any, a: Any, b: Any) -> Any:
    """The value of the union of two disjoint sample sets (``None`` stands for "no value").

    ``sum`` and ``mean`` (whose parts are already weighted by their share) add up, the last
    ``max_last`` entries by ``max``; ``gather`` concatenates along the sample axis;
    ``project`` keeps both parts' per-sample gradients for a later projection.

    Raises:
        ValueError: The statistic's values cannot be combined (``combine`` is ``None``).

    """
    if a is None or b is None:
        return a if b is None else b
    rule = stat.combine
    if rule == "project" and isinstance(a, Deferred) and isinstance(b, Deferred):
        parts = a.parts if isinstance(a, DeferredConcat) else [a]
        return DeferredConcat([*parts, *(b.parts if isinstance(b, DeferredConcat) else [b])])
    if rule in ("gather", "project"):
        return torch.cat([a, b])
    if rule in ("sum", "mean"):
        return add(a, b, stat.max_last)
    raise ValueError(f"{stat.describe()} cannot be combined across sets of samples.")


def add(a: Tensor, b: Tensor, max_last: int = 0) -> Tensor:
    """``a + b``, except the last ``max_last`` entries: ``max(a, b)``."""
    if not max_last:
        return a + b
    return torch.cat([a[:-max_last] + b[:-max_last], torch.maximum(a[-max_last:], b[-max_last:])])
