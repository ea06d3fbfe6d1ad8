"""Shared by the attention rules: the heads of the ``attention`` quantity as series, by name.

``attention`` (cockpit-attention) logs per step ``modules`` (one attention layer each, in
call order), ``heads`` and, per layer and head, ``max_logit`` (the largest pre-softmax
logit ``q.k * scale`` over the batch, the queries and the unmasked keys) and ``entropy``
(the mean entropy in nats of the attention distributions). A head is the unit
``(module, head index)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from cockpit_core.diagnosis import Window
from cockpit_diagnoses._units import Judged, Rows, Stretch, Unit, as_floats, unit_series

ATTENTION = "attention"
"""The quantity the attention rules read."""

Head = tuple[str, int]
"""A head: the module that owns the attention call, and the head's index in it."""


def head_rows(field: str) -> Rows:
    """A reader of ``field`` (``"max_logit"``, ``"entropy"``) of every head at one step.

    A layer whose module name appeared before at the same step is left out (one value per
    head and step).
    """

    def rows(value: Mapping[str, Any]) -> Iterator[tuple[Unit, float]]:
        modules, table = value["modules"], value[field]
        if isinstance(modules, str) or len(modules) != len(table):
            raise ValueError(f"{len(table)} rows of {field} for {len(modules)} modules")
        seen = set()
        for module, row in zip(modules, table):
            if str(module) in seen:
                continue
            seen.add(str(module))
            for h, x in enumerate(as_floats(row)):
                yield (str(module), h), float(x)

    return rows


def head_series(window: Window, field: str) -> dict[Head, tuple[np.ndarray, np.ndarray]]:
    """Steps and finite values of ``field`` of every head, in the order heads first appear."""
    return unit_series(window, ATTENTION, head_rows(field))


def head_evidence(
    group: Sequence[Stretch], heads: Mapping[Unit, Judged], extreme: str
) -> list[dict[str, Any]]:
    """One entry per head of ``group``: what a finding says of it.

    ``{"module", "head", "early", "median", extreme, "first_step", "last_step",
    "steps_flagged"}``: the head's early value, the median and the ``extreme`` (``"max"``
    or ``"min"``) of its flagged steps, and its stretch.
    """
    pick = {"max": np.max, "min": np.min}[extreme]
    rows = []
    for s in group:
        judged = heads[s.unit]
        inside = judged.values[s.inside]
        rows.append(
            {
                "module": s.unit[0],
                "head": s.unit[1],
                "early": judged.reference,
                "median": float(np.median(inside)),
                extreme: float(pick(inside)),
                "first_step": s.first_step,
                "last_step": s.last_step,
                "steps_flagged": s.count,
            }
        )
    return rows


def head_name(head: Head) -> str:
    """``transformer.h.1.attn head 0``."""
    return f"{head[0]} head {head[1]}"


def heads_text(heads: Sequence[Head], most: int = 8) -> str:
    """``transformer.h.1.attn heads 0, 3; transformer.h.0.attn head 2`` (modules in order).

    At most ``most`` modules are listed, then ``...``.
    """
    by_module: dict[str, list[int]] = {}
    for module, h in heads:
        by_module.setdefault(module, []).append(h)
    parts = [
        f"{module} head{'s' if len(hs) > 1 else ''} {', '.join(str(h) for h in hs)}"
        for module, hs in by_module.items()
    ]
    return "; ".join(parts[:most]) + ("; ..." if len(parts) > most else "")
