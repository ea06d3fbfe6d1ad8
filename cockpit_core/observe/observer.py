"""The hooks that watch the model's forward passes and the loss calls of tracked steps."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from cockpit_core.engine.losses import call_losses, logits_of, module_losses
from cockpit_core.observe.forward_pass import (
    TARGET_NAMES,
    ForwardPass,
    LossCall,
    Observed,
    as_targets,
    forward_signature,
    record_call,
)
from cockpit_core.observe.keys import NO_LOSS, NO_MODEL, OBSERVED_KEYS
from cockpit_core.observe.loss_catcher import LossCatcher, push_under, remove_mode
from cockpit_core.observe.loss_spec import LossSpec, shape_problem
from cockpit_core.observe.probe import Probe
from cockpit_core.observe.probe_hooks import ProbeHooks

KEEP_PASSES = 16
"""Forward passes kept between two takes (the last one is used; micro-batches take each)."""


class ForwardObserver:
    """Hooks that watch the model's forward passes and the loss calls of tracked steps.

    Armed by the planner with the keys the coming step needs (:meth:`arm`); without a
    model it observes nothing. Deep copies of a model carry its hooks; they share this
    observer (:meth:`__deepcopy__`), which ignores every module but its own.
    """

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.loss: LossSpec | None = None
        self.keys: frozenset[str] = frozenset()
        self._signature: inspect.Signature | None = None
        self._handles: list[Any] = []
        self._passes: list[ForwardPass] = []
        self._depth = 0
        self._paused = 0
        self._catcher: LossCatcher | None = None
        self.probes = ProbeHooks(self._watching)

    def __deepcopy__(self, memo: dict[int, object]) -> ForwardObserver:
        """The observer itself: a copy of the model (``cp.check``) keeps inert hooks."""
        return self

    # -- state ------------------------------------------------------------------------------

    def attach(self, model: torch.nn.Module | None, loss: LossSpec | None) -> None:
        """Observe ``model`` and the calls of ``loss`` (unhooks the previous ones)."""
        keys = self.keys
        self.arm(frozenset())
        self.model, self.loss = model, loss
        self._signature = forward_signature(model) if model is not None else None
        self.arm(keys)
        self.probes.attach(model)

    def arm(self, keys: Iterable[str], probes: Iterable[Probe] = ()) -> bool:
        """Watch the next forward passes for ``keys`` and ``probes`` (none: no hook stays).

        Returns:
            Whether hooks are on the model now.

        """
        probing = self.probes.arm(probes)
        self.keys = frozenset(keys) & OBSERVED_KEYS
        wanted = bool(self.keys) and self.model is not None
        if wanted and not self._handles:
            assert self.model is not None
            self._handles = [
                self.model.register_forward_pre_hook(self._before, with_kwargs=True),
                self.model.register_forward_hook(self._after, with_kwargs=True, always_call=True),
            ]
            module = self.loss.module if self.loss is not None else None
            if module is not None:
                self._handles.append(
                    module.register_forward_hook(self._loss_called, with_kwargs=True)
                )
        elif not wanted and self._handles:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            self.clear()
        return wanted or probing

    def covers(self, keys: Iterable[str]) -> bool:
        """Whether the last forward pass was watched for ``keys`` (or nothing can be watched)."""
        return self.model is None or frozenset(keys) & OBSERVED_KEYS <= self.keys

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Ignore forward passes and loss calls inside (cockpit's own passes, ``cp.check``)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def clear(self) -> None:
        """Forget what was observed; end a pending watch for the loss call."""
        self._close_catcher()
        self._passes = []
        self._depth = 0

    def end_step(self) -> None:
        """A step ended: forget its forward passes and what its probes recorded."""
        self.clear()
        self.probes.clear()

    def close(self) -> None:
        """Remove every hook and forget everything."""
        self.arm(frozenset())
        self.clear()
        self.probes.close()

    # -- what a step takes ------------------------------------------------------------------

    def take(self, wanted: Iterable[str]) -> Observed:
        """The ``wanted`` entries of ``info`` from the last forward pass since the last take.

        Everything observed until now is forgotten; the loss-call watch ends.
        """
        passes = [p for p in self._passes if p.finished]
        self.clear()
        wanted = frozenset(wanted) & OBSERVED_KEYS
        out = Observed()
        if not wanted:
            return out
        if self.model is None:
            for key in wanted:
                out.reasons[key] = NO_MODEL
            return out
        if not passes:
            why = (
                "cockpit saw no forward pass of the model with gradients enabled since the "
                "previous step"
                if wanted <= self.keys
                else "cockpit did not watch the forward pass of this step (it expected another "
                "step number: call cp.prepare(step) before the forward pass when step numbers "
                "are not evenly spaced)"
            )
            for key in wanted:
                out.reasons[key] = why
            return out
        seen = passes[-1]
        if seen.batch_size:
            out.info["batch_size"] = seen.batch_size
        else:
            out.reasons["batch_size"] = "the model was called without a tensor argument"
        if seen.inputs is not None:
            out.info["inputs"] = seen.inputs
        elif seen.inputs_note:
            out.reasons["inputs"] = seen.inputs_note
        targets = seen.targets
        calls = seen.module_calls or seen.caught
        if targets is None and len(calls) == 1:  # the loss call's target, shaped per sample
            targets = as_targets(calls[0], seen.scores)
        if targets is not None:
            out.info["targets"] = targets
        else:
            out.reasons["targets"] = (
                "no argument of the model's call is named as targets, and no single loss "
                "call on its output was seen"
            )
        if "individual_losses" in wanted:
            losses, why = self._losses(seen)
            if losses is not None:
                out.info["individual_losses"] = losses
            else:
                out.reasons["individual_losses"] = why
        for key in list(out.reasons):
            if key not in wanted:
                del out.reasons[key]
        return out

    def _losses(self, seen: ForwardPass) -> tuple[Tensor | None, str]:
        """The per-sample losses of ``seen``, or why cockpit cannot tell them."""
        spec = self.loss
        if spec is None:
            return None, NO_LOSS
        attempts: list[Callable[[], Tensor]] = []
        problems: list[str] = []
        batch = seen.batch_size
        if spec.module is not None and seen.module_calls:
            if len(seen.module_calls) > 1:
                problems.append(
                    f"{spec.label} was called {len(seen.module_calls)} times after the model's "
                    "forward pass, and cockpit cannot tell which call is the loss"
                )
            else:
                call = seen.module_calls[0]
                attempts.append(
                    lambda: module_losses(
                        call.fn, call.args, call.kwargs, call.result, batch, seen.scores
                    )
                )
        if not attempts and not problems and seen.targets is not None and spec.per_sample:
            per_sample, targets = spec.per_sample, seen.targets
            attempts.append(lambda: per_sample(seen.outputs, targets))
        if not attempts and not problems and seen.caught:
            if len(seen.caught) > 1:
                problems.append(
                    f"{len(seen.caught)} loss functions were called on the model's output "
                    "before the `with cp(...)` block, and cockpit cannot tell which is the loss"
                )
            elif spec.module is not None or isinstance(spec.given, str):
                call = seen.caught[0]
                attempts.append(
                    lambda: call_losses(
                        call.fn, call.args, call.kwargs, call.result, batch, seen.scores
                    )
                )
            elif spec.per_sample is not None:
                per_sample, caught = spec.per_sample, seen.caught[0]
                attempts.append(lambda: per_sample(seen.outputs, as_targets(caught, seen.scores)))
        for attempt in attempts:
            try:
                with torch.no_grad():
                    losses = attempt()
            except (ValueError, TypeError, RuntimeError, IndexError) as err:
                problems.append(f"{spec.label} could not be evaluated per sample: {err}")
                continue
            problem = shape_problem(losses, batch, spec)
            if problem is None:
                return losses.detach(), ""
            problems.append(problem)
        if problems:
            return None, "; ".join(problems)
        if spec.module is not None and seen.targets is None:
            return None, (
                f"{spec.label} was not called after the model's forward pass (nor "
                "F.cross_entropy, F.mse_loss or F.binary_cross_entropy_with_logits on its "
                "output), and no argument of the model's call is named as targets"
            )
        if spec.module is not None:
            return None, (
                f"{spec.label} was not called after the model's forward pass, and it has "
                "class weights, label smoothing or another reduction than 'mean', so cockpit "
                "cannot evaluate it from the targets of the model's call alone"
            )
        names = ", ".join(TARGET_NAMES)
        return None, (
            "cockpit found no targets: no argument of the model's call is named "
            f"{names}, and no F.cross_entropy, F.mse_loss or "
            "F.binary_cross_entropy_with_logits was called on the model's output before the "
            "`with cp(...)` block"
        )

    # -- the hooks --------------------------------------------------------------------------

    def _watching(self) -> bool:
        """Whether a forward pass or loss call now belongs to the user's training step."""
        if self._paused or not torch.is_grad_enabled():
            return False
        if torch.compiler.is_compiling():
            return False
        return transform_level() is None  # torch.func transforms: a provider's own pass

    def _before(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if module is not self.model:  # a deep copy of the model carries this hook
            return
        if self._depth:
            self._depth += 1
            return
        if not self._watching():
            return
        self._close_catcher()  # a new forward pass: the previous one's loss is past
        self._depth = 1
        self._passes.append(record_call(self._signature, args, kwargs))
        del self._passes[:-KEEP_PASSES]

    def _after(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if module is not self.model or not self._depth:
            return
        self._depth -= 1
        if self._depth or not self._passes:
            return
        seen = self._passes[-1]
        seen.outputs, seen.finished = output, True
        try:
            seen.scores = logits_of(output)
        except TypeError:
            seen.scores = None
        spec = self.loss
        watch = (
            "individual_losses" in self.keys
            and spec is not None
            and seen.scores is not None
            and (spec.module is not None or seen.targets is None)
        )
        if watch and output is not None:
            self._catcher = LossCatcher(seen)
            push_under(self._catcher)

    def _loss_called(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        spec = self.loss
        if spec is None or module is not spec.module or self._depth or not self._watching():
            return
        if self._passes and self._passes[-1].finished:
            self._passes[-1].module_calls.append(
                LossCall(module, tuple(args), dict(kwargs), output)
            )

    def _close_catcher(self) -> None:
        if self._catcher is not None:
            remove_mode(self._catcher)
            self._catcher = None


def transform_level() -> Any:
    """The innermost ``torch.func`` transform level, ``None`` outside transforms."""
    functorch = getattr(torch._C, "_functorch", None)
    level = getattr(functorch, "maybe_current_level", None)
    return level() if level is not None else None
