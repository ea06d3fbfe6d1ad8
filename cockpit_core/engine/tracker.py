"""The state one tracking run shares across its steps, and its single owner: :class:`Tracker`.

A :class:`~cockpit_core.Cockpit` is the user-facing facade; the :class:`Tracker` behind it
owns everything a step reads or changes: the planner (which quantity phases run), the
error policy (failures, skipped steps), the cross-step cache, the values kept in memory,
the sinks, and where the run is (the last step, the active step). A step
(:class:`~cockpit_core.engine.step.StepRun`) changes that state only through the methods here.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from cockpit_core.cache import Cache
from cockpit_core.context import StepContext
from cockpit_core.diagnosing.runner import DiagnosisRunner
from cockpit_core.diagnosing.triggers import Triggers, bind_triggers
from cockpit_core.diagnosis import Finding
from cockpit_core.distributed.batch import Distributed
from cockpit_core.engine import loop_checks
from cockpit_core.engine.cost import CostMeter
from cockpit_core.engine.error_policy import ErrorPolicy
from cockpit_core.engine.normalize import to_serializable
from cockpit_core.engine.planner import NOT_RUN, Outcome, Planner, Task
from cockpit_core.errors import CockpitWarning, MissingInfoError
from cockpit_core.observe import ForwardObserver
from cockpit_core.quantity import Quantity
from cockpit_core.statistics.router import StatisticsRouter
from cockpit_core.step_data import StepData

Record = dict[str, Any]
Sink = Callable[[Record], None]

DIAGNOSED_KINDS = ("header", "values", "skipped", "cost")
"""The kinds of records the diagnoses running while training observe."""


class Tracker:
    """Owner of a run's step state.

    Args:
        params: The tracked parameters.
        param_names: Their names.
        quantities: The tracked quantities (the Cockpit's list; :meth:`add` extends it).
        router: The statistics router (which provider computes what).
        on_error: The error policy's mode (``"warn"``, ``"disable"``, ``"raise"``).
        sinks: Where every record goes (the log first, if any).
        dist: The process group's helper under ``torch.distributed``, else ``None``.
        debug: Print what is computed at each step.
        keep_in_memory: Keep values for ``get_output``.
        diagnoses: Runs diagnoses on the records (``None``: no diagnoses while training).
        observer: Watches the forward pass for the ``info`` a step takes from it
            (``None``: the steps' ``info`` is what the loop passes).

    Attributes:
        planner: Which quantity phases run at a step; pending and disabled quantities.
        observer: The ``observer`` argument.
        policy: Failures and skipped steps.
        cache: Values quantities keep across steps.
        watch: Frozen, unfrozen and reshaped parameters.
        output: ``{step: {key: value}}`` kept in memory.
        added_at: Key of a tracked quantity added with ``cp.add`` -> its first step.
        listed: Every quantity tracked in this run, removed ones too, in the order the
            header lists them (:meth:`marks`).
        last_step: The last step whose block completed (``None`` before the first).
        active_step: The step whose ``with`` block runs now (``None`` outside blocks).
        findings: What the diagnoses found so far, each finding once.
        on_finding: Called with each new finding instead of the ``CockpitWarning`` about
            it (``None``: warn); a framework integration reports findings its own way.
        triggers: Per diagnosis, the step of its latest finding: what quantities with an
            ``on_finding`` schedule follow (their schedules are bound to it here and in
            :meth:`add`; :mod:`cockpit_core.diagnosing.triggers`).
        cost: What each step costs; emits a ``cost`` record per tracked step.

    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        param_names: Sequence[str],
        quantities: list[Quantity],
        router: StatisticsRouter,
        *,
        on_error: str,
        sinks: list[Sink],
        dist: Distributed | None,
        debug: bool,
        keep_in_memory: bool,
        diagnoses: DiagnosisRunner | None = None,
        observer: ForwardObserver | None = None,
    ):
        self.params = params
        self.param_names = param_names
        self.quantities = quantities
        self.router = router
        self.sinks = sinks
        self.dist = dist
        self.debug = debug
        self.keep_in_memory = keep_in_memory
        self.diagnoses = diagnoses
        self.findings: list[Finding] = []
        self.on_finding: Callable[[Finding], None] | None = None
        self.cost = CostMeter(self.emit)
        self.cache = Cache()
        self.observer = observer
        self.triggers = Triggers()
        self._bind_triggers(quantities)
        self.planner = Planner(quantities, router, observer)
        self.policy = ErrorPolicy(on_error, self.emit, self.planner, self.cache)
        self.planner.report = self.policy.quantity_failed  # raising schedules, requirements
        self.watch = loop_checks.ParameterWatch(params, param_names)
        self.output: dict[int, dict[str, Any]] = {}
        self.added_at: dict[str, int] = {}
        self.listed: list[Quantity] = list(quantities)
        self.last_step: int | None = None
        self.active_step: int | None = None
        self._done_once: set[str] = set()
        self._info_unchecked: list[Quantity] = []  # added quantities: check at the next step
        self._marks: dict[int, dict[str, int]] = {}  # id(quantity) -> added_at, removed_at

    # -- where the run is -------------------------------------------------------------------

    @property
    def in_step(self) -> bool:
        """Whether a ``with cp(step, ...)`` block is active."""
        return self.active_step is not None

    def begin_step(self, step: int) -> None:
        """Enter the block of ``step`` (validated by the caller)."""
        self.active_step = step

    def end_step(self, completed: bool) -> None:
        """Leave the active block; a ``completed`` one (no exception) becomes the last step."""
        if completed and self.active_step is not None:
            self.last_step = self.active_step
        self.active_step = None

    def first_time(self, what: str) -> bool:
        """True the first time it is asked about ``what`` in this run (a one-off check)."""
        if what in self._done_once:
            return False
        self._done_once.add(what)
        return True

    @property
    def done_once(self) -> list[str]:
        """The one-off checks done so far (:meth:`first_time`), for a checkpoint."""
        return sorted(self._done_once)

    def resume(self, last_step: int | None, done_once: Iterable[str]) -> None:
        """Continue a saved run: its last step, its one-off checks."""
        self.last_step = last_step
        self._done_once |= set(done_once)

    # -- quantities ---------------------------------------------------------------------------

    @property
    def next_step(self) -> int:
        """The first step a change between steps applies to: one after the last step."""
        return 0 if self.last_step is None else self.last_step + 1

    def _bind_triggers(
        self, quantities: Sequence[Quantity], path: str = "quantities", source: str | None = None
    ) -> None:
        """Bind ``on_finding`` schedules to :attr:`triggers`; check their diagnoses each step.

        A finding that turns a quantity on must arrive at the step its evidence is logged,
        not up to ``len(window) // CHECKS_PER_WINDOW`` steps later, so the diagnoses that
        triggers follow are checked at every new step
        (:meth:`~cockpit_core.diagnosing.runner.DiagnosisRunner.check_every_step`).
        """
        runner = self.diagnoses
        running = [d.name for d in runner.diagnoses] if runner is not None else []
        names = bind_triggers(
            quantities, self.triggers, running, self.dist is not None, path, source
        )
        if runner is not None and names:
            runner.check_every_step(names)

    def trigger_step(self) -> int:
        """The step a finding reported now follows: the active step, else the last one.

        A finding reported while a step's records are emitted (``__exit__``: values,
        skipped records) follows that step; one reported while the next step enters (its
        predecessor's ``cost`` record) follows the entering step, whose forward pass has
        run already. ``-1`` before the first step.
        """
        if self.active_step is not None:
            return self.active_step
        return -1 if self.last_step is None else self.last_step

    def add(self, quantity: Quantity) -> int:
        """Track ``quantity`` from the next step on; return that step.

        Raises:
            ConfigError: Its ``on_finding`` schedule names a diagnosis that does not run
                (nothing is added).
            MisuseError: An ``on_finding`` schedule under ``torch.distributed``, or the
                instance is tracked by another Cockpit that is not closed.

        """
        self._bind_triggers([quantity], "quantity", "cp.add(...)")
        step = self.next_step
        self.quantities.append(quantity)
        self.listed.append(quantity)
        self.planner.add(quantity)
        self.mark_added(quantity, step)
        self._info_unchecked.append(quantity)
        return step

    def mark_added(self, quantity: Quantity, step: int) -> None:
        """Note that ``quantity`` was added with ``cp.add`` and applies from ``step`` on."""
        self.added_at[quantity.key] = step
        self._marks.setdefault(id(quantity), {})["added_at"] = step

    def remove(self, key: str) -> tuple[Quantity, int]:
        """Stop tracking quantity ``key`` from the next step on; return it and that step.

        Its pending two-step start and its cache entries are dropped; the providers are
        armed anew for the remaining quantities.
        """
        quantity = next(q for q in self.quantities if q.key == key)
        step = self.next_step
        self.quantities[:] = [q for q in self.quantities if q is not quantity]
        self.planner.remove(key)
        self.cache.remove_owner(key)
        self.added_at.pop(key, None)
        self._info_unchecked = [q for q in self._info_unchecked if q is not quantity]
        self._marks.setdefault(id(quantity), {})["removed_at"] = step
        return quantity, step

    def marks(self, quantity: Quantity) -> dict[str, int]:
        """``added_at`` and ``removed_at`` of a listed quantity, those that apply."""
        return dict(self._marks.get(id(quantity), {}))

    def was_added(self, quantity: Quantity) -> bool:
        """Whether ``quantity`` (tracked now) was added with ``cp.add``."""
        return self.added_at.get(quantity.key) is not None

    def take_unchecked(self) -> list[Quantity]:
        """The quantities added since the last step began, whose ``info`` is not checked yet."""
        unchecked, self._info_unchecked = self._info_unchecked, []
        return unchecked

    def missing_info(
        self, info: Mapping[str, Any], quantities: Iterable[Quantity]
    ) -> list[tuple[Quantity, list[str]]]:
        """The quantities that need keys ``info`` lacks, each with those keys (sorted).

        A quantity with per-sample statistics needs ``batch_size`` unless ``info`` has
        ``individual_losses`` (their number).
        """
        out = []
        for q in quantities:
            try:
                needed = set(q.required_info())
                per_sample = any(s.per_sample for r in q.all_requirements() for s in r.statistics)
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException:  # plugin code: the planner records it when it plans the step
                continue
            if per_sample and "individual_losses" not in info:
                needed.add("batch_size")
            keys = sorted(needed - set(info))
            if keys:
                out.append((q, keys))
        return out

    def check_info(self, info: Mapping[str, Any], quantities: Iterable[Quantity]) -> None:
        """Raise :class:`MissingInfoError` if ``info`` lacks a key the quantities need.

        Quantities added with ``cp.add`` are left out: theirs fail through the error policy
        (:class:`~cockpit_core.engine.step.StepRun`), so that adding one never stops training.
        """
        problems = []
        quantities = [q for q in quantities if not self.was_added(q)]
        for q, keys in self.missing_info(info, quantities):
            for key in keys:
                problems.append(f"'{q.key}' needs info['{key}']")
        if problems:
            raise MissingInfoError(
                "Missing info keys: " + "; ".join(problems) + ". Pass them at every step: "
                "with cp(step, info={...}). Common keys: loss, individual_losses, "
                "batch_size, optimizer. Cockpit takes batch_size and individual_losses from "
                "the forward pass when it knows the model and the loss, Cockpit(model, ..., "
                "loss_fn=..., optimizer=opt), and the loss from cp(step, loss=loss) "
                "(docs/quickstart.md)."
            )

    def warn_misuse(self, info: Mapping[str, Any]) -> None:
        """Warn about an optimizer that misses the tracked parameters or a summed loss."""
        for message in (
            loop_checks.optimizer_mismatch(info.get("optimizer"), self.params),
            loop_checks.reduction_mismatch(info),
        ):
            if message:
                warnings.warn(f"cockpit: {message}", CockpitWarning, stacklevel=4)

    def uses_hvp(self, quantity: Quantity) -> bool:
        """Whether ``quantity`` needs Hessian-vector products (the loss graph)."""
        return any(r.loss_graph for r in quantity.all_requirements())

    def all_hvp_disabled(self) -> bool:
        """Whether no enabled quantity needs Hessian-vector products any more."""
        return all(self.planner.is_disabled(q.key) or not self.uses_hvp(q) for q in self.quantities)

    # -- running quantities and recording -------------------------------------------------------

    def run(self, step: int, tasks: list[Task], data: StepData) -> None:
        """Run the step's quantity phases; record values, and failures by the error policy."""
        self.record(step, tasks, self.compute(step, tasks, data))

    def compute(
        self,
        step: int,
        tasks: Sequence[Task],
        data: StepData,
        before: Callable[[int], None] | None = None,
    ) -> list[Outcome]:
        """Each task's outcome, computed here; nothing recorded yet (see :meth:`record`).

        ``before(i)`` runs before task ``i`` (``torch.distributed``: the lockstep slot).
        """
        planner, cache = self.planner, self.cache
        outcomes: list[Outcome] = []
        for i, task in enumerate(tasks):
            if before is not None:
                before(i)
            q = task.quantity
            if planner.is_disabled(q.key):
                outcomes.append(Outcome(True, NOT_RUN))
                continue
            allowed = frozenset(s.identity for s in task.requirements.statistics)
            ctx = StepContext(data, q.key, allowed, cache)
            t0 = time.perf_counter()
            try:
                if task.phase == "single":
                    value = q.compute(ctx)
                elif task.phase == "start":
                    value = q.compute_start(ctx)  # type: ignore[attr-defined]
                else:
                    value = q.compute_end(ctx, planner.ended(q.key))  # type: ignore[attr-defined]
                if value is not None and task.phase != "start":
                    value = to_serializable(value)
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException as err:  # SystemExit from a plugin must not end the run either
                self.cost.quantity(q.key, time.perf_counter() - t0)
                outcomes.append(Outcome(False, err))
                continue
            seconds = time.perf_counter() - t0
            self.cost.quantity(q.key, seconds)
            if self.debug:
                print(f"[cockpit] step {step}: {q.key} ({task.phase}) {1e3 * seconds:.2f} ms")
            outcomes.append(Outcome(True, value))
        return outcomes

    def record(self, step: int, tasks: Sequence[Task], outcomes: Sequence[Outcome]) -> None:
        """Record what :meth:`compute` returned: values, two-step starts, failures."""
        planner = self.planner
        values: dict[int, dict[str, Any]] = {}
        for task, (ok, result) in zip(tasks, outcomes):
            q = task.quantity
            if not ok:
                if task.phase == "end":
                    planner.drop([q.key])
                self.policy.quantity_failed(q, step, task.phase, result)
            elif result is NOT_RUN:
                continue
            elif task.phase == "start":
                planner.started(q.key, step, result)
            elif result is not None:
                values.setdefault(task.start_step, {})[q.key] = result
        for s, vals in sorted(values.items()):
            if self.keep_in_memory:
                self.output.setdefault(s, {}).update(vals)
            self.emit({"kind": "values", "step": s, "values": vals})

    def emit(self, record: Record) -> None:
        """Send ``record`` to every sink; a failing sink is removed (with a warning).

        A ``values`` record with a value the log cannot write is reported by the error
        policy (an ``error`` record of phase ``serialize``).
        """
        for sink in list(self.sinks):
            try:
                sink(record)
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException as err:  # a broken sink (even SystemExit) must not stop training
                self.sinks.remove(sink)
                warnings.warn(
                    f"cockpit: sink {sink!r} failed and was removed: {err} ({type(err).__name__})",
                    CockpitWarning,
                    stacklevel=3,
                )
        if record.get("kind") == "values" and isinstance(record.get("values"), dict):
            self.policy.check_serializable(record["step"], record["values"])
        if self.diagnoses is not None and record.get("kind") in DIAGNOSED_KINDS:
            self._report(self.diagnoses.observe(record))  # each finding id once

    def _report(self, findings: list[Finding]) -> None:
        """Keep, log and announce (``on_finding``, else a ``CockpitWarning``) new findings."""
        for finding in findings:
            self.findings.append(finding)
            self.triggers.fired(finding, self.trigger_step())
            self.emit(finding.to_record())
            if self.on_finding is not None:
                self.on_finding(finding)
                continue
            warnings.warn(
                f"cockpit: {finding.line()}. {finding.suggestion}", CockpitWarning, stacklevel=4
            )

    def close(self) -> None:
        """Finish the diagnoses and the ``cost`` records; disarm; close every sink.

        The diagnoses check once more; findings whose stretch grew since they were reported
        are logged again with the same id and their whole stretch (no second warning).
        """
        self.cost.close()
        self.triggers.closed = True
        if self.diagnoses is not None:
            new, changed = self.diagnoses.finish()
            self._report(new)
            by_id = {f.id: f for f in changed}
            self.findings = [by_id.pop(f.id, f) for f in self.findings]
            for finding in changed:
                self.emit(finding.to_record())
        self.planner.close()
        for sink in list(self.sinks):
            close = getattr(sink, "close", None)
            if callable(close):
                try:
                    close()
                except (KeyboardInterrupt, GeneratorExit):
                    raise
                except BaseException as err:  # plugin code: one sink must not skip the others
                    warnings.warn(
                        f"cockpit: closing sink {sink!r} failed: {err} ({type(err).__name__})",
                        CockpitWarning,
                        stacklevel=3,
                    )
