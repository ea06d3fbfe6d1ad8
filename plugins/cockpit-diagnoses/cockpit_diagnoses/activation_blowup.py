"""Activation blow-up: a module's output grows far above its running median."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from cockpit_core.diagnosis import Diagnosis, Finding, Window
from cockpit_diagnoses._common import PersistenceConfig, fmt
from cockpit_diagnoses._spike import trailing_stats
from cockpit_diagnoses._units import (
    Rows,
    Stretch,
    Unit,
    as_floats,
    flagged_spans,
    overlapping,
    unit_series,
)
from cockpit_diagnoses.precedence import LOWER_LR, won_by

ACTIVATIONS = "activations"
"""The quantity the rule reads."""

FIELDS: tuple[str, ...] = ("rms", "amax")
"""The sizes of a module's output that are judged."""


class ActivationBlowupConfig(PersistenceConfig):
    """Options of :class:`ActivationBlowup`."""

    window: int = Field(5, ge=1, description="Consecutive tracked steps looked at together.")
    growth: float = Field(
        10.0,
        gt=1.0,
        description="Report a module whose activation RMS or largest magnitude is at least "
        "this many times its running median.",
    )
    trailing: int = Field(
        50, ge=2, description="Tracked steps before a step whose median is its running median."
    )
    min_trailing: int = Field(
        10,
        ge=1,
        description="Fewest earlier tracked steps with a finite value needed to judge a step.",
    )
    start: int = Field(
        10,
        ge=0,
        description="Steps before this one are not judged: the outputs of freshly "
        "initialised layers grow fast (a projection initialised near 0).",
    )

    @model_validator(mode="after")
    def _min_trailing_fits(self) -> ActivationBlowupConfig:
        if self.min_trailing > self.trailing:
            raise ValueError(
                f"min_trailing ({self.min_trailing}) must not exceed trailing ({self.trailing})"
            )
        return self


class ActivationBlowup(Diagnosis):
    """A module's activation RMS or ``amax`` grows ``growth`` x (10) its running median.

    Wortsman et al. (2023, "Small-scale proxies for large-scale Transformer training
    instabilities") watch activation and gradient norms as early signs of instability, and
    at high learning rates the outputs of a Transformer's linear layers grow with each step
    until the model diverges ("Methods of improving LLM training stability", 2024, arXiv
    2410.16682); Sun et al. (2024, "Massive Activations in Large Language Models") show how
    far single activations stand out (``amax`` against ``rms``). Reads ``activations``
    (cockpit-activations): per module ``rms`` and ``amax`` of its output. A module is
    flagged at a tracked step when either is at least ``growth`` (10) times its running
    median, the median of its ``trailing`` (50) tracked steps before (at least
    ``min_trailing``, 10); reported when that holds at ``fraction`` (0.8) of ``window`` (5)
    consecutive tracked steps from step ``start`` (10) on. A steady growth over training
    does not count; a growth of 10x within about ``trailing / 2`` tracked steps does.
    Modules whose stretches overlap are one ``warning``, listed in forward order (a block
    after the layers inside it): the first one named is where the blow-up shows first.
    Evidence: per module, the size (``rms`` or ``amax``) that grew most, its peak factor,
    value and running median.
    """

    name = "activation_blowup"
    reads = (ACTIVATIONS,)
    source = (
        "Wortsman et al. (2023), Small-scale proxies; Sun et al. (2024), Massive Activations: "
        "rule: activation RMS or max |x| >= growth x its running median"
    )
    Config = ActivationBlowupConfig
    config: ActivationBlowupConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return one finding per group of modules whose stretches overlap."""
        cfg = self.config
        order: dict[str, int] = {}
        stretches: list[Stretch] = []
        factors: dict[Unit, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for field in FIELDS:
            for module, (steps, values) in unit_series(window, ACTIVATIONS, _rows(field)).items():
                order.setdefault(str(module), len(order))
                median = trailing_stats(values, cfg.trailing, cfg.min_trailing)[0]
                with np.errstate(invalid="ignore", divide="ignore"):
                    factor = np.where(median > 0, values / median, np.nan)
                    flags = (steps >= cfg.start) & (factor >= cfg.growth)
                unit = (str(module), field)
                factors[unit] = (steps, values, median, factor)
                stretches += flagged_spans(unit, steps, flags, cfg.window, cfg.fraction)
        found = []
        for group in overlapping(stretches):
            rows: dict[str, dict[str, Any]] = {}
            for s in group:
                module, field = s.unit
                steps, values, median, factor = factors[s.unit]
                peak = int(np.flatnonzero(s.inside)[np.argmax(factor[s.inside])])
                row = {
                    "module": module,
                    "field": field,
                    "factor": float(factor[peak]),
                    "value": float(values[peak]),
                    "median": float(median[peak]),
                    "step": int(steps[peak]),
                    "first_step": s.first_step,
                    "last_step": s.last_step,
                    "steps_flagged": s.count,
                }
                if module not in rows or row["factor"] > rows[module]["factor"]:
                    rows[module] = row
            ordered = sorted(rows.values(), key=lambda r: order[r["module"]])
            found.append(self._finding(group, ordered))
        return found

    def _finding(self, group: list[Stretch], rows: list[dict[str, Any]]) -> Finding:
        cfg = self.config
        first = rows[0]
        names = [r["module"] for r in rows]
        message = (
            f"the activations of {len(rows)} module(s) rose to {fmt(cfg.growth)}x their "
            f"running median or more: "
            + ", ".join(names[:5])
            + (" ..." if len(names) > 5 else "")
            + f" (first in forward order {first['module']}: {first['field']} "
            f"{fmt(first['factor'])}x its running median {fmt(first['median'])} at step "
            f"{first['step']})"
        )
        return self.finding(
            "",
            "warning",
            min(s.first_step for s in group),
            max(s.last_step for s in group),
            message,
            {"modules": rows, "growth": cfg.growth, "trailing": cfg.trailing},
            f"Look at {first['module']} first (later modules inherit its outputs): lower the "
            "learning rate (of its param group) or warm it up longer, clip gradients, add "
            "weight decay, or normalize its output (a LayerNorm after the layer; qk-layernorm "
            "for attention projections).",
            LOWER_LR,
        )


def _rows(field: str) -> Rows:
    """A reader of ``field`` (``"rms"``, ``"amax"``) of every module at one step."""

    def rows(value: Mapping[str, Any]) -> Iterator[tuple[Unit, float]]:
        modules, numbers = value["modules"], as_floats(value[field])
        if isinstance(modules, str) or len(modules) != len(numbers):
            raise ValueError(f"{len(numbers)} values of {field} for {len(modules)} modules")
        seen = set()
        for module, x in zip(modules, numbers):
            if str(module) not in seen:
                seen.add(str(module))
                yield str(module), float(x)

    return rows
