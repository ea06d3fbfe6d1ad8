"""Cockpit 1.0.2's schedule helpers, returning native schedules (``cockpit_core.schedules``).

Both functions give a callable ``global_step -> bool`` as in Cockpit 1.0.2; the callables
are the native schedule models, so the native engine reads them as data (they appear in
the log header and compare by value).
"""

from __future__ import annotations

import operator

import torch

from cockpit_core.schedules import EveryN, ExplicitSteps


def linear(interval: int, offset: int = 0) -> EveryN:
    """Track the steps ``offset + n * interval`` for ``n = 0, 1, 2, ...``.

    A negative ``offset`` selects the same non-negative steps as ``offset % interval``,
    which is what the returned :class:`~cockpit_core.schedules.EveryN` stores.

    Args:
        interval: Steps between two tracked steps (at least 1).
        offset: The first tracked step.

    Returns:
        The native schedule ``EveryN(every=interval, offset=offset)``.

    Raises:
        ValueError: ``interval`` is smaller than 1.
        TypeError: ``interval`` or ``offset`` is not an integer.

    """
    interval, offset = operator.index(interval), operator.index(offset)
    if interval < 1:
        raise ValueError(f"linear(interval={interval}): the interval must be at least 1.")
    return EveryN(every=interval, offset=offset % interval if offset < 0 else offset)


def logarithmic(
    start: float, end: float, steps: int = 300, base: float = 10, init: bool = True
) -> ExplicitSteps:
    """Track ``steps`` steps spaced evenly on a log scale from ``base**start`` to ``base**end``.

    ``start`` and ``end`` are exponents, as in Cockpit 1.0.2: ``logarithmic(0, 3)`` spans
    steps 1 to 1000. The step numbers are ``torch.logspace(start, end, steps, base=base)``
    cast to integers (truncated), duplicates merged, so fewer than ``steps`` steps may
    result.

    Args:
        start: Exponent of the first tracked step.
        end: Exponent of the last tracked step.
        steps: Number of log-spaced points.
        base: Base of the logarithm.
        init: Also track step 0.

    Returns:
        The native schedule ``ExplicitSteps(steps=...)`` holding those steps.

    """
    grid = torch.logspace(start, end, steps, base=base, dtype=torch.int64)
    tracked = {int(s) for s in grid.tolist()}
    if init:
        tracked.add(0)
    return ExplicitSteps(steps=frozenset(tracked))


__all__ = ["linear", "logarithmic"]
