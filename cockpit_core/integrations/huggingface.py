"""Hugging Face Trainer: a callback that owns the Cockpit, a mixin that feeds it each step.

::

    class MyTrainer(CockpitMixin, MyTrainerBase):  # any Trainer subclass, mixin first
        pass

    trainer = MyTrainer(model=model, args=args, train_dataset=ds,
                        callbacks=[CockpitCallback(quantities="economy", log="run.jsonl")])
    trainer.train()  # the Cockpit is built, attached, fed, reported and closed

Callbacks alone cannot serve: they see neither the loss nor the inputs, and
``on_pre_optimizer_step`` runs after gradient clipping (a callback-only host gave a wrong
GSNR). So the work is split where the Trainer allows it:

- :class:`CockpitCallback` builds the Cockpit at ``on_train_begin`` from the parameters of
  the optimizer, attaches it to the model (``cp.attach``: module hooks serve per-sample
  statistics, ``docs/any_model.md``) and closes it at ``on_train_end``;
- :class:`CockpitMixin` wraps ``training_step``: the Trainer's own code computes the loss
  (the user's ``compute_loss`` included) and the mixin runs ``accelerator.backward`` inside
  the Cockpit step, with ``retain_graph`` when Hessian-vector products need the graph. With
  ``gradient_accumulation_steps=K`` the step spans the micro-batches the Trainer collects
  for one optimizer step (``get_batch_samples``), each in ``run.micro_batch``; the step
  closes after the last backward pass, before clipping. Every scalar goes through
  ``Trainer.log`` to the ``report_to`` integrations (keys ``cockpit/<quantity>/...``).

Findings of ``diagnoses=[...]`` go to the ``transformers`` logging (logger
:data:`LOGGER_NAME`) and their counts through ``Trainer.log``
(``cockpit/findings/<severity>``).

Mixed precision: with ``fp16=True`` the Accelerator's ``GradScaler`` is passed as
``info["grad_scaler"]``. ``CockpitTrainer`` (a ``Trainer`` with its own Cockpit, the
previous API) still works and warns. Install with ``pip install cockpit-core[huggingface]``.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any

try:
    from transformers import Trainer, TrainerCallback
    from transformers.utils import logging as hf_logging
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "cockpit_core.integrations.huggingface needs transformers: "
        "pip install 'cockpit-core[huggingface]' (or pip install transformers)."
    ) from err

from cockpit_core.cockpit import Cockpit
from cockpit_core.diagnosis import Finding
from cockpit_core.errors import MisuseError
from cockpit_core.integrations._parameters import batch_size_of, trainable_named_parameters
from cockpit_core.integrations.reporting import FindingReporter, ScalarReporter

InfoFn = Callable[[dict[str, Any], Any], dict[str, Any]]
MICRO_KEYS = ("loss", "individual_losses", "batch_size")
LOGGER_NAME = "transformers.cockpit"
"""The logger of findings: a child of the ``transformers`` library logger, so its handler,
``TrainingArguments(log_level=..., log_level_replica=...)`` and
``transformers.logging.set_verbosity_*`` apply."""
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class CockpitCallback(TrainerCallback):
    """Build, attach, report and close a Cockpit for a Trainer that mixes in :class:`CockpitMixin`.

    Args:
        cockpit: A ready Cockpit over the model's parameters; ``None``: built from
            ``quantities`` when training begins.
        quantities: What to track (as ``Cockpit(..., quantities)``; default ``"economy"``).
        attach: Attach a built Cockpit to the model (module hooks, any model).
        loss_fn: Per-sample loss for ``cp.attach`` (only the ``torch.func`` provider needs
            it, and then ``info["inputs"]``/``info["targets"]`` from ``cockpit_info``).
        cockpit_info: Optional ``fn(inputs, outputs) -> dict`` adding ``info`` keys (e.g.
            ``individual_losses``); ``loss``, ``batch_size`` and ``optimizer`` are set.
        report: Send every scalar through ``Trainer.log`` (``report_to``).
        prefix: First part of the reported keys (``cockpit/loss``, ...).
        per_param: Report per-parameter scalars (``cockpit/grad_norm/<param>``) ...
        per_param_max: ... while the Cockpit tracks at most this many parameters.
        findings: Report each new finding of the Cockpit's ``diagnoses`` through the
            ``transformers`` logging (:data:`LOGGER_NAME`; ``info`` findings at level INFO,
            ``warning`` at WARNING, ``error`` at ERROR) instead of the Cockpit's own
            ``CockpitWarning`` and, with ``report``, the number of findings so far by
            severity as ``<prefix>/findings/<severity>``; ``False``: the Cockpit warns.
        **cockpit_options: More ``Cockpit`` options for a built Cockpit (``log``,
            ``on_error``, ``sinks``, ``backend``, ...).

    Raises:
        MisuseError: A Cockpit together with ``quantities`` or options; training begins
            in a Trainer without :class:`CockpitMixin`.

    """

    def __init__(
        self,
        cockpit: Cockpit | None = None,
        *,
        quantities: Any = None,
        attach: bool = True,
        loss_fn: Callable[..., Any] | None = None,
        cockpit_info: InfoFn | None = None,
        report: bool = True,
        prefix: str = "cockpit",
        per_param: bool = True,
        per_param_max: int = 32,
        findings: bool = True,
        **cockpit_options: Any,
    ):
        if cockpit is not None and (quantities is not None or cockpit_options):
            raise MisuseError(
                "CockpitCallback: pass a ready Cockpit or quantities=... (and Cockpit "
                "options), not both."
            )
        if cockpit is not None and not isinstance(cockpit, Cockpit):
            raise MisuseError(
                "CockpitCallback needs a Cockpit or quantities=... "
                "(e.g. CockpitCallback(quantities='economy'))."
            )
        self.cockpit: Cockpit | None = cockpit
        self.given = cockpit is not None
        self.quantities = "economy" if quantities is None else quantities
        self.options = dict(cockpit_options)
        self.attach, self.loss_fn, self.cockpit_info = attach, loss_fn, cockpit_info
        self.report, self.prefix = report, prefix
        self.per_param, self.per_param_max = per_param, per_param_max
        self.findings = findings
        self.host: Any = None  # the Trainer (set by CockpitMixin)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Build (unless given) and attach the Cockpit; report through the Trainer."""
        if self.host is None:
            raise MisuseError(
                "cockpit's Hugging Face CockpitCallback needs the Trainer to mix in "
                "CockpitMixin, which runs backward inside the Cockpit step: "
                "class MyTrainer(CockpitMixin, Trainer): ... (mixin first)."
            )
        if not self.given:
            model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
            named = trainable_named_parameters(model, optimizer)
            self.cockpit = Cockpit(named, self.quantities, **self.options)
            if self.attach:
                self.cockpit.attach(model, self.loss_fn)
        emit = functools.partial(_trainer_log, self.host) if self.report else None
        if self.findings:
            FindingReporter(_log_finding, emit, self.prefix).follow(self.cockpit)
        if emit is not None:
            sinks = self.cockpit.sinks  # a second train(): one reporter, to this Trainer
            sinks[:] = [s for s in sinks if not isinstance(s, ScalarReporter)]
            ScalarReporter(emit, self.prefix, self.per_param, self.per_param_max).follow(
                self.cockpit
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the Cockpit: flush its log and sinks."""
        if self.cockpit is not None:
            self.cockpit.close()


class CockpitMixin:
    """Runs each ``backward`` of a Trainer inside the step of its :class:`CockpitCallback`.

    Put it first among the bases, ``class MyTrainer(CockpitMixin, MyTrainerBase)``, and
    pass ``callbacks=[CockpitCallback(...)]``. The step number is ``state.global_step``
    (optimizer steps). ``info`` holds ``loss`` (the loss the Trainer backpropagates,
    divided for gradient accumulation; not scaled by a ``GradScaler``), ``batch_size``,
    ``optimizer``, ``grad_scaler`` (with ``fp16``) and what ``cockpit_info`` adds.

    Raises:
        MisuseError: No, or more than one, :class:`CockpitCallback` among the callbacks.

    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        found = [c for c in self.callback_handler.callbacks if isinstance(c, CockpitCallback)]
        if len(found) != 1:
            raise MisuseError(
                f"{type(self).__name__} (CockpitMixin) needs exactly one "
                f"cockpit_core.integrations.huggingface.CockpitCallback among its callbacks, "
                f"found {len(found)}: pass callbacks=[CockpitCallback(quantities=...)]."
            )
        found[0].host = self
        self.cockpit_callback: CockpitCallback = found[0]
        self._cockpit_sizes: list[int | None] | None = None  # micro-batches of this step
        self._cockpit_index = 0
        self._cockpit_run: Any = None
        self._cockpit_step: tuple[Cockpit, int, int, int | None] | None = None
        self._cockpit_extra: dict[str, Any] = {}

    @property
    def cockpit(self) -> Cockpit | None:
        """The Cockpit of the :class:`CockpitCallback` (built when training begins)."""
        return self.cockpit_callback.cockpit

    def get_batch_samples(self, *args: Any, **kwargs: Any) -> Any:
        """The Trainer's micro-batches of one optimizer step; their sizes are noted."""
        batches, num_items = super().get_batch_samples(*args, **kwargs)
        self._cockpit_sizes = [batch_size_of(b) for b in batches]
        self._cockpit_index = 0
        return batches, num_items

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kwargs: Any):
        """The Trainer's (or the base class's) loss; ``cockpit_info`` sees inputs and outputs."""
        fn = self.cockpit_callback.cockpit_info
        if fn is None or self._cockpit_step is None:
            return super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        seen = dict(inputs)  # compute_loss may pop the labels
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, **kwargs)
        self._cockpit_extra = dict(fn(seen, outputs) or {})
        return (loss, outputs) if return_outputs else loss

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        """The Trainer's training step, its ``backward`` inside the Cockpit step."""
        cp = self.cockpit
        if cp is None:
            return super().training_step(model, inputs, *args, **kwargs)
        size = batch_size_of(inputs)
        sizes = self._window_sizes(size)
        first, last = self._cockpit_index == 0, self._cockpit_index == len(sizes) - 1
        self._cockpit_index += 1
        step = int(self.state.global_step)
        if first and len(sizes) > 1:
            total = sum(sizes) if None not in sizes else None  # type: ignore[arg-type]
            self._cockpit_run = cp(step, info=self._step_info(total), accumulate=True)
            self._cockpit_run.__enter__()
        self._cockpit_step, self._cockpit_extra = (cp, step, len(sizes), size), {}
        accelerator = self.accelerator
        own = accelerator.__dict__.get("backward")
        accelerator.backward = functools.partial(self._cockpit_backward, accelerator.backward)
        try:
            out = super().training_step(model, inputs, *args, **kwargs)
        except BaseException as err:
            self._close_run(err)
            raise
        finally:
            self._cockpit_step = None
            if own is None:
                del accelerator.__dict__["backward"]
            else:
                accelerator.backward = own
        if last:
            self._close_run(None)
            self._cockpit_sizes = None
        return out

    def _window_sizes(self, size: int | None) -> list[int | None]:
        """Sizes of this optimizer step's micro-batches (K equal ones if unknown)."""
        if self._cockpit_sizes is None or self._cockpit_index >= len(self._cockpit_sizes):
            self._cockpit_sizes = [size] * int(self.args.gradient_accumulation_steps)
            self._cockpit_index = 0
        return self._cockpit_sizes

    def _step_info(self, batch_size: int | None) -> dict[str, Any]:
        info: dict[str, Any] = {"batch_size": batch_size, "optimizer": self.optimizer}
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            info["grad_scaler"] = scaler
        return info

    def _cockpit_backward(self, backward: Callable[..., Any], loss: Any, **kwargs: Any) -> Any:
        """``accelerator.backward`` inside the Cockpit step (or micro-batch)."""
        assert self._cockpit_step is not None
        cp, step, count, size = self._cockpit_step
        info = {**self._step_info(size), "loss": loss, **self._cockpit_extra}
        if cp.retain_graph(step) and not kwargs.get("retain_graph"):
            kwargs["retain_graph"] = True
        if count == 1:
            with cp(step, info=info):
                return backward(loss, **kwargs)
        with self._cockpit_run.micro_batch({k: info[k] for k in MICRO_KEYS if k in info}):
            return backward(loss, **kwargs)

    def _close_run(self, err: BaseException | None) -> None:
        run, self._cockpit_run = self._cockpit_run, None
        if run is None:
            return
        if err is None:
            run.__exit__(None, None, None)
        else:
            run.__exit__(type(err), err, err.__traceback__)


class CockpitTrainer(CockpitMixin, Trainer):
    """Deprecated: a :class:`transformers.Trainer` tracking a given Cockpit.

    Use ``class MyTrainer(CockpitMixin, Trainer)`` with ``callbacks=[CockpitCallback(...)]``
    instead; it composes with your own Trainer subclass. This class now does exactly that
    (so the Cockpit is closed at the end of training and gradient accumulation works).

    Args:
        cockpit: The Cockpit, built from the model's parameters.
        cockpit_info: Optional ``fn(inputs, outputs) -> dict`` adding ``info`` keys.
        *args, **kwargs: Passed to :class:`transformers.Trainer`.

    """

    def __init__(self, *args: Any, cockpit: Cockpit, cockpit_info: InfoFn | None = None, **kwargs):
        warnings.warn(
            "CockpitTrainer is deprecated: use class MyTrainer(CockpitMixin, Trainer) with "
            "callbacks=[CockpitCallback(cockpit)] (or CockpitCallback(quantities=...)), "
            "from cockpit_core.integrations.huggingface; see docs/integrations.md.",
            FutureWarning,
            stacklevel=2,
        )
        callback = CockpitCallback(cockpit, cockpit_info=cockpit_info, report=False)
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
        super().__init__(*args, **kwargs)
        self.cockpit_info = cockpit_info


def _log_finding(finding: Finding, text: str) -> None:
    """A finding through the ``transformers`` logging, at the level of its severity."""
    hf_logging.get_logger(LOGGER_NAME).log(_LEVELS[finding.severity], text)


def _trainer_log(trainer: Any, step: int, scalars: dict[str, float]) -> None:
    """Report the scalars of ``step`` through ``Trainer.log``, stamped with that step.

    ``Trainer.log`` stamps its logs (the log history, every ``report_to`` callback) with
    ``state.global_step``. The values of two-step quantities (``alpha``, ``update_size``) of
    step ``t`` arrive while the Trainer is at ``t + 1``, so ``global_step`` is set to ``step``
    for the call and restored after it.
    """
    state = trainer.state
    current = state.global_step
    state.global_step = step
    try:
        trainer.log(dict(scalars))
    finally:
        state.global_step = current
