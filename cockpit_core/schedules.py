"""Schedules: when a quantity is tracked. They are data, so they can live in a config file.

Four kinds exist, each a pydantic model with a ``kind`` tag::

    {"kind": "every", "every": 10, "offset": 0}          # steps 0, 10, 20, ...
    {"kind": "log", "start": 1, "end": 10000, "num": 50}  # ~50 log-spaced steps
    {"kind": "steps", "steps": [0, 5, 100]}              # an explicit list
    {"kind": "on_finding", "diagnosis": "loss_spike", "steps": 5}  # after each finding

In Python any callable ``step -> bool`` is accepted as well.

The first three are pure functions of the step. An :class:`OnFinding` schedule depends on
what the diagnoses running while training found: the model is data, and the Cockpit's
tracker binds it to its own table of findings
(:class:`~cockpit_core.diagnosing.triggers.Triggers`) when the Cockpit is built, so two
Cockpits never share triggers (see ``docs/configuration.md``, "Capture on trigger").

Fields are strict: ``every = true`` or ``num = "50"`` is rejected rather than read as a
number. A logarithmic schedule tracks at most :data:`MAX_LOG_STEPS` steps and ends at most at
step :data:`MAX_STEP`, so a typo such as ``num = 1000000000`` is a config error instead of a
giant allocation.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from cockpit_core.errors import MisuseError

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


StepSchedule = Annotated[EveryN | Logarithmic | ExplicitSteps, Field(discriminator="kind")]
"""A schedule that is a function of the step alone: every, log or steps."""


class OnFinding(_ScheduleModel):
    """Track the ``steps`` steps after each finding of a diagnosis running while training.

    A finding of ``diagnosis`` (one name or a list of names) of at least ``severity`` that
    the Cockpit reports while step ``s`` runs (or right after it) turns the quantity on at
    steps ``s + 1`` to ``s + steps``: step ``s`` has already run when the finding arrives,
    so the capture holds what follows it. A later finding restarts the window at its own
    step, so overlapping windows merge into one. ``also`` tracks at the steps of a plain
    schedule as well (e.g. a sparse baseline to compare with).

    The model is data; only a Cockpit can evaluate it, through the tracker's
    :class:`~cockpit_core.diagnosing.triggers.Triggers`, which knows the findings of its run.
    Calling the model itself raises :class:`~cockpit_core.errors.MisuseError`.
    """

    kind: Literal["on_finding"] = Field("on_finding", description="Schedule type tag.")
    diagnosis: str | tuple[str, ...] = Field(
        ...,
        description="The diagnosis (or list of diagnoses) whose findings turn the quantity "
        "on; it must run while training: Cockpit(..., diagnoses=[...]).",
    )
    steps: int = Field(
        5, ge=1, le=MAX_STEP, strict=True, description="Track this many steps after a finding."
    )
    severity: Literal["info", "warning", "error"] = Field(
        "warning", description="Least severity of a finding that turns the quantity on."
    )
    also: StepSchedule | None = Field(
        None, description="Track at the steps of this schedule as well (kind every, log, steps)."
    )

    @field_validator("diagnosis", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        names = value if isinstance(value, (list, tuple)) else [value]
        if not names:
            raise ValueError('name at least one diagnosis, e.g. diagnosis = "loss_spike"')
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(
                    'must be a diagnosis name or a list of names (e.g. "loss_spike"), got '
                    f"{type(name).__name__} {name!r}"
                )
        return value if isinstance(value, str) else tuple(value)

    @property
    def diagnoses(self) -> tuple[str, ...]:
        """The names of the diagnoses whose findings turn the quantity on."""
        return (self.diagnosis,) if isinstance(self.diagnosis, str) else self.diagnosis

    def __call__(self, step: int) -> bool:
        """Refuse: only a Cockpit, which knows the findings of its run, evaluates it."""
        raise MisuseError(
            "an 'on_finding' schedule depends on the findings of a run: only a Cockpit "
            "evaluates it (it binds the schedule to its diagnoses when it is built)."
        )


Schedule = Annotated[EveryN | Logarithmic | ExplicitSteps | OnFinding, Field(discriminator="kind")]
"""A schedule given as data: :class:`EveryN`, :class:`Logarithmic`, :class:`ExplicitSteps` or
:class:`OnFinding`."""


def as_schedule_fn(schedule: ScheduleFn | _ScheduleModel | None) -> ScheduleFn:
    """Turn a schedule model, a callable, or ``None`` (every step) into ``step -> bool``."""
    if schedule is None:
        return EveryN()
    if callable(schedule):
        return schedule
    raise TypeError(
        f"A schedule must be a callable step -> bool or a schedule model, got {schedule!r}."
    )
