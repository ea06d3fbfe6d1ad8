"""Which quantity phases run at a step, and whether its forward pass needs BackPACK's hooks."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Protocol

from cockpit_core.backends import hooks
from cockpit_core.errors import CockpitWarning
from cockpit_core.quantity import Quantity
from cockpit_core.requirements import MergedRequirements, merge_requirements
from cockpit_core.step import Task


class HookNeeds(Protocol):
    """The part of a statistics backend the planner asks (see ``StatisticsRouter``)."""

    def needs_hooks(self, merged: MergedRequirements) -> bool:
        """Whether BackPACK's module hooks must see the forward pass of such a step."""


class Planner:
    """The tasks of each step, their merged requirements, and the BackPACK hooks to install.

    Two-step quantities are *pending* between their start and end step; a quantity that
    failed under ``on_error="disable"`` is *disabled*. After every step the planner
    predicts the next one (the last step plus the last stride between steps) and keeps
    BackPACK's hooks installed only if that step needs them (:mod:`cockpit_core.backends.hooks`).

    Args:
        quantities: The Cockpit's quantities.
        backend: Tells which merged requirements need BackPACK's hooks.

    """

    def __init__(self, quantities: Sequence[Quantity], backend: HookNeeds):
        self.quantities = quantities
        self.backend = backend
        self.pending: dict[str, int] = {}  # two-step quantity key -> start step
        self.disabled: set[str] = set()
        self._merged: dict[tuple, MergedRequirements] = {}
        self._planned: tuple[int, list[Task], MergedRequirements] | None = None
        self._last: int | None = None  # the step that planned the hooks last
        self._stride = 1
        self._follow_schedule = True
        hooks.want(self, True)  # the first forward pass may come before any step

    # -- tasks ------------------------------------------------------------------------------

    def tasks(self, step: int) -> list[Task]:
        """The quantity phases that run at ``step``, in the quantities' order."""
        tasks = []
        for q in self.quantities:
            if q.key in self.disabled:
                continue
            if q.two_step:
                start = self.pending.get(q.key)
                if start is not None and start < step:
                    tasks.append(Task(q, "end", start))
                if q.is_active(step):
                    tasks.append(Task(q, "start", step))
            elif q.is_active(step):
                tasks.append(Task(q, "single", step))
        return tasks

    def plan(self, step: int) -> tuple[list[Task], MergedRequirements]:
        """The tasks of ``step`` and their merged requirements (kept until a step ends)."""
        if self._planned is None or self._planned[0] != step:
            tasks = self.tasks(step)
            self._planned = (step, tasks, self.merged_for(tasks))
        return self._planned[1], self._planned[2]

    def merged_for(self, tasks: list[Task]) -> MergedRequirements:
        """Merge the tasks' requirements, cached per distinct combination.

        Requirements are asked for at every step: they may change (e.g. an adapted
        histogram range).
        """
        requests = tuple((t.quantity.key, t.requirements) for t in tasks)
        merged = self._merged.get(requests)
        if merged is None:
            if len(self._merged) >= 64:  # requirements that change every step: stay bounded
                self._merged.clear()
            merged = self._merged[requests] = merge_requirements(requests)
        return merged

    # -- BackPACK's hooks -----------------------------------------------------------------

    def prepare(self, step: int) -> None:
        """Install the hooks for the forward pass of ``step`` only if it needs them."""
        needed = not self._follow_schedule or self.backend.needs_hooks(self.plan(step)[1])
        hooks.want(self, needed)

    def after_step(self, step: int) -> None:
        """The step's quantities ran: prepare the hooks for the predicted next step."""
        if self._last is not None and step > self._last:
            self._stride = step - self._last
        self._last = step
        self._planned = None  # the step's quantities changed what comes next
        self.prepare(step + self._stride)

    def hooks_missed(self, step: int, merged: MergedRequirements, accumulate: bool) -> str | None:
        """Install the hooks ``step`` needs; say why its statistics are lost if it is too late.

        Without ``accumulate`` the forward pass ran before ``with cp(step)``: if the hooks
        were off, BackPACK saw nothing. They then stay installed for the rest of the run.
        """
        if not self.backend.needs_hooks(merged) or hooks.installed() or not hooks.switchable():
            return None
        hooks.want(self, True)
        if accumulate:  # the micro-batches' forward passes come inside the block
            return None
        self._follow_schedule = False
        expected = None if self._last is None else self._last + self._stride
        message = (
            f"the forward pass of step {step} ran without BackPACK's hooks: after step "
            f"{self._last} the Cockpit expected step {expected}, which needs none. Call "
            "cp.prepare(step) before the forward pass when step numbers are not evenly "
            "spaced; the hooks now stay installed for the rest of the run"
        )
        warnings.warn(f"cockpit: {message}.", CockpitWarning, stacklevel=3)  # the with block
        return message

    def close(self) -> None:
        """Stop asking for hooks (they are installed again unless another Cockpit objects)."""
        hooks.withdraw(self)
