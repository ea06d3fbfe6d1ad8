"""Cockpit 1.0.2's preset quantity lists ``"economy"``, ``"business"`` and ``"full"``."""

from __future__ import annotations

from collections.abc import Callable

from cockpit_compat import quantities
from cockpit_compat.quantities.quantity import Quantity
from cockpit_compat.utils import schedules

_ECONOMY: list[type[Quantity]] = [
    quantities.Alpha,
    quantities.Distance,
    quantities.GradHist1d,
    quantities.GradNorm,
    quantities.InnerTest,
    quantities.Loss,
    quantities.NormTest,
    quantities.OrthoTest,
    quantities.UpdateSize,
]
_BUSINESS = [*_ECONOMY, quantities.TICDiag, quantities.HessTrace]
_FULL = [*_BUSINESS, quantities.HessMaxEV, quantities.GradHist2d]
_CONFIGURATIONS = {"economy": _ECONOMY, "business": _BUSINESS, "full": _FULL}


def quantities_cls_for_configuration(label: str) -> list[type[Quantity]]:
    """The quantity classes of a configuration.

    ``"economy"``: Alpha, Distance, GradHist1d, GradNorm, InnerTest, Loss, NormTest,
    OrthoTest, UpdateSize; ``"business"``: those and TICDiag, HessTrace; ``"full"``:
    those and HessMaxEV, GradHist2d (the native presets of the same names hold the same
    quantities).

    Raises:
        ValueError: ``label`` is not one of the three.

    """
    if label not in _CONFIGURATIONS:
        raise ValueError(f"Unknown configuration {label!r}; use 'economy', 'business' or 'full'.")
    return list(_CONFIGURATIONS[label])


def configuration(
    label: str, track_schedule: Callable[[int], bool] | None = None, verbose: bool = False
) -> list[Quantity]:
    """Instances of a configuration's quantities, all with one schedule.

    Args:
        label: ``"economy"``, ``"business"`` or ``"full"`` (cheapest to dearest).
        track_schedule: When to compute them (default: every step, ``linear(1)``).
        verbose: Print each stored value.

    Returns:
        The quantities, to pass as ``Cockpit(params, quantities=...)``.

    """
    if track_schedule is None:
        track_schedule = schedules.linear(interval=1, offset=0)
    return [
        cls(track_schedule=track_schedule, verbose=verbose)
        for cls in quantities_cls_for_configuration(label)
    ]


__all__ = ["configuration", "quantities_cls_for_configuration"]
