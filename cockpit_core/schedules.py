"""Schedules: when a quantity is tracked. They are data, so they can live in a config file.

Three kinds exist, each a pydantic model with a ``kind`` tag::

    {"kind": "every", "every": 10, "offset": 0}          # steps 0, 10, 20, ...
    {"kind": "log", "start": 1, "end": 10000, "num": 50}  # ~50 log-spaced steps
    {"kind": "steps", "steps": [0, 5, 100]}              # an explicit list

In Python any callable ``step -> bool`` is accepted as well.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

ScheduleFn = Callable[[int], bool]


class _ScheduleModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __call__(self, step: int) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError


class EveryN(_ScheduleModel):
    """Track every ``every``-th step, starting at ``offset``."""

    kind: Literal["every"] = Field("every", description="Schedule type tag.")
    every: int = Field(1, ge=1, description="Track every this many steps.")
    offset: int = Field(0, ge=0, description="First tracked step.")

    def __call__(self, step: int) -> bool:
        """Return whether ``step`` is tracked."""
        return step >= self.offset and (step - self.offset) % self.every == 0


class Logarithmic(_ScheduleModel):
    """Track ``num`` steps spaced logarithmically between ``start`` and ``end`` (inclusive).

    Duplicates after rounding to integers are merged, so fewer steps may result.
    """

    kind: Literal["log"] = Field("log", description="Schedule type tag.")
    start: int = Field(1, ge=0, description="First tracked step.")
    end: int = Field(..., ge=1, description="Last tracked step.")
    num: int = Field(50, ge=1, description="Number of log-spaced steps before de-duplication.")

    @model_validator(mode="after")
    def _check_order(self) -> Logarithmic:
        if self.end < self.start:
            raise ValueError(f"end ({self.end}) must not be smaller than start ({self.start})")
        return self

    @cached_property
    def steps(self) -> frozenset[int]:
        """The tracked steps."""
        lo = np.log10(max(self.start, 1))
        grid = np.logspace(lo, np.log10(self.end), self.num)
        steps = set(np.round(grid).astype(int).tolist())
        if self.start == 0:
            steps.add(0)
        return frozenset(steps)

    def __call__(self, step: int) -> bool:
        """Return whether ``step`` is tracked."""
        return step in self.steps


class ExplicitSteps(_ScheduleModel):
    """Track exactly the listed steps."""

    kind: Literal["steps"] = Field("steps", description="Schedule type tag.")
    steps: frozenset[int] = Field(..., description="The steps to track.")

    def __call__(self, step: int) -> bool:
        """Return whether ``step`` is tracked."""
        return step in self.steps


Schedule = Annotated[EveryN | Logarithmic | ExplicitSteps, Field(discriminator="kind")]
"""A schedule given as data: one of :class:`EveryN`, :class:`Logarithmic`, :class:`ExplicitSteps`."""


def as_schedule_fn(schedule: ScheduleFn | _ScheduleModel | None) -> ScheduleFn:
    """Turn a schedule model, a callable, or ``None`` (every step) into ``step -> bool``."""
    if schedule is None:
        return EveryN()
    if callable(schedule):
        return schedule
    raise TypeError(
        f"A schedule must be a callable step -> bool or a schedule model, got {schedule!r}."
    )
