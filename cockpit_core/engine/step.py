"""One tracked step: which quantity phases run, and the ``with cp(step, ...)`` block."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Literal

import numpy as np
from torch import Tensor

from cockpit_core.distributed import sharded
from cockpit_core.distributed.micro_batch_norms import gather_norms
from cockpit_core.engine import loop_checks, mixed_precision
from cockpit_core.engine.accumulation import (
    batch_from_share,
    merge_info,
    merge_stats,
    micro_batch_size,
)
from cockpit_core.engine.attention import MathAttentionHooks
from cockpit_core.engine.hvp import HessianVectorProducts
from cockpit_core.engine.keep_graph import KeepGraph
from cockpit_core.engine.micro_batch_norms import NormRecorder
from cockpit_core.engine.planner import Outcome, Planner, Task
from cockpit_core.engine.tracker import Tracker
from cockpit_core.errors import (
    CockpitWarning,
    MissingInfoError,
    MisuseError,
    UnsupportedModelError,
)
from cockpit_core.observe import NO_MODEL, how_to_pass
from cockpit_core.observe.probe import ProbeResults
from cockpit_core.quantity import Quantity
from cockpit_core.requirements import MergedRequirements, merge_requirements
from cockpit_core.statistics.projection import resolve_projections
from cockpit_core.statistics.router import Identity, Results
from cockpit_core.step_data import StepData


class StepRun:
    """The ``with cp(step, ...)`` block of one step.

    On entry it validates the step, plans the step's tasks, completes ``info`` and, if
    statistics are needed, enters the backend so that the user's ``backward`` computes
    them. On exit it runs the quantities (unless the block raised) and frees every
    per-step buffer.

    ``info`` is what the loop passed (``info=``); it wins key by key over what cockpit
    knows itself: ``loss`` (``cp(step, loss=...)``) and the Cockpit's ``given`` entries
    (the optimizer) and, in the short form (``lenient``: ``cp(step, loss=loss)``, with or
    without ``info``, or no ``info`` at all), what the observer took from the step's
    forward pass (batch size, inputs, targets, per-sample losses:
    :mod:`cockpit_core.observe`). In the short form a quantity whose ``info`` is still
    incomplete fails at the step through the error policy (recorded, training continues;
    ``on_error="raise"`` raises the :class:`MissingInfoError`), with what cockpit could
    not observe and what to pass; with ``info=`` alone the block raises
    :class:`MissingInfoError` when it begins, as it always did, for a quantity given to the
    constructor (one added with ``cp.add`` fails through the error policy, so that adding
    a quantity never stops training). When a quantity needs
    Hessian-vector products at the step, every ``backward`` inside the block keeps the
    graph (:mod:`cockpit_core.engine.keep_graph`).

    With ``info["grad_scaler"]`` (a ``torch.amp.GradScaler``) every statistic is of the
    unscaled gradients (:mod:`cockpit_core.engine.mixed_precision`). A step in which no tracked
    parameter received a gradient, or whose gradients are not finite, is skipped with
    the reason (``cp.skipped``).

    ``requests`` (``cp(step, *requests)``, e.g. BackPACK extensions) go to the providers
    that accept them, which run in the same ``backward`` even when no quantity is tracked.

    ``attention``: the Cockpit's :class:`~cockpit_core.engine.attention.MathAttentionHooks`, if
    any. They hold the math kernel during each backward pass through a forward pass they
    switched (``torch.utils.checkpoint`` recomputes attention there); a pass that raised
    (the user's ``backward``, or ``torch.autograd.grad`` of the Hessian-vector products,
    e.g. through a reentrant checkpoint) never ends that hold, so the block leaves such a
    kernel when it ends.
    """

    def __init__(
        self,
        tracker: Tracker,
        step: int,
        info: dict[str, Any],
        accumulate: bool = False,
        requests: tuple[Any, ...] = (),
        attention: MathAttentionHooks | None = None,
        loss: Any = None,
        given: dict[str, Any] | None = None,
        lenient: bool = False,
    ):
        self.tracker, self.step, self.info = tracker, step, info
        self.explicit = dict(info)  # what the loop passed: it wins over what cockpit knows
        self.loss, self.given, self.lenient = loss, dict(given or {}), lenient
        self.reasons: dict[str, str] = {}  # why cockpit could not fill an info key
        self.keys: frozenset[str] = frozenset()  # info keys the tasks take from the forward
        self.keep: KeepGraph | None = None
        self.samples_seen = 0  # micro-batches: samples observed so far
        self.inferred = False  # micro-batches: batch_size told by the loss scaling
        self.micro_lenient = False  # a micro-batch was given loss=: the short form
        self.attention = attention
        self.requests = tuple(requests)
        self.routed: dict[str, tuple[Any, ...]] = {}
        self.accumulate = accumulate  # several micro-batches: see cockpit_core.engine.accumulation
        self._backend_ctx: (
            contextlib.AbstractContextManager[tuple[Results, dict[Identity, str]]] | None
        ) = None
        self.stats: Results = {}
        self.missing: dict[Identity, str] = {}
        self.scaler: Any = None
        self.loss_scale = 1.0
        self.loss_gradients: list[mixed_precision.LossGradient] = []
        # what __enter__ sets, neutral until it does: cleanup never meets a missing attribute
        self.tasks: list[Task] = []
        self.merged: MergedRequirements = merge_requirements(())
        self.batch_size = 0
        self.unobserved: str | None = None
        self.marks: list[loop_checks.GradientMark] = []
        self.sync: Any = None
        self.norms: NormRecorder | None = None  # each micro-batch's gradient norms, if needed
        self.refusal: str | None = None  # why no quantity runs (sharded parameters), if so
        self.refused: list[Task] = []  # the tasks that refusal keeps from running
        self.sharded = False  # FSDP2 shards (cockpit_core.distributed.sharded)
        self.unsharded_only: dict[str, list[Task]] = {}  # refused there, by reason
        self._began = False  # tracker.begin_step ran: the tracker is in this step
        self._entered = False  # __enter__ finished: __exit__ has something to leave

    def __enter__(self) -> StepRun:
        try:
            self._enter()
        except BaseException as err:
            self._abandon(err)
            raise
        self._entered = True
        return self

    def _abandon(self, err: BaseException) -> None:
        """``__enter__`` raised ``err``: undo what it set up; its error is the one that counts."""
        for probe in self.loss_gradients:
            probe.close()
        if self.norms is not None:
            self.norms.close()
        ctx, self._backend_ctx = self._backend_ctx, None
        with contextlib.suppress(Exception):
            if ctx is not None:
                with self._cockpit_passes():
                    ctx.__exit__(type(err), err, err.__traceback__)
            if self.sync is not None:
                self.sync.close()
        if self._began:
            self.tracker.end_step(completed=False)
            self.tracker.cost.discard()
        self.stats, self.info = {}, {}

    def _enter(self) -> None:
        tracker, step = self.tracker, self.step
        started = tracker.cost.clock()
        if tracker.in_step:
            raise MisuseError(
                f"cp({step}) entered while another cockpit step is active; use one "
                "`with cp(step, ...)` block per training step, around loss.backward()."
            )
        if not isinstance(step, (int, np.integer)) or isinstance(step, bool):
            raise MisuseError(f"step must be an integer, got {step!r}.")
        if tracker.last_step is not None and step <= tracker.last_step:
            raise MisuseError(
                f"step {step} comes after step {tracker.last_step}: steps must increase. Pass the "
                "global iteration counter, not the epoch-local batch index."
            )
        observer = tracker.observer
        watches = self.lenient and observer is not None and observer.model is not None
        if self.accumulate and not self.info.get("batch_size") and not watches:
            raise MisuseError(
                "cp(step, accumulate=True) needs info={'batch_size': B} with B the number of "
                "samples of all micro-batches together (on this process), or the model "
                "(Cockpit(model, ...)), whose micro-batches cockpit then observes."
            )
        if self.accumulate and self.loss is not None:
            raise MisuseError(
                "cp(step, loss=..., accumulate=True): pass each micro-batch's loss to "
                "run.micro_batch(loss=...) instead; the step's loss is their sum."
            )
        # before anything arms providers: whether one was armed tells if it saw the forward
        self.routed, late = tracker.router.request(self.requests, where=f"cp({step}, ...)")
        self.scaler = self.info.get("grad_scaler")
        if self.scaler is not None:
            mixed_precision.check_scaler(self.scaler)
        self.loss_scale = mixed_precision.loss_scale(self.scaler)
        unfrozen = self._watch_parameters()
        planner = tracker.planner
        self.tasks, self.merged = planner.plan(step)
        # sharded parameters (FSDP2): decided from their types and layouts, the same on every
        # process, so no process issues a collective that another skips
        model = tracker.router.model if self.tasks else None  # listing it costs: tracked steps
        world = tracker.dist.world if tracker.dist is not None else None
        self.refusal = sharded.refusal(tracker.params, tracker.param_names, model, world)
        if self.refusal is not None:
            self.refused, self.tasks = self.tasks, []
            self.merged = merge_requirements(())
        elif sharded.is_sharded(tracker.params):
            self.sharded = True
            for task in self.tasks:
                why = sharded.task_refusal(task.requirements)
                if why is not None:
                    self.unsharded_only.setdefault(why, []).append(task)
            if self.unsharded_only:
                refused = [t for ts in self.unsharded_only.values() for t in ts]
                self.tasks = [t for t in self.tasks if t not in refused]
                self.merged = planner.merged_for(self.tasks)
        if self.tasks and not self.sharded:  # FSDP2 swaps the root's parameters in forward
            self._warn_removed()
        first = not self.accumulate and tracker.first_time("info")
        self.keys = Planner.observed_keys(self.tasks)
        wanted = self.keys | (planner.all_observed_keys() if first else frozenset())
        self.info = self._gather(wanted)
        if first:
            if not self.lenient:
                tracker.check_info(self.info, tracker.quantities)
            tracker.warn_misuse(self.info)
        if not self.accumulate:  # micro-batches bring loss and individual_losses later
            self._check_info(self.lenient)
        self.batch_size = int(self.info.get("batch_size") or 0)
        watched = self.keys & {"batch_size", "individual_losses"} if self.lenient else set()
        self.unobserved = planner.unobserved(
            step,
            self.merged,
            self.accumulate,
            expected=bool(unfrozen),
            keys=frozenset(watched - set(self.explicit)),
        )
        if late and not self.accumulate:  # micro-batches' forward passes come inside the block
            self.unobserved = self.unobserved or self._warn_late_requests(late)
        self._warn_batch_norm()
        self.marks = loop_checks.gradient_marks(tracker.params)
        if (self.merged.statistics or self.routed) and not self.accumulate:
            batch_size = self.info.get("batch_size") or len(self.info.get("individual_losses", ()))
            self._backend_ctx = tracker.router.collect(
                self.merged,
                int(batch_size),
                info=self.info,
                eager=tracker.dist is None,
                loss_scale=self.loss_scale,
                requests=self.requests,
            )
            self.stats, self.missing = self._backend_ctx.__enter__()
        self.sync = None
        if tracker.dist is not None and self.refusal is None:  # every process's batch size
            self.sync = tracker.dist.begin(self.info, tracker.params, self.sharded)
        if not self.accumulate:  # the gradient backward sends into the loss: its scale
            self.loss_gradients.append(mixed_precision.LossGradient(self.info.get("loss")))
        tracker.begin_step(step)  # what cp.log and cp.add say, and check, inside the block
        self._began = True
        if tracker.debug:
            names = ", ".join(f"{t.quantity.key}({t.phase})" for t in self.tasks) or "nothing"
            stats = ", ".join(s.describe() for s in self.merged.statistics) or "none"
            extra = "".join(
                f"; requests to {n}: {', '.join(type(r).__name__ for r in rs)}"
                for n, rs in self.routed.items()
            )
            print(f"[cockpit] step {step}: tracking {names}; statistics: {stats}{extra}")
        tracked = bool(self.tasks or self.merged.statistics)
        tracker.cost.entered(step, started, tracked)  # the previous step's cost record
        if self.merged.micro_batch_norms:  # hooks each micro-batch's backward pass
            self.norms = NormRecorder(tracker.params, tracker.param_names, self.loss_scale)
            if not self.accumulate:  # the block is the one micro-batch
                self.norms.begin()
        if self.merged.loss_graph:  # last: nothing after it may raise
            self.keep = KeepGraph().__enter__()

    def _gather(self, wanted: frozenset[str]) -> dict[str, Any]:
        """The step's ``info``: what cockpit knows and observed, then the loop's ``info``.

        Observations are taken here unless micro-batches take them (``accumulate``), and
        used only in the short form (``lenient``): ``info=`` alone is the whole ``info``
        but for the Cockpit's ``given`` entries, as it always was.
        """
        info = dict(self.given)
        if self.loss is not None:
            info["loss"] = self.loss
        observer = self.tracker.observer
        if observer is not None and not self.accumulate:
            seen = observer.take(wanted - set(self.explicit) if self.lenient else ())
            info.update(seen.info)
            self.reasons.update(seen.reasons)
        info.update(self.explicit)
        return info

    def _check_info(self, lenient: bool) -> None:
        """Deal with quantities whose ``info`` lacks a key they need.

        In the short form (``lenient``) each scheduled one fails at the step through the
        error policy (recorded, training continues; ``on_error="raise"`` raises). With
        ``info=`` alone a quantity given to the constructor raises
        :class:`MissingInfoError` (the contract of that form), while one added with
        ``cp.add`` fails through the error policy, at the first step after it was added
        (also when first scheduled later) and whenever it is scheduled.
        """
        tracker = self.tracker
        scheduled = list({id(t.quantity): t.quantity for t in self.tasks}.values())
        unchecked = tracker.take_unchecked()
        if lenient:
            self._drop_uninformed(scheduled)
            return
        tracker.check_info(self.info, scheduled)
        later = [q for q in unchecked if all(q is not s for s in scheduled)]
        self._drop_uninformed([q for q in scheduled if tracker.was_added(q)] + later)

    def _drop_uninformed(self, quantities: list[Quantity]) -> None:
        """Those of ``quantities`` that lack an ``info`` key fail through the error policy.

        Their tasks do not run at this step. The message names each missing key, why
        cockpit could not fill it and what to pass.
        """
        tracker = self.tracker
        missing = tracker.missing_info(self.info, quantities)
        if not missing:
            return
        dropped = set()
        for q, keys in missing:
            dropped.add(q.key)
            if any(t.quantity is q and t.phase == "end" for t in self.tasks):
                tracker.planner.drop([q.key])  # its start is unusable without the end
            error = MissingInfoError(self._missing_message(q, keys))
            tracker.policy.quantity_failed(q, self.step, "info", error)
        self.tasks = [t for t in self.tasks if t.quantity.key not in dropped]
        self.merged = tracker.planner.merged_for(self.tasks)

    def _missing_message(self, q: Quantity, keys: list[str]) -> str:
        """``'q' needs info['key'] (why cockpit has none): what to do``, keys grouped by why."""
        added_by = " (added with cp.add)" if q.key in self.tracker.added_at else ""
        groups: dict[str | None, list[str]] = {}
        for key in keys:
            groups.setdefault(self.reasons.get(key), []).append(key)
        parts = []
        for why, group in groups.items():
            names = [f"info['{k}']" for k in group]
            listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
            hows = list(dict.fromkeys(how_to_pass(k, why) for k in group))
            if len(hows) > 1 and all(h.startswith("pass ") for h in hows):
                hows = ["pass " + "; ".join(h.removeprefix("pass ") for h in hows)]
            parts.append(listed + (f" ({why})" if why else "") + ": " + "; ".join(hows))
        return f"'{q.key}'{added_by} needs " + "; and ".join(parts) + "."

    def _warn_late_requests(self, late: list[str]) -> str:
        """Warn that providers receiving their first requests missed the forward pass."""
        step = self.step
        names = ", ".join(f"'{n}'" for n in late)
        shown = ", ".join(type(r).__name__ for n in late for r in self.routed[n])
        message = (
            f"the forward pass of step {step} ran while the statistics provider(s) {names} "
            f"did not observe it, so the requests passed to cp({step}, ...) that they serve "
            f"({shown}) are not computed at this step, nor are their statistics. They observe "
            "every forward pass from now on; to have the requests from the first step that "
            "passes them, call cp.prepare(step, *requests) with them before its forward pass"
        )
        warnings.warn(f"cockpit: {message}.", CockpitWarning, stacklevel=3)
        return message

    def _watch_parameters(self) -> list[int]:
        """Warn (once each) about parameters frozen, unfrozen, reshaped or removed; return the unfrozen."""
        tracker, step = self.tracker, self.step
        policy, watch = tracker.policy, tracker.watch
        frozen, unfrozen, reshaped = watch.changes()
        if frozen:
            policy.warn_once(("", "frozen"), watch.frozen_message(step, frozen), stacklevel=5)
        if unfrozen:
            policy.warn_once(("", "unfrozen"), watch.unfrozen_message(step, unfrozen), stacklevel=5)
        if reshaped:
            policy.warn_once(("", "reshaped"), watch.reshaped_message(step, reshaped), stacklevel=5)
            tracker.planner.drop()
            router = tracker.router
            if router.model is not None:  # routes depend on the modules' shapes
                router.attach(router.model, router.loss_fn)
            tracker.planner.forget()
        return unfrozen

    def _warn_removed(self) -> None:
        """Warn (once) about tracked parameters the model no longer holds (a replaced layer).

        Only at tracked steps: listing a model's parameters costs more than an untracked
        step of a small model, and only a tracked step reads them.
        """
        tracker = self.tracker
        removed = tracker.watch.removed(tracker.router.model)
        if removed:
            message = tracker.watch.removed_message(self.step, removed)
            tracker.policy.warn_once(("", "removed"), message, stacklevel=5)

    def _warn_batch_norm(self) -> None:
        """At the first step with per-sample statistics: BatchNorm in training mode.

        Found in the attached model, else in the autograd graph of ``info["loss"]``.
        """
        tracker = self.tracker
        if not any(s.per_sample for s in self.merged.statistics):
            return
        if not tracker.first_time("batch_norm"):
            return
        model = tracker.router.model
        names = (
            loop_checks.batch_norm_in_training(model)
            if model is not None
            else loop_checks.batch_norm_in_graph(
                self.info.get("loss"), tracker.params, tracker.param_names
            )
        )
        if names:
            message = loop_checks.batch_norm_message(names)
            tracker.policy.warn_once(("", "batch_norm"), message, stacklevel=5)

    @contextlib.contextmanager
    def micro_batch(
        self, info: dict[str, Any] | None = None, *, loss: Any = None
    ) -> Iterator[None]:
        """Context around one micro-batch's ``backward()`` in a step with ``accumulate=True``.

        ``loss`` (or ``info["loss"]``) is the scaled loss the micro-batch backpropagates
        (summed over micro-batches). Its ``individual_losses`` (concatenated) and
        ``batch_size`` come from ``info`` or, in the short form (the step opened without
        ``info``, or ``loss=`` given here) and when cockpit knows the model (and the loss),
        from the micro-batch's forward pass; ``info`` wins key by key. Its statistics are
        collected around its ``backward()`` and combined with the earlier micro-batches'
        by each statistic's combine rule (:mod:`cockpit_core.engine.accumulation`). In the short
        form, quantities whose ``info`` is incomplete when the step ends fail through the
        error policy instead of raising :class:`MissingInfoError`.

        Without ``info={"batch_size": B}`` for the whole step, cockpit reads ``B`` from the
        first micro-batch: its loss is its mean per-sample loss scaled by its share
        ``B_k / B`` (:func:`~cockpit_core.engine.accumulation.batch_from_share`); the step's
        batch size is the sum of the micro-batches'.
        """
        if not self.accumulate:
            raise MisuseError(
                "run.micro_batch() needs a step opened with cp(step, info=..., accumulate=True)."
            )
        explicit = dict(info or {})
        info = {} if loss is None else {"loss": loss}
        observe = self.lenient or loss is not None  # the short form, for the step or here
        self.micro_lenient = self.micro_lenient or loss is not None
        observer = self.tracker.observer
        if observer is not None:
            seen = observer.take(self.keys - set(explicit) if observe else ())
            info.update(seen.info)
            for key, why in seen.reasons.items():
                self.reasons.setdefault(key, why)
        info.update(explicit)
        samples = micro_batch_size(info)
        self.samples_seen += samples
        problem = self._total_batch(info, samples) if not self.batch_size else None
        ctx = None
        stats: Results = {}
        missing: dict[Identity, str] = {}
        if problem is not None:
            for stat in self.merged.statistics:
                self.missing.setdefault(stat.identity, problem)
        elif self.merged.statistics or self.requests:
            ctx = self.tracker.router.collect(
                self.merged,
                self.batch_size,
                info={**self.info, **info},
                eager=False,
                samples=samples or None,
                loss_scale=self.loss_scale,
                requests=self.requests,
            )
            stats, missing = ctx.__enter__()
        probe = mixed_precision.LossGradient(info.get("loss"))
        self.loss_gradients.append(probe)
        share = samples / self.batch_size if samples and self.batch_size else None
        if self.norms is not None:
            self.norms.begin()
        try:
            yield
        except BaseException as err:
            probe.close()
            if self.norms is not None:
                self.norms.close()
            if ctx is not None:
                with self._cockpit_passes():
                    ctx.__exit__(type(err), err, err.__traceback__)
            raise
        probe.close()
        if self.norms is not None:  # before a provider recomputes the pass
            self.norms.end(samples, share)
        if ctx is not None:
            with self._cockpit_passes():
                ctx.__exit__(None, None, None)
        merge_stats(self.merged.statistics, self.stats, self.missing, stats, missing, share)
        merge_info(self.info, info)

    def _total_batch(self, info: dict[str, Any], samples: int) -> str | None:
        """Learn the step's batch size from the first micro-batch; else say why not."""
        total, why = batch_from_share(info.get("loss"), info.get("individual_losses"), samples)
        if total:
            self.batch_size, self.inferred = total, True
            return None
        return (
            "with accumulate=True cockpit needs the step's total batch size before the first "
            f"micro-batch's backward pass, and {why}: pass cp(step, accumulate=True, "
            "info={'batch_size': B}), or give cockpit the loss (loss_fn=) and each "
            "micro-batch's scaled loss (run.micro_batch(loss=loss_k), loss_k = "
            "mean_k * B_k / B)"
        )

    def _cockpit_passes(self) -> contextlib.AbstractContextManager[None]:
        """Forward passes of the model inside are cockpit's own (providers recomputing)."""
        observer = self.tracker.observer
        return observer.paused() if observer is not None else contextlib.nullcontext()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if not self._entered:  # __enter__ raised (and cleaned up) or never ran
            return False
        self._entered = False
        keep, self.keep = self.keep, None
        if keep is not None:  # torch.autograd.backward is PyTorch's again
            keep.__exit__(None, None, None)
        try:
            return self._exit(exc_type, exc, tb)
        finally:
            if self.tracker.observer is not None:  # passes inside the block are not the next step's
                self.tracker.observer.end_step()
            if self.attention is not None:  # held by a backward pass that raised
                self.attention.release()

    def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        tracker = self.tracker
        exit_started = tracker.cost.clock()
        tracker.end_step(completed=exc_type is None)
        seen = [g.close() for g in self.loss_gradients]
        if self.norms is not None:  # before a provider recomputes the pass
            if exc_type is None and not self.accumulate:
                self.norms.end(self.batch_size, 1.0)
            self.norms.close()
        try:
            if self._backend_ctx is not None:
                with self._cockpit_passes():
                    self._backend_ctx.__exit__(exc_type, exc, tb)
        finally:
            self._backend_ctx = None
        if self.unobserved is not None:
            note = self.unobserved[0].upper() + self.unobserved[1:]
            for ident, reason in self.missing.items():
                self.missing[ident] = f"{note} ({reason})"
        if exc_type is not None:
            if self.sync is not None:
                self.sync.close()
            tracker.planner.after_step(self.step)
            tracker.cost.discard()
            return False
        try:
            self._finish(seen)
        except BaseException:
            tracker.cost.discard()
            raise
        finally:
            self.stats = {}
            self.info = {}
            tracker.cache.evict(self.step)
            tracker.planner.after_step(
                self.step
            )  # hooks for the next forward pass, if it needs them
        tracker.cost.exited(exit_started)
        return False

    def _grad_factor(self) -> float:
        """What ``p.grad`` is multiplied by now: the loss scale, unless already unscaled."""
        if self.scaler is None or self.loss_scale == 1.0:
            return 1.0
        done = mixed_precision.grads_unscaled(self.scaler, self.info.get("optimizer"))
        if done is None:
            self.tracker.policy.warn_once(
                ("", "scaler state"),
                f"cannot tell whether scaler.unscale_() ran inside `with cp({self.step}, ...)` "
                f"(info['grad_scaler'] is a {type(self.scaler).__name__} without PyTorch's "
                "per-optimizer state): cockpit assumes p.grad is still scaled. Call "
                "scaler.unscale_(optimizer) only after the block.",
                stacklevel=6,
            )
        return 1.0 if done else self.loss_scale

    def _finish(self, seen: list[float | None]) -> None:
        """After a block that did not raise: checks, the statistics' last steps, the quantities."""
        tracker, step = self.tracker, self.step
        if self.refusal is not None:
            self._refuse(self.refusal, self.refused)
            return
        for why, tasks in self.unsharded_only.items():
            self._refuse(why, tasks, f"sharded: {why}")
        if self.sync is None:
            self._forgive_frozen()
        factor = self._grad_factor()
        if not self.sharded:  # the hooks compare each unsharded layer's mean there
            self._check_per_sample_mean(factor)
        self._check_loss_scale(seen)
        if self.accumulate:
            self._accumulated_batch()
            self._check_info(self.lenient or self.micro_lenient)
        if (
            self.tasks
            and tracker.dist is None
            and not loop_checks.gradients_changed(tracker.params, self.marks)
        ):
            tracker.policy.skip(
                step,
                self.tasks,
                f"no backward: {loop_checks.no_backward_reason(step)}",
                ("", "no backward"),
                f"step {step} skipped: {loop_checks.no_backward_reason(step)}. Call "
                "loss.backward() inside the block; quantities would see zero or stale "
                "gradients. Skipped steps are in cp.skipped and the log.",
                stacklevel=5,
            )
            return
        hvp = None
        if self.merged.loss_graph:
            hvp = HessianVectorProducts(self.info.get("loss"), tracker.params, factor)
        grads = None
        data_factor = factor
        if self.sync is not None:  # combine the processes' statistics: the global batch
            self.info, self.stats, self.missing, grads, hvp = self.sync.finish(
                self.info, self.stats, self.missing, self.merged, hvp
            )
            grads, data_factor = self._unscale_global(grads, factor), 1.0
        norms = None if self.norms is None else self.norms.result()
        if norms is not None and tracker.dist is not None:  # every process's micro-batches
            d = tracker.dist
            device = d.device(tracker.params)
            norms = gather_norms(norms, len(tracker.params), d.group, d.rank, d.world, device)
        make: Callable[..., StepData] = StepData
        if self.sharded:
            assert self.sync is not None  # sharded steps combine over the processes
            make = functools.partial(
                sharded.ShardedStepData,
                sharded=tracker.params,
                rank=self.sync.d.rank,
                world=self.sync.d.world,
                local_grads=grads,
                gradient_reason=self.sync.gradient.reason,
                declared=self.merged.statistics,
            )
        data = make(
            step,
            self.info,
            tracker.params,
            tracker.param_names,
            self.stats,
            self.missing,
            hvp,
            grads,
            data_factor,
            self._probe_results(),
            norms,
        )
        try:
            if self.sync is None and any(s.combine == "project" for s in self.merged.statistics):
                declared = self.merged.statistics
                resolve_projections(self.stats, data.grads, tracker.params, declared, self.missing)
            skipped = bool(self.tasks) and self._skip_nonfinite(factor)
            if self.sync is not None:  # every process takes part, in the same order
                self.sync.run(tracker, step, self.tasks, data, skipped)
            elif self.tasks and not skipped:
                tracker.run(step, self.tasks, data)
        finally:
            data.release()

    def _refuse(self, reason: str, tasks: list[Task], key: str = "sharded") -> None:
        """Record ``tasks`` as failed for ``reason``; warn once per Cockpit (and ``key``)."""
        if not tasks:
            return
        note = " Training continues; each refused quantity is in cp.errors and the log."
        self.tracker.policy.warn_once(("", key), reason + note)
        err = UnsupportedModelError(reason)
        with warnings.catch_warnings():  # the one warning above, not one per quantity
            warnings.simplefilter("ignore", CockpitWarning)
            self.tracker.record(self.step, tasks, [Outcome(False, err)] * len(tasks))

    def _probe_results(self) -> ProbeResults:
        """What the step's probes recorded, and for each that recorded nothing, why."""
        observer = self.tracker.observer
        results = observer.probes.take() if observer is not None else ProbeResults()
        for probe in self.merged.probes:
            if probe.key in results.values or probe.key in results.errors:
                continue
            if observer is None or observer.model is None:
                why = f"{NO_MODEL}: give it the model, Cockpit(model, ...) or cp.attach(model)"
            else:
                why = (
                    "no module it selects ran in a forward pass with gradients enabled since "
                    "the previous step (a forward pass under torch.no_grad() is not watched; "
                    "with unevenly spaced step numbers, call cp.prepare(step) before the "
                    "forward pass)"
                )
            results.errors[probe.key] = why
        return results

    def _accumulated_batch(self) -> None:
        """The step's batch size: the micro-batches' samples, if cockpit observed them.

        If the first micro-batch's loss scaling told another total, every statistic of
        the step is missing: the micro-batches' per-sample scaling was wrong.
        """
        if self.samples_seen and "batch_size" not in self.info:
            self.info["batch_size"] = self.samples_seen
        if self.inferred and self.batch_size != self.samples_seen:
            message = (
                f"the first micro-batch's loss was scaled for {self.batch_size} samples in "
                f"all, but the micro-batches held {self.samples_seen}: scale each "
                "micro-batch's loss by its share B_k / B of the step's samples, or pass "
                "cp(step, accumulate=True, info={'batch_size': B})"
            )
            for stat in self.merged.statistics:
                self.stats.pop(stat.identity, None)
                self.missing[stat.identity] = message

    def _forgive_frozen(self) -> None:
        """Frozen parameters get no statistics: not "missing" even if ``p.grad`` is a tensor."""
        params = self.tracker.params
        if not self.missing or all(p.requires_grad for p in params):
            return
        for ident in list(self.missing):
            row = self.stats.get(ident)
            if row is not None and all(
                v is not None or p.grad is None or not p.requires_grad for v, p in zip(row, params)
            ):
                del self.missing[ident]

    def _skip_nonfinite(self, factor: float) -> bool:
        policy = self.tracker.policy
        enabled = self.scaler is not None and mixed_precision.enabled(self.scaler)
        scale = self.loss_scale if enabled else None
        if scale is not None and factor == 1.0 and self.loss_scale != 1.0:
            # unscale_ ran inside the block: the scaler knows whether it found inf/NaN
            if mixed_precision.found_inf(self.scaler, self.info.get("optimizer")):
                policy.skip_scaler_overflow(self.step, self.tasks, self.loss_scale)
                return True
        params: Any = self.tracker.params
        if self.sharded:  # each process checks its own rows; a skip is shared by all
            params = sharded.local_params_for_checks(params)
        return policy.skip_nonfinite(
            self.step, self.tasks, self.info, params, self.tracker.param_names, scale
        )

    def _unscale_global(self, grads: list[Tensor], factor: float) -> list[Tensor]:
        """Under ``torch.distributed``: unscale the global gradient; drop scaled projections."""
        if self.scaler is None or self.loss_scale == 1.0:
            return grads
        assert self.sync is not None  # called under torch.distributed only
        captured = not self.sync.shares.equal  # local gradients captured during backward
        scale = self.loss_scale if captured else factor
        if scale == 1.0:
            return grads
        for stat in self.merged.statistics:
            if stat.combine == "project" and stat.identity in self.stats:
                self.stats.pop(stat.identity)
                self.missing.setdefault(
                    stat.identity,
                    f"{stat.describe()} projects on the global gradient, which is still scaled "
                    "by the GradScaler here: under torch.distributed call "
                    "scaler.unscale_(optimizer) inside the `with cp(...)` block, after "
                    "backward(), with equal local batch sizes (docs/mixed_precision.md).",
                )
        return mixed_precision.unscaled(grads, scale)

    def _check_loss_scale(self, seen: list[float | None]) -> None:
        """Warn (once) if the loss was backpropagated with a scale cockpit was not told."""
        for value in seen:
            message = loop_checks.scaled_loss(value, self.loss_scale, self.scaler is not None)
            if message is not None:
                self.tracker.policy.warn_once(("", "loss scale"), message, stacklevel=6)
                return

    def _check_per_sample_mean(self, factor: float = 1.0) -> None:
        """Warn (once) if ``p.grad`` is not the mean of the per-sample gradients."""
        tracker = self.tracker
        checked = tracker.router.take_per_sample_check()
        if checked is None:
            return
        index, ratio, residual = checked
        grad = tracker.params[index].grad
        assert grad is not None  # it was compared with the per-sample mean
        message = loop_checks.per_sample_mismatch(
            tracker.param_names[index],
            ratio / factor,
            residual,
            self.batch_size,
            loop_checks.gradient_precision(grad),
        )
        if message is not None:
            tracker.policy.warn_once(("", "per-sample mean"), message, stacklevel=6)
