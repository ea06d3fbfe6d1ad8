"""One tracked step: which quantity phases run, and the ``with cp(step, info=...)`` block."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

from cockpit_core import loop_checks, mixed_precision
from cockpit_core.accumulation import merge_info, merge_stats, micro_batch_size
from cockpit_core.attention import MathAttentionHooks
from cockpit_core.errors import CockpitWarning, MisuseError
from cockpit_core.hvp import HessianVectorProducts
from cockpit_core.statistics.projection import resolve_projections
from cockpit_core.step_data import StepData
from cockpit_core.tracker import Tracker


class StepRun:
    """The ``with cp(step, info=...)`` block of one step.

    On entry it validates the step and ``info``, plans the step's tasks and, if statistics
    are needed, enters the backend so that the user's ``backward`` computes them. On exit
    it runs the quantities (unless the block raised) and frees every per-step buffer.

    With ``info["grad_scaler"]`` (a ``torch.amp.GradScaler``) every statistic is of the
    unscaled gradients (:mod:`cockpit_core.mixed_precision`). A step in which no tracked
    parameter received a gradient, or whose gradients are not finite, is skipped with
    the reason (``cp.skipped``).

    ``requests`` (``cp(step, *requests)``, e.g. BackPACK extensions) go to the providers
    that accept them, which run in the same ``backward`` even when no quantity is tracked.

    ``attention``: the Cockpit's :class:`~cockpit_core.attention.MathAttentionHooks`, if
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
    ):
        self.tracker, self.step, self.info = tracker, step, info
        self.attention = attention
        self.requests = tuple(requests)
        self.routed: dict[str, tuple[Any, ...]] = {}
        self.accumulate = accumulate  # several micro-batches: see cockpit_core.accumulation
        self._backend_ctx: contextlib.AbstractContextManager | None = None
        self.stats: dict = {}
        self.missing: dict = {}
        self.scaler: Any = None
        self.loss_scale = 1.0
        self.loss_gradients: list[mixed_precision.LossGradient] = []

    def __enter__(self) -> StepRun:
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
        if self.accumulate and not self.info.get("batch_size"):
            raise MisuseError(
                "cp(step, accumulate=True) needs info={'batch_size': B} with B the number of "
                "samples of all micro-batches together (on this process)."
            )
        # before anything arms providers: whether one was armed tells if it saw the forward
        self.routed, late = tracker.router.request(self.requests, where=f"cp({step}, ...)")
        self.scaler = self.info.get("grad_scaler")
        if self.scaler is not None:
            mixed_precision.check_scaler(self.scaler)
        self.loss_scale = mixed_precision.loss_scale(self.scaler)
        if not self.accumulate and tracker.first_time("info"):
            tracker.check_info(self.info, tracker.quantities)
            tracker.warn_misuse(self.info)
        unfrozen = self._watch_parameters()
        self.tasks, self.merged = tracker.planner.plan(step)
        if not self.accumulate:  # micro-batches bring loss and individual_losses later
            tracker.check_info(self.info, [t.quantity for t in self.tasks])
        self.batch_size = int(self.info.get("batch_size") or 0)
        self.unobserved = tracker.planner.unobserved(
            step, self.merged, self.accumulate, expected=bool(unfrozen)
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
        if tracker.dist is not None:  # torch.distributed: learn every process's batch size
            self.sync = tracker.dist.begin(self.info, tracker.params)
        if not self.accumulate:  # the gradient backward sends into the loss: its scale
            self.loss_gradients.append(mixed_precision.LossGradient(self.info.get("loss")))
        tracker.begin_step(step)  # what cp.log and cp.add say, and check, inside the block
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
        return self

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
        removed = watch.removed(tracker.router.model)
        if removed:
            policy.warn_once(("", "removed"), watch.removed_message(step, removed), stacklevel=5)
        return unfrozen

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
    def micro_batch(self, info: dict[str, Any] | None = None) -> Iterator[None]:
        """Context around one micro-batch's ``backward()`` in a step with ``accumulate=True``.

        ``info`` holds the micro-batch's ``loss`` (the scaled loss it backpropagates; summed
        over micro-batches), ``individual_losses`` (concatenated) and ``batch_size``. Its
        statistics are collected around its ``backward()`` and combined with the earlier
        micro-batches' by each statistic's combine rule (:mod:`cockpit_core.accumulation`).
        """
        if not self.accumulate:
            raise MisuseError(
                "run.micro_batch() needs a step opened with cp(step, info=..., accumulate=True)."
            )
        info = dict(info or {})
        samples = micro_batch_size(info)
        ctx = None
        stats: dict = {}
        missing: dict = {}
        if self.merged.statistics or self.requests:
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
        try:
            yield
        except BaseException as err:
            probe.close()
            if ctx is not None:
                ctx.__exit__(type(err), err, err.__traceback__)
            raise
        probe.close()
        if ctx is not None:
            ctx.__exit__(None, None, None)
        share = samples / self.batch_size if samples else None
        merge_stats(self.merged.statistics, self.stats, self.missing, stats, missing, share)
        merge_info(self.info, info)

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        try:
            return self._exit(exc_type, exc, tb)
        finally:
            if self.attention is not None:  # held by a backward pass that raised
                self.attention.release()

    def _exit(self, exc_type, exc, tb) -> Literal[False]:
        tracker = self.tracker
        exit_started = tracker.cost.clock()
        tracker.end_step(completed=exc_type is None)
        seen = [g.close() for g in self.loss_gradients]
        try:
            if self._backend_ctx is not None:
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
        if self.sync is None:
            self._forgive_frozen()
        factor = self._grad_factor()
        self._check_per_sample_mean(factor)
        self._check_loss_scale(seen)
        if self.accumulate:
            tracker.check_info(self.info, [t.quantity for t in self.tasks])
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
        data = StepData(
            step,
            self.info,
            tracker.params,
            tracker.param_names,
            self.stats,
            self.missing,
            hvp,
            grads,
            data_factor,
        )
        try:
            if self.sync is None and any(s.combine == "project" for s in self.merged.statistics):
                declared = self.merged.statistics
                resolve_projections(self.stats, data.grads, tracker.params, declared, self.missing)
            if self.tasks and not self._skip_nonfinite(factor):
                tracker.run(step, self.tasks, data)
        finally:
            data.release()

    def _forgive_frozen(self) -> None:
        """Frozen parameters get no statistics: not "missing" even if ``p.grad`` is a tensor."""
        params = self.tracker.params
        if all(p.requires_grad for p in params):
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
        return policy.skip_nonfinite(
            self.step, self.tasks, self.info, self.tracker.params, self.tracker.param_names, scale
        )

    def _unscale_global(self, grads: list, factor: float) -> list:
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
