"""One tracked step: which quantity phases run, and the ``with cp(step, info=...)`` block."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cockpit_core.context import HessianVectorProducts, StepData
from cockpit_core.errors import MisuseError
from cockpit_core.quantity import Quantity
from cockpit_core.requirements import Requirements

if TYPE_CHECKING:
    from cockpit_core.cockpit import Cockpit


@dataclass(frozen=True)
class Task:
    """One quantity computing one phase (``single``, ``start`` or ``end``) at a step.

    Attributes:
        quantity: The quantity.
        phase: ``"single"`` (one-step quantity), ``"start"`` or ``"end"`` (two-step).
        start_step: The step the value is stored under.

    """

    quantity: Quantity
    phase: str
    start_step: int

    @property
    def requirements(self) -> Requirements:
        """What this phase needs."""
        q = self.quantity
        if self.phase == "start":
            return q.start_requirements()  # type: ignore[attr-defined]
        if self.phase == "end":
            return q.end_requirements()  # type: ignore[attr-defined]
        return q.requirements()


class StepRun:
    """The ``with cp(step, info=...)`` block of one step.

    On entry it validates the step and ``info``, plans the step's tasks and, if statistics
    are needed, enters the backend so that the user's ``backward`` computes them. On exit
    it runs the quantities (unless the block raised) and frees every per-step buffer.
    """

    def __init__(self, cockpit: Cockpit, step: int, info: dict[str, Any]):
        self.cp, self.step, self.info = cockpit, step, info
        self._backend_ctx: contextlib.AbstractContextManager | None = None
        self.stats: dict = {}
        self.missing: dict = {}

    def __enter__(self) -> StepRun:
        cp, step = self.cp, self.step
        if cp._in_step:
            raise MisuseError(
                f"cp({step}) entered while another cockpit step is active; use one "
                "`with cp(step, ...)` block per training step, around loss.backward()."
            )
        if not isinstance(step, (int, np.integer)) or isinstance(step, bool):
            raise MisuseError(f"step must be an integer, got {step!r}.")
        if cp._last_step is not None and step <= cp._last_step:
            raise MisuseError(
                f"step {step} comes after step {cp._last_step}: steps must increase. Pass the "
                "global iteration counter, not the epoch-local batch index."
            )
        if not cp._info_checked:
            cp._check_info(self.info, cp.quantities)
            cp._info_checked = True
            cp._warn_misuse(self.info)
        self.tasks = cp._tasks(step)
        cp._check_info(self.info, [t.quantity for t in self.tasks])
        self.merged = cp._merged_for(self.tasks)
        if self.merged.statistics:
            batch_size = self.info.get("batch_size") or len(self.info.get("individual_losses", ()))
            self._backend_ctx = cp._backend.collect(self.merged, int(batch_size))
            self.stats, self.missing = self._backend_ctx.__enter__()
        cp._in_step = True
        if cp.debug:
            names = ", ".join(f"{t.quantity.key}({t.phase})" for t in self.tasks) or "nothing"
            stats = ", ".join(s.describe() for s in self.merged.statistics) or "none"
            print(f"[cockpit] step {step}: tracking {names}; statistics: {stats}")
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        cp = self.cp
        cp._in_step = False
        try:
            if self._backend_ctx is not None:
                self._backend_ctx.__exit__(exc_type, exc, tb)
        finally:
            self._backend_ctx = None
        if exc_type is not None:
            return False
        cp._last_step = self.step
        hvp = None
        if self.merged.loss_graph:
            hvp = HessianVectorProducts(self.info.get("loss"), cp.params)
        data = StepData(
            self.step, self.info, cp.params, cp.param_names, self.stats, self.missing, hvp
        )
        try:
            if self.tasks and not cp._skip_nonfinite(self.step, self.tasks, self.info):
                cp._run_tasks(self.step, self.tasks, data)
        finally:
            data.release()
            self.stats = {}
            self.info = {}
            cp._cache.evict(self.step)
        return False
