"""Schedules: when a quantity is tracked. They are data, so they can live in a config file.

Three kinds exist, each a pydantic model with a ``kind`` tag::

    {"kind": "every", "every": 10, "offset": 0}          # steps 0, 10, 20, ...
    {"kind": "log", "start": 1, "end": 10000, "num": 50}  # ~50 log-spaced steps
    {"kind": "steps", "steps": [0, 5, 100]}              # an explicit list

In Python any callable ``step -> bool`` is accepted as well.

Fields are strict: ``every = true`` or ``num = "50"`` is rejected rather than read as a
number. A logarithmic schedule tracks at most :data:`MAX_LOG_STEPS` steps and ends at most at
step :data:`MAX_STEP`, so a typo such as ``num = 1000000000`` is a config error instead of a
giant allocation.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

ScheduleFn = Callable[[int], bool]

MAX_LOG_STEPS = 100_000
"""Most steps a logarithmic schedule may ask for (``num``); use kind ``every`` beyond that."""

MAX_STEP = 10**15
"""Largest ``start``/``end`` of a logarithmic schedule (far beyond any training run)."""


class _ScheduleModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __call__(self, step: int) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError


class EveryN(_ScheduleModel):
    """Track every ``every``-th step, starting at ``offset``."""

    kind: Literal["every"] = Field("every", description="Schedule type tag.")
    every: int = Field(1, ge=1, strict=True, description="Track every this many steps.")
    offset: int = Field(0, ge=0, strict=True, description="First tracked step.")

    def __call__(self, step: int) -> bool:
        """Return whether ``step`` is tracked."""
        return step >= self.offset and (step - self.offset) % self.every == 0


class Logarithmic(_ScheduleModel):
    """Track ``num`` steps spaced logarithmically between ``start`` and ``end`` (inclusive).

    Duplicates after rounding to integers are merged, so fewer steps may result.
    """

    kind: Literal["log"] = Field("log", description="Schedule type tag.")
    start: int = Field(1, ge=0, le=MAX_STEP, strict=True, description="First tracked step.")
    end: int = Field(..., ge=1, le=MAX_STEP, strict=True, description="Last tracked step.")
    num: int = Field(
        50,
        ge=1,
        strict=True,
        description=f"Number of log-spaced steps before de-duplication (at most {MAX_LOG_STEPS}).",
    )

    @field_validator("num")
    @classmethod
    def _bounded_num(cls, num: int) -> int:
        if num > MAX_LOG_STEPS:
            raise ValueError(
                f"num = {num} is too large: a logarithmic schedule tracks at most "
                f"{MAX_LOG_STEPS} steps; use kind 'every' to track densely"
            )
        return num

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
    steps: frozenset[Annotated[int, Strict(), Field(ge=0)]] = Field(
        ..., description="The steps to track (non-negative integers)."
    )

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
