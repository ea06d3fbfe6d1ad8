"""Which quantity phases run at a step, and who must watch its forward pass."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from cockpit_core.engine.compiled import EagerStance
from cockpit_core.errors import CockpitWarning
from cockpit_core.observe import ForwardObserver, observed_keys
from cockpit_core.observe.probe import Probe
from cockpit_core.quantity import Quantity, TwoStepQuantity
from cockpit_core.requirements import MergedRequirements, Requirements, merge_requirements
from cockpit_core.statistics.router import StatisticsRouter
from cockpit_core.statistics.statistic import Statistic


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
        two = cast(TwoStepQuantity, q)  # the phases "start" and "end" are two-step quantities'
        if self.phase == "start":
            return two.start_requirements()
        if self.phase == "end":
            return two.end_requirements()
        return q.requirements()


class Outcome(NamedTuple):
    """What computing one :class:`Task` gave (``Tracker.compute``, then ``Tracker.record``).

    Attributes:
        ok: Whether it returned.
        result: Its value (a start state for ``"start"``, :data:`NOT_RUN` for a disabled
            quantity) or, if not ``ok``, the exception.

    """

    ok: bool
    result: Any


NOT_RUN: Any = object()
"""The result of a task whose quantity is disabled (``on_error="disable"``)."""


class Planner:
    """The tasks of each step, their merged requirements, and the providers to arm.

    Two-step quantities are *pending* between their start and end step (the planner keeps
    their start state: :meth:`started`, :meth:`ended`, :meth:`drop`); a quantity that
    failed under ``on_error="disable"`` is *disabled* (:meth:`disable`). Providers that
    observe the forward
    pass (module hooks, BackPACK) are armed only for forward passes whose backward is
    tracked: after every step the planner predicts the next one (the last step plus the
    last stride between steps) and arms them only if that step needs them. While a
    forward pass is to be observed or differentiated twice, code compiled with
    ``torch.compile`` runs eagerly (:mod:`cockpit_core.engine.compiled`). The Cockpit's
    :class:`~cockpit_core.observe.ForwardObserver` is armed the same way, with the ``info``
    keys the predicted step takes from its forward pass (batch size, targets, per-sample
    losses).

    Schedules (``Quantity.is_active``) and ``requirements()`` are plugin code: one that
    raises is reported through :attr:`report` (the error policy) and the quantity does not
    run at that step; the other quantities do.

    Args:
        quantities: The Cockpit's quantities.
        router: The Cockpit's statistics router.
        observer: What watches the forward pass for ``info`` (``None``: nothing does).

    Attributes:
        report: ``report(quantity, step, phase, error)``, called when a schedule or
            ``requirements()`` raises (the Cockpit sets it to its error policy; by default
            the error propagates).

    """

    def __init__(
        self,
        quantities: Sequence[Quantity],
        router: StatisticsRouter,
        observer: ForwardObserver | None = None,
    ):
        self.quantities = quantities
        self.router = router
        self.observer = observer
        self._pending: dict[str, tuple[int, Any]] = {}  # two-step key -> (start step, state)
        self._disabled: set[str] = set()
        self._merged: dict[tuple[tuple[str, Requirements], ...], MergedRequirements] = {}
        self._planned: tuple[int, list[Task], MergedRequirements] | None = None
        self._unsure = False  # the last tasks() call met a raising schedule
        self._last: int | None = None  # the step that planned the forward pass last
        self._stride = 1
        self._follow_schedule = True
        # every statistic any quantity may need: for the first forward pass (before any
        # step), and after a forward pass the providers did not observe
        self._everything = tuple(
            {
                s.identity: s
                for q in quantities
                for r in q.all_requirements()
                for s in r.statistics
            }.values()
        )
        self._stance = EagerStance()
        self._arm(self._everything)
        self.report: Callable[[Quantity, int, str, BaseException], None] = _reraise

    # -- tasks ------------------------------------------------------------------------------

    def tasks(self, step: int, predict: bool = False) -> list[Task]:
        """The quantity phases that run at ``step``, in the quantities' order.

        With ``predict`` (arming providers for a step that may not come), a raising
        schedule is not reported; see :meth:`plan`.
        """
        tasks = []
        self._unsure = False
        for q in self.quantities:
            if q.key in self._disabled:
                continue
            if q.two_step:
                pending = self._pending.get(q.key)
                if pending is not None and pending[0] < step:
                    tasks.append(Task(q, "end", pending[0]))
                if self._active(q, step, predict):
                    tasks.append(Task(q, "start", step))
            elif self._active(q, step, predict):
                tasks.append(Task(q, "single", step))
        return [t for t in tasks if self._requirements_ok(t, step, predict)]

    def _active(self, q: Quantity, step: int, predict: bool) -> bool:
        try:
            return q.is_active(step)
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as err:  # a plugin's schedule must not stop training
            self._unsure = True
            if not predict:
                self.report(q, step, "schedule", err)
            return False

    def _requirements_ok(self, task: Task, step: int, predict: bool) -> bool:
        try:
            task.requirements  # noqa: B018 - evaluated for its errors
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as err:
            self._unsure = True
            if not predict:
                if task.phase == "end":
                    self._pending.pop(task.quantity.key, None)
                self.report(task.quantity, step, "requirements", err)
            return False
        return True

    def plan(self, step: int, predict: bool = False) -> tuple[list[Task], MergedRequirements]:
        """The tasks of ``step`` and their merged requirements (kept until a step ends).

        A prediction (``predict``) in which some schedule raised is not kept, so that the
        step itself evaluates it again and reports the error.
        """
        if self._planned is None or self._planned[0] != step:
            tasks = self.tasks(step, predict)
            planned = (step, tasks, self.merged_for(tasks))
            if predict and self._unsure:
                return planned[1], planned[2]
            self._planned = planned
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

    # -- two-step quantities and disabled quantities ---------------------------------------

    def started(self, key: str, step: int, state: Any) -> None:
        """Two-step quantity ``key`` ran its start phase at ``step``; keep ``state``."""
        self._pending[key] = (step, state)

    def ended(self, key: str) -> Any:
        """Two-step quantity ``key`` runs its end phase: return (and forget) its start state."""
        return self._pending.pop(key)[1]

    def drop(self, keys: Iterable[str] | None = None) -> None:
        """Forget the start of two-step quantities ``keys`` (all if ``None``): unusable."""
        for key in list(self._pending) if keys is None else keys:
            self._pending.pop(key, None)

    def disable(self, key: str) -> None:
        """Stop planning quantity ``key`` for the rest of the run."""
        self._disabled.add(key)
        self._pending.pop(key, None)

    def is_disabled(self, key: str) -> bool:
        """Whether quantity ``key`` was disabled (``on_error="disable"``)."""
        return key in self._disabled

    def pending_keys(self) -> list[str]:
        """Two-step quantities between their start and end step."""
        return list(self._pending)

    def pending(self, key: str) -> tuple[int, Any] | None:
        """``(start step, start state)`` of two-step quantity ``key``, if it is pending."""
        return self._pending.get(key)

    # -- changing and resuming the run ------------------------------------------------------

    def remove(self, key: str) -> None:
        """Stop planning quantity ``key`` (``Cockpit.remove``, between steps).

        Its pending start is dropped; the providers are armed anew for the remaining
        quantities (for the predicted next step).
        """
        self.quantities = [q for q in self.quantities if q.key != key]
        self._pending.pop(key, None)
        self._disabled.discard(key)
        stats: dict[tuple[str, str], Statistic] = {}
        for q in self.quantities:
            try:
                for requirements in q.all_requirements():
                    for stat in requirements.statistics:
                        stats.setdefault(stat.identity, stat)
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException:  # plugin code: reported when a step plans it
                continue
        self._everything = tuple(stats.values())
        self._rearm()

    def schedule_state(self) -> dict[str, Any]:
        """Where the schedule prediction stands: the last step, the stride, whether followed."""
        return {"last": self._last, "stride": self._stride, "follow": self._follow_schedule}

    def resume(self, last: int | None, stride: int, follow: bool) -> None:
        """Continue a saved run (:meth:`schedule_state`): arm for its predicted next step."""
        self._last, self._stride, self._follow_schedule = last, max(1, int(stride)), follow
        self._rearm()

    def _rearm(self) -> None:
        """Plan afresh and arm the providers for the predicted next step (or for everything)."""
        self._planned = None
        if self._last is None or not self._follow_schedule:
            self._arm(self._everything)
        else:
            self.prepare(self._last + self._stride)

    # -- the forward pass -------------------------------------------------------------------

    def _arm(
        self,
        statistics: Sequence[Statistic],
        loss_graph: bool | None = None,
        keys: frozenset[str] | None = None,
        probes: Sequence[Probe] | None = None,
    ) -> None:
        """Arm the providers for ``statistics``; compiled code runs eagerly if they observe.

        ``loss_graph``: whether the step needs Hessian-vector products (``None``: whether
        any quantity may). ``keys`` and ``probes``: the ``info`` keys and the probes the
        observer watches the forward pass for (``None``: those any quantity may need).
        """
        observing = self.router.arm(statistics)
        if loss_graph is None:
            loss_graph = any(r.loss_graph for q in self.quantities for r in q.all_requirements())
        if self.observer is not None:
            if keys is None or probes is None:  # every quantity's, asked once
                everything = self._all_requirements()
                keys = observed_keys(everything) if keys is None else keys
                probes = [p for r in everything for p in r.probes] if probes is None else probes
            observing = self.observer.arm(keys, probes) or observing
        self._stance.set(observing or loss_graph)

    def all_observed_keys(self) -> frozenset[str]:
        """The ``info`` keys any quantity may take from the forward pass."""
        return observed_keys(self._all_requirements())

    def _all_requirements(self) -> list[Requirements]:
        """The requirements any quantity may have (a quantity that raises: none)."""
        requirements = []
        for q in self.quantities:
            try:
                requirements.extend(q.all_requirements())
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException:  # plugin code: reported when a step plans it
                continue
        return requirements

    @staticmethod
    def observed_keys(tasks: Sequence[Task]) -> frozenset[str]:
        """The ``info`` keys the ``tasks`` (planned without errors) take from the forward pass."""
        return observed_keys(t.requirements for t in tasks)

    def prepare(self, step: int) -> None:
        """Arm the providers the forward pass of ``step`` needs, disarm the others."""
        if not self._follow_schedule:
            self._arm(self._everything)
            return
        tasks, merged = self.plan(step, predict=True)
        self._arm(merged.statistics, merged.loss_graph, self.observed_keys(tasks), merged.probes)

    def after_step(self, step: int) -> None:
        """The step's quantities ran: arm the providers for the predicted next step."""
        if self._last is not None and step > self._last:
            self._stride = step - self._last
        self._last = step
        self._planned = None  # the step's quantities changed what comes next
        self.prepare(step + self._stride)

    def forget(self) -> None:
        """Plan the next step afresh (pending quantities or routes changed)."""
        self._planned = None

    def add(self, quantity: Quantity) -> None:
        """Plan ``quantity`` too, from the next step on (``Cockpit.add``, between steps).

        Its statistics join those armed when the schedule cannot be followed, and the
        providers are armed anew for the predicted next step, so that the forward pass of
        its first step is observed.
        """
        if all(q is not quantity for q in self.quantities):
            self.quantities = [*self.quantities, quantity]
        stats = {s.identity: s for s in self._everything}
        for requirements in quantity.all_requirements():
            for stat in requirements.statistics:
                stats.setdefault(stat.identity, stat)
        self._everything = tuple(stats.values())
        self._rearm()

    def unobserved(
        self,
        step: int,
        merged: MergedRequirements,
        accumulate: bool,
        expected: bool = False,
        keys: frozenset[str] = frozenset(),
    ) -> str | None:
        """Arm what ``step`` needs; say why its statistics are lost if it is too late.

        Without ``accumulate`` the forward pass ran before ``with cp(step)``: if a provider
        that observes the forward pass was not armed, it saw nothing, nor did the observer
        if it was not armed for ``keys`` (the ``info`` keys the step takes from the forward
        pass). Everything then stays armed for the rest of the run. ``expected``:
        parameters were just unfrozen (already warned about), so providers missing them is
        no sign of uneven steps.
        """
        late = []
        providers = self.router.unobserved(merged.statistics)
        if providers:
            late.append("the statistics provider(s) " + ", ".join(f"'{n}'" for n in providers))
        if keys and self.observer is not None and not self.observer.covers(keys):
            late.append("cockpit's observer of the batch size and per-sample losses")
        if not late:
            return None
        watching = self.observer.keys if self.observer is not None else frozenset()
        self._arm(merged.statistics, merged.loss_graph, keys | watching)
        if accumulate:  # the micro-batches' forward passes come inside the block
            return None
        if expected:
            return (
                "the forward pass of this step ran before the unfrozen parameters required "
                "gradients, so the statistics providers did not observe it for them"
            )
        self._follow_schedule = False
        self._arm(self._everything)
        predicted = None if self._last is None else self._last + self._stride
        names = " and ".join(late)
        message = (
            f"the forward pass of step {step} ran while {names} "
            f"did not observe it: after step {self._last} the Cockpit expected step "
            f"{predicted}, which needs none. Call cp.prepare(step) before the forward pass "
            "when step numbers are not evenly spaced; the providers now observe every "
            "forward pass for the rest of the run"
        )
        warnings.warn(f"cockpit: {message}.", CockpitWarning, stacklevel=3)  # the with block
        return message

    def close(self) -> None:
        """Disarm and close every provider and the observer; compiled code runs as before."""
        self._stance.set(False)
        self.router.close()
        if self.observer is not None:
            self.observer.close()


def _reraise(q: Quantity, step: int, phase: str, err: BaseException) -> None:
    raise err
