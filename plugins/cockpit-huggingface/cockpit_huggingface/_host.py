"""How the Hugging Face callback runs a Trainer's backward passes inside Cockpit steps.

Trainer callbacks see neither the loss nor the inputs, and the hook before the optimizer
step runs after gradient clipping. So :class:`TrainerHost` wraps four methods of the one
Trainer instance it serves (instance attributes; the class and any subclass of yours stay
as they are):

- ``get_batch_samples``: the sizes of the micro-batches of one optimizer step;
- ``training_step``: the step's number and micro-batch, and ``accelerator.backward`` run
  inside ``with cp(step, ...)`` (with ``K`` micro-batches: one step with
  ``accumulate=True``, each backward pass in ``run.micro_batch``), with ``retain_graph``
  where Hessian-vector products need it, before the Trainer clips the gradient;
- ``compute_loss`` (yours, or the Trainer's): the loss it returns, the model's output (a
  forward hook on the model) and the labels give the per-sample losses
  (:mod:`cockpit_core.hosts.per_sample`) and ``cockpit_info``'s keys;
- ``train``: the checkpoint it resumes from (``resume_from_checkpoint``), whose Cockpit
  state the callback loads; an exception closes the Cockpit (its log) before it propagates.

Step numbers: ``state.global_step + 1``, the number of the optimizer step being computed,
which is the ``global_step`` at which the Trainer logs its own ``loss`` and ``grad_norm`` of
that update.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor

from cockpit_core.engine.cockpit import Cockpit
from cockpit_core.errors import MisuseError
from cockpit_core.hosts.parameters import batch_size_of
from cockpit_core.hosts.per_sample import (
    LossMatcher,
    LossSpec,
    losses_needed,
    missing_losses_message,
    scaled,
)

_WRAPPED = ("get_batch_samples", "training_step", "compute_loss", "train")


class HostedCallback(Protocol):
    """What :class:`TrainerHost` needs of the callback it serves.

    :class:`cockpit_huggingface.CockpitCallback` is one: it builds the
    host with itself (``TrainerHost(trainer, self)``), so the host never imports it.
    """

    @property
    def cockpit(self) -> Cockpit | None:
        """The Cockpit to feed (``None`` until training begins)."""
        ...

    @property
    def closed(self) -> bool:
        """Whether the Cockpit was closed."""
        ...

    @property
    def loss_fn(self) -> LossSpec:
        """The per-sample loss (a name of :mod:`cockpit_core.engine.losses`, a callable, ``None``)."""
        ...

    @property
    def cockpit_info(self) -> Callable[[Any, Any], Mapping[str, Any] | None] | None:
        """``fn(inputs, outputs) -> dict`` of more ``info`` per micro-batch, or ``None``."""
        ...

    def resuming(self, checkpoint: str | bool | None) -> None:
        """``trainer.train(resume_from_checkpoint=checkpoint)`` begins."""
        ...

    def abort(self, err: BaseException) -> None:
        """Training stopped with ``err``: leave the open step and close the Cockpit."""
        ...


@dataclass
class MicroBatch:
    """What one ``training_step`` call learns about its micro-batch.

    Attributes:
        step: The Cockpit step (the optimizer step being computed, from 1).
        count: Micro-batches of the step.
        size: Samples of this micro-batch (``None``: unknown).
        total: Samples of the step (``None``: unknown).
        inputs: The inputs (as ``compute_loss`` got them, before it pops the labels).
        num_items: The Trainer's ``num_items_in_batch`` (label tokens of the whole step).
        outputs: The model's output (its forward hook), until the per-sample losses are made.
        returned: The loss ``compute_loss`` returned (before the Trainer divides it).
        extra: More ``info``: ``cockpit_info``'s keys, the per-sample losses ``p_n``.
        done: The per-sample losses and ``cockpit_info`` were handled.

    """

    step: int
    count: int
    size: int | None
    total: int | None
    inputs: Any
    num_items: Any = None
    outputs: Any = None
    returned: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    done: bool = False


class TrainerHost:
    """Feeds the Cockpit of a :class:`HostedCallback` (the ``CockpitCallback``) from one Trainer.

    Args:
        trainer: The ``transformers.Trainer`` (any subclass).
        callback: The callback owning the Cockpit, one of ``trainer``'s callbacks.

    """

    def __init__(self, trainer: Any, callback: HostedCallback):
        self.trainer, self.callback = trainer, callback
        self.sizes: list[int | None] | None = None  # micro-batches of this optimizer step
        self.index = 0
        self.run: Any = None  # the open accumulated step
        self.micro: MicroBatch | None = None
        self.matcher: LossMatcher | None = None
        self.needed: list[str] = []
        self._hook: Any = None
        self._install()

    # -- life cycle ---------------------------------------------------------------------

    def _install(self) -> None:
        """Wrap the Trainer instance's methods (once per Trainer)."""
        trainer = self.trainer
        if getattr(trainer, "_cockpit_host", None) is not None:
            raise MisuseError(
                "a Trainer takes one CockpitCallback of cockpit, and this one has one already."
            )
        trainer._cockpit_host = self
        for name in _WRAPPED:
            original = getattr(trainer, name)
            setattr(trainer, name, functools.partial(getattr(self, f"_{name}"), original))

    def start(self, model: Any) -> None:
        """Training begins: observe the model's output; find what needs per-sample losses."""
        cp = self.callback.cockpit
        self.sizes, self.index, self.run, self.micro = None, 0, None, None
        self.needed = losses_needed(cp) if cp is not None else []
        loss_fn = self.callback.loss_fn
        self.matcher = None
        if self.needed and loss_fn is not None:
            self.matcher = LossMatcher(loss_fn, _hint(self.trainer, model))
        self.stop()
        if model is not None and (self.matcher is not None or self.callback.cockpit_info):
            self._hook = model.register_forward_hook(self._observe_output)

    def stop(self) -> None:
        """Remove the forward hook."""
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()

    def abort(self, err: BaseException) -> None:
        """Leave an open step with ``err``; the callback then closes the Cockpit."""
        self.micro = None
        self._close_run(err)
        self.sizes, self.index = None, 0
        self.stop()

    @property
    def active(self) -> bool:
        """Whether the callback serves this Trainer now (a Cockpit is open)."""
        callback = self.callback
        return (
            callback.cockpit is not None
            and not callback.closed
            and any(c is callback for c in self.trainer.callback_handler.callbacks)
        )

    # -- the wrapped methods ---------------------------------------------------------------

    def _train(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.callback.resuming(kwargs.get("resume_from_checkpoint", args[0] if args else None))
        try:
            return original(*args, **kwargs)
        except BaseException as err:
            self.callback.abort(err)
            raise

    def _get_batch_samples(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        with contextlib.suppress(TypeError, ValueError):
            batches = out[0]
            self.sizes = [batch_size_of(b) for b in batches]
            self.index = 0
        return out

    def _training_step(
        self, original: Callable[..., Any], model: Any, inputs: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if not self.active:
            return original(model, inputs, *args, **kwargs)
        cp = self.callback.cockpit
        assert cp is not None  # active
        size = batch_size_of(inputs)
        sizes = self._window(size)
        first, last = self.index == 0, self.index == len(sizes) - 1
        self.index += 1
        step = int(self.trainer.state.global_step) + 1
        total = sum(sizes) if None not in sizes else None  # type: ignore[arg-type]
        num_items = args[0] if args else kwargs.get("num_items_in_batch")
        try:
            if first:
                cp.prepare(step)  # the step's forward pass comes next: arm what it needs
                if len(sizes) > 1:
                    run = cp(step, info=self._step_info(total), accumulate=True)
                    run.__enter__()
                    self.run = run
            self.micro = MicroBatch(step, len(sizes), size, total, inputs, num_items)
            with _backward_wrapped(self.trainer.accelerator, self._backward):
                out = original(model, inputs, *args, **kwargs)
            self.micro = None
            if last:
                self.sizes = None
                self._close_run(None)  # the quantities run here, before clipping
        except BaseException as err:
            self.callback.abort(err)
            raise
        finally:
            self.micro = None
        return out

    def _compute_loss(
        self, original: Callable[..., Any], model: Any, inputs: Any, *args: Any, **kwargs: Any
    ) -> Any:
        micro = self.micro
        if micro is None:
            return original(model, inputs, *args, **kwargs)
        seen = dict(inputs) if isinstance(inputs, Mapping) else inputs  # the labels may be popped
        out = original(model, inputs, *args, **kwargs)
        micro.inputs = seen
        micro.returned = out[0] if isinstance(out, tuple) else out
        self._per_sample(micro)
        return out

    def _observe_output(self, module: Any, args: Any, output: Any) -> None:
        micro = self.micro
        if micro is not None and not micro.done:
            micro.outputs = output

    # -- one backward pass ------------------------------------------------------------------

    def _backward(self, backward: Callable[..., Any], loss: Any, **kwargs: Any) -> Any:
        """``accelerator.backward`` inside the Cockpit step (or micro-batch)."""
        micro, cp = self.micro, self.callback.cockpit
        assert micro is not None and cp is not None
        if not micro.done:  # a training_step of yours that calls no compute_loss
            micro.returned = loss
            self._per_sample(micro)
        info = {**self._step_info(micro.size), "loss": loss, **micro.extra}
        losses = info.get("individual_losses")
        if isinstance(losses, _Unscaled):  # p_n: scale to cockpit's convention
            share = micro.size / micro.total if micro.size and micro.total else 1.0
            returned = micro.returned
            factor = 1.0 if loss is returned else loss.detach() / returned.detach().mean()
            info["individual_losses"] = scaled(losses.losses, share, factor)
        if cp.retain_graph(micro.step) and not kwargs.get("retain_graph"):
            kwargs["retain_graph"] = True
        if micro.count == 1:
            with cp(micro.step, info=info):
                return backward(loss, **kwargs)
        with self.run.micro_batch(info):
            return backward(loss, **kwargs)

    def _per_sample(self, micro: MicroBatch) -> None:
        """``cockpit_info``'s keys and the per-sample losses ``p_n`` of the micro-batch."""
        micro.done = True
        outputs, micro.outputs = micro.outputs, None
        fn = self.callback.cockpit_info
        if fn is not None:
            micro.extra.update(fn(micro.inputs, outputs) or {})
        if not self.needed or "individual_losses" in micro.extra:
            return
        labels = micro.inputs.get("labels") if isinstance(micro.inputs, Mapping) else None
        losses = None
        if self.matcher is not None and isinstance(micro.returned, Tensor):
            expected = micro.returned.detach().float().mean()
            losses = self.matcher(outputs, labels, expected, micro.num_items)
        if losses is None:
            failure = self.matcher.failure if self.matcher is not None else None
            raise MisuseError(
                missing_losses_message(
                    self.needed,
                    failure or "loss_fn=None asks for none",
                    "Pass CockpitCallback(..., loss_fn=...): a loss name ('causal_lm', "
                    "'cross_entropy', 'mse', 'bce_with_logits') or a callable loss(outputs, "
                    "labels) -> [B] whose mean is the loss compute_loss returns; or return "
                    "{'individual_losses': ...} from cockpit_info; or leave out those "
                    "quantities.",
                )
            )
        micro.extra["individual_losses"] = _Unscaled(losses)

    # -- helpers ------------------------------------------------------------------------------

    def _window(self, size: int | None) -> list[int | None]:
        """Sizes of this optimizer step's micro-batches (``K`` equal ones if unknown)."""
        if self.sizes is None or self.index >= len(self.sizes):
            self.sizes = [size] * int(self.trainer.args.gradient_accumulation_steps)
            self.index = 0
        return self.sizes

    def _step_info(self, batch_size: int | None) -> dict[str, Any]:
        """``batch_size``, the optimizer and the ``GradScaler`` of the step.

        The optimizer is the torch optimizer inside accelerate's wrapper: ``alpha`` reads its
        type and state to predict the update.
        """
        optimizer = self.trainer.optimizer
        optimizer = getattr(optimizer, "optimizer", optimizer)  # AcceleratedOptimizer
        info: dict[str, Any] = {"batch_size": batch_size, "optimizer": optimizer}
        scaler = getattr(self.trainer.accelerator, "scaler", None)
        if scaler is not None:
            info["grad_scaler"] = scaler
        return info

    def _close_run(self, err: BaseException | None) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        if err is None:
            run.__exit__(None, None, None)
            return
        try:
            run.__exit__(type(err), err, err.__traceback__)
        except Exception:  # leaving after a failure must not hide that failure
            pass


@dataclass
class _Unscaled:
    """Per-sample losses ``p_n`` whose mean is the model's loss, before :func:`scaled`."""

    losses: Tensor


@contextlib.contextmanager
def _backward_wrapped(accelerator: Any, wrapper: Callable[..., Any]) -> Iterator[None]:
    """``accelerator.backward`` goes through ``wrapper(original, loss, **kwargs)`` meanwhile."""
    own = accelerator.__dict__.get("backward")
    accelerator.backward = functools.partial(wrapper, accelerator.backward)
    try:
        yield
    finally:
        if own is None:
            del accelerator.__dict__["backward"]
        else:
            accelerator.backward = own


def _hint(trainer: Any, model: Any) -> tuple[str, ...]:
    """Losses to try first for the model: ``causal_lm`` for a causal LM, and so on."""
    try:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            MODEL_FOR_MASKED_LM_MAPPING_NAMES,
            MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
            MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
        )
    except ImportError:  # pragma: no cover - older or newer transformers
        return ()
    inner = model
    if hasattr(inner, "get_base_model"):  # PEFT
        inner = inner.get_base_model()
    name = type(inner).__name__
    if name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        return ("causal_lm",)
    if name in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.values():
        problem = str(getattr(getattr(inner, "config", None), "problem_type", None))
        return {
            "regression": ("mse",),
            "multi_label_classification": ("bce_with_logits",),
        }.get(problem, ("cross_entropy",))
    token = (MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    if any(name in names.values() for names in token):
        return ("cross_entropy",)
    return ()
