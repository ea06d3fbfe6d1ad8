"""One tracked step: which quantity phases run, and the ``with cp(step, info=...)`` block."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cockpit_core.context import HessianVectorProducts, StepContext, StepData
from cockpit_core.errors import MisuseError
from cockpit_core.normalize import to_serializable
from cockpit_core.projection import resolve_projections
from cockpit_core.quantity import Quantity
from cockpit_core.requirements import Requirements

if TYPE_CHECKING:
    from cockpit_core.cockpit import Cockpit

START_STATE = "__start_state__"
"""Cache key of a two-step quantity's start state (kept until its end step)."""


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

    def __init__(self, cockpit: Cockpit, step: int, info: dict[str, Any], accumulate: bool = False):
        self.cp, self.step, self.info = cockpit, step, info
        self.accumulate = accumulate  # several micro-batches: see cockpit_core.accumulation
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
        if self.accumulate and not self.info.get("batch_size"):
            raise MisuseError(
                "cp(step, accumulate=True) needs info={'batch_size': B} with B the number of "
                "samples of all micro-batches together (on this process)."
            )
        if not cp._info_checked and not self.accumulate:
            cp._check_info(self.info, cp.quantities)
            cp._info_checked = True
            cp._warn_misuse(self.info)
        self.tasks, self.merged = cp._planner.plan(step)
        if not self.accumulate:  # micro-batches bring loss and individual_losses later
            cp._check_info(self.info, [t.quantity for t in self.tasks])
        self.batch_size = int(self.info.get("batch_size") or 0)
        self.hooks_missed = cp._planner.hooks_missed(step, self.merged, self.accumulate)
        if self.merged.statistics and not self.accumulate:
            batch_size = self.info.get("batch_size") or len(self.info.get("individual_losses", ()))
            self._backend_ctx = cp._backend.collect(self.merged, int(batch_size), info=self.info)
            self.stats, self.missing = self._backend_ctx.__enter__()
        self.sync = None
        if cp._dist is not None:  # torch.distributed: learn every process's batch size
            self.sync = cp._dist.begin(self.info, cp.params)
        cp._in_step = True
        if cp.debug:
            names = ", ".join(f"{t.quantity.key}({t.phase})" for t in self.tasks) or "nothing"
            stats = ", ".join(s.describe() for s in self.merged.statistics) or "none"
            print(f"[cockpit] step {step}: tracking {names}; statistics: {stats}")
        return self

    def micro_batch(self, info: dict[str, Any] | None = None) -> contextlib.AbstractContextManager:
        """Context around one micro-batch's ``backward()`` in a step with ``accumulate=True``.

        ``info`` holds the micro-batch's ``loss`` (the scaled loss it backpropagates),
        ``individual_losses`` and ``batch_size``; see :mod:`cockpit_core.accumulation`.
        """
        from cockpit_core.accumulation import micro_batch

        return micro_batch(self, info)

    def __exit__(self, exc_type, exc, tb) -> bool:
        cp = self.cp
        cp._in_step = False
        try:
            if self._backend_ctx is not None:
                self._backend_ctx.__exit__(exc_type, exc, tb)
        finally:
            self._backend_ctx = None
        if self.hooks_missed is not None:
            note = self.hooks_missed[0].upper() + self.hooks_missed[1:]
            for ident, reason in self.missing.items():
                self.missing[ident] = f"{note} ({reason})"
        if exc_type is not None:
            if self.sync is not None:
                self.sync.close()
            cp._planner.after_step(self.step)
            return False
        cp._last_step = self.step
        if self.accumulate:
            cp._check_info(self.info, [t.quantity for t in self.tasks])
        hvp = None
        if self.merged.loss_graph:
            hvp = HessianVectorProducts(self.info.get("loss"), cp.params)
        grads = None
        if self.sync is not None:  # combine the processes' statistics: the global batch
            self.info, self.stats, self.missing, grads, hvp = self.sync.finish(
                self.info, self.stats, self.missing, self.merged, hvp
            )
        data = StepData(
            self.step, self.info, cp.params, cp.param_names, self.stats, self.missing, hvp, grads
        )
        if self.sync is None and any(kind == "batch_projection" for kind, _ in self.stats):
            declared = self.merged.statistics
            resolve_projections(self.stats, data.grads, cp.params, declared, self.missing)
        try:
            if self.tasks and not cp._policy.skip_nonfinite(
                self.step, self.tasks, self.info, cp.params, cp.param_names
            ):
                run_tasks(cp, self.step, self.tasks, data)
        finally:
            data.release()
            self.stats = {}
            self.info = {}
            cp._cache.evict(self.step)
            cp._planner.after_step(self.step)  # hooks for the next forward pass, if it needs them
        return False


def run_tasks(cp: Cockpit, step: int, tasks: list[Task], data: StepData) -> None:
    """Run the step's quantity phases; record values, and failures by the error policy."""
    planner = cp._planner
    values: dict[int, dict[str, Any]] = {}
    for task in tasks:
        q = task.quantity
        if q.key in planner.disabled:
            continue
        allowed = frozenset(s.identity for s in task.requirements.statistics)
        ctx = StepContext(data, q.key, allowed, cp._cache)
        t0 = time.perf_counter()
        try:
            if task.phase == "single":
                value = q.compute(ctx)
            elif task.phase == "start":
                cp._cache.put(q.key, START_STATE, q.compute_start(ctx))  # type: ignore[attr-defined]
                planner.pending[q.key] = step
                value = None
            else:
                state = cp._cache.pop(q.key, START_STATE)
                del planner.pending[q.key]
                value = q.compute_end(ctx, state)  # type: ignore[attr-defined]
        except Exception as err:
            if task.phase == "end":
                planner.pending.pop(q.key, None)
            cp._policy.quantity_failed(q, step, task.phase, err)
            continue
        if cp.debug:
            ms = 1e3 * (time.perf_counter() - t0)
            print(f"[cockpit] step {step}: {q.key} ({task.phase}) {ms:.2f} ms")
        if value is not None:
            values.setdefault(task.start_step, {})[q.key] = to_serializable(value)
    for s, vals in sorted(values.items()):
        if cp.keep_in_memory:
            cp._output.setdefault(s, {}).update(vals)
        cp._emit({"kind": "values", "step": s, "values": vals})
