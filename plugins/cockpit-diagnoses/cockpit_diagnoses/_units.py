"""Shared by the rules that judge many series of one quantity: attention heads, modules.

A quantity such as ``attention`` or ``activations`` logs, per step, one value per unit (a
head of a layer, a module) under a list of names. :func:`unit_series` turns that into one
series per unit, over the steps that hold it (a unit missing at a step is left out there,
not read as NaN); :func:`flagged_spans` finds each unit's persistent stretches (and
:func:`reference_stretches` those where a unit is far from its own early value), and
:func:`overlapping` gathers the stretches of several units that overlap into one group:
one finding names every unit that went wrong over the same steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cockpit_core.diagnosis import Window, persistent_spans
from cockpit_diagnoses._relative import reference_value

Unit = Any
"""A unit: a hashable name such as a ``(module, head)`` pair or a module name."""

Rows = Callable[[Mapping[str, Any]], Iterable[tuple[Unit, float]]]
"""Reads one step's value of the quantity: ``(unit, number)`` of every unit in it."""

Flag = Callable[[np.ndarray, float], np.ndarray]
"""Flags the values of a unit's series, given its reference value."""

Series = Mapping[Unit, tuple[np.ndarray, np.ndarray]]
"""Steps and values of each unit."""


def unit_series(window: Window, key: str, rows: Rows) -> dict[Unit, tuple[np.ndarray, np.ndarray]]:
    """Steps and float64 values of each unit of ``key``, in the order units first appear.

    ``rows`` reads a step's value (a mapping); a value that is not a mapping, or that
    ``rows`` cannot read (``TypeError``, ``ValueError``, ``KeyError``, ``IndexError``), is
    left out. Only finite values are kept.
    """
    steps: dict[Unit, list[int]] = {}
    values: dict[Unit, list[float]] = {}
    for step, value in window.values(key):
        if not isinstance(value, Mapping):
            continue
        try:
            read = list(rows(value))
        except (TypeError, ValueError, KeyError, IndexError):
            continue
        for unit, number in read:
            if np.isfinite(number):
                steps.setdefault(unit, []).append(step)
                values.setdefault(unit, []).append(number)
    return {
        unit: (np.asarray(steps[unit], dtype=np.int64), np.asarray(values[unit], dtype=np.float64))
        for unit in steps
    }


def as_floats(row: Any) -> np.ndarray:
    """``row`` (a number, list or array) as a flat float64 array.

    Raises ``TypeError`` or ``ValueError`` when it holds something else than numbers.
    """
    return np.asarray(row, dtype=np.float64).reshape(-1)


@dataclass(frozen=True)
class Stretch:
    """One unit's persistent stretch.

    Attributes:
        unit: The unit (a ``(module, head)`` pair, a module name).
        first_step: Its first flagged step.
        last_step: Its last flagged step.
        count: Flagged tracked steps within it.
        inside: Mask over the unit's series: the flagged steps of the stretch.

    """

    unit: Unit
    first_step: int
    last_step: int
    count: int
    inside: np.ndarray


def flagged_spans(
    unit: Unit, steps: np.ndarray, flags: np.ndarray, window: int, fraction: float
) -> list[Stretch]:
    """The stretches of one unit where ``fraction`` of ``window`` tracked steps are flagged."""
    out = []
    for first, last, count in persistent_spans(steps, flags, window, fraction):
        inside = (steps >= first) & (steps <= last) & flags
        out.append(Stretch(unit, first, last, count, inside))
    return out


def overlapping(stretches: Iterable[Stretch]) -> list[list[Stretch]]:
    """Groups of stretches whose steps overlap (chains of overlaps too), earliest first.

    Within a group, the stretches of one unit are merged into one (from its first to its
    last flagged step, every flagged step of them inside), in the order the units were
    first given in.
    """
    ordered = sorted(enumerate(stretches), key=lambda e: (e[1].first_step, e[0]))
    groups: list[list[tuple[int, Stretch]]] = []
    end = None
    for i, stretch in ordered:
        if groups and end is not None and stretch.first_step <= end:
            groups[-1].append((i, stretch))
            end = max(end, stretch.last_step)
        else:
            groups.append([(i, stretch)])
            end = stretch.last_step
    return [_per_unit([s for _, s in sorted(group, key=lambda e: e[0])]) for group in groups]


def _per_unit(group: list[Stretch]) -> list[Stretch]:
    """The stretches of ``group`` merged per unit, in the order units first appear."""
    merged: dict[Unit, Stretch] = {}
    for s in group:
        if s.unit in merged:
            m = merged[s.unit]
            s = Stretch(
                s.unit,
                min(m.first_step, s.first_step),
                max(m.last_step, s.last_step),
                m.count + s.count,
                m.inside | s.inside,
            )
        merged[s.unit] = s
    return list(merged.values())


def judged(steps: np.ndarray, reference: int, start: int) -> np.ndarray:
    """Mask of the steps a rule judges: from ``start`` on, after the ``reference`` first ones."""
    mask = steps >= start
    mask[:reference] = False
    return mask


@dataclass(frozen=True)
class Judged:
    """A unit's series as a rule judged it against its early value.

    Attributes:
        steps: Its tracked steps.
        values: Its finite values.
        reference: The median of its first ``reference`` values.

    """

    steps: np.ndarray
    values: np.ndarray
    reference: float


def reference_stretches(
    series: Series, reference: int, start: int, window: int, fraction: float, flag: Flag
) -> tuple[list[Stretch], dict[Unit, Judged]]:
    """Each unit's stretches where ``flag(values, reference)`` holds persistently.

    A unit's reference is the median of its first ``reference`` tracked values
    (:func:`~cockpit_diagnoses._relative.reference_value`); steps before ``start`` and the
    reference steps themselves are not judged, nor is a unit without more values than
    that or without a finite reference. Returns the stretches (units in the order of
    ``series``) and each judged unit's :class:`Judged`.
    """
    stretches: list[Stretch] = []
    units: dict[Unit, Judged] = {}
    for unit, (steps, values) in series.items():
        ref = reference_value(values, reference)
        if len(values) <= reference or not np.isfinite(ref):
            continue
        units[unit] = Judged(steps, values, ref)
        with np.errstate(invalid="ignore", divide="ignore"):
            flags = judged(steps, reference, start) & flag(values, ref)
        stretches += flagged_spans(unit, steps, flags, window, fraction)
    return stretches, units
