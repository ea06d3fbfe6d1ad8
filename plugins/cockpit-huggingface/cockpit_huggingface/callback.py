"""Hugging Face Trainer: one callback builds, feeds, reports and closes a Cockpit.

::

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[CockpitCallback(quantities="economy", log="run.jsonl")])
    trainer.train()  # the Cockpit is built, attached, fed, reported and closed

Callbacks alone cannot serve: they see neither the loss nor the inputs, and
``on_pre_optimizer_step`` runs after gradient clipping. So when the Trainer is built,
:class:`CockpitCallback` finds it and wraps a few methods of that one instance
(:class:`~cockpit_huggingface._host.TrainerHost`): the Trainer's own code (your
``compute_loss`` included) computes the loss, and its ``backward`` runs inside the Cockpit
step, with ``retain_graph`` when Hessian-vector products need the graph, before clipping.
With ``gradient_accumulation_steps=K`` the step spans the micro-batches of one optimizer
step. Per-sample losses come from the model's output and the ``labels`` (causal LM,
sequence or token classification), normalized as the Trainer normalizes its loss
(``num_items_in_batch``). Cockpit's step numbers are the Trainer's ``global_step`` of each
update (from 1), so ``cockpit/grad_norm/total`` and the Trainer's ``grad_norm`` of an update
share their step. Every scalar goes through ``Trainer.log`` to the ``report_to``
integrations and the log history (not to the console); the console gets one short line per
logging step. Findings of ``diagnoses=[...]`` go to the ``transformers`` logging (logger
:data:`LOGGER_NAME`) and their counts through ``Trainer.log``.

:class:`CockpitMixin` (``class MyTrainer(CockpitMixin, Trainer)``), the previous way to
host the callback, still works; ``CockpitTrainer`` is deprecated. Mixed precision: with
``fp16=True`` the Accelerator's ``GradScaler`` is passed as ``info["grad_scaler"]``.
Install with ``pip install cockpit-huggingface``.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import torch

try:
    from tqdm.auto import tqdm
    from transformers import PrinterCallback, ProgressCallback, Trainer, TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
    from transformers.utils import logging as hf_logging
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "cockpit_huggingface needs transformers: "
        "pip install cockpit-huggingface (or pip install transformers accelerate)."
    ) from err

from cockpit_core.diagnosis import Finding
from cockpit_core.engine.cockpit import Cockpit
from cockpit_core.errors import CockpitWarning, MisuseError
from cockpit_core.hosts.parameters import trainable_named_parameters
from cockpit_core.hosts.per_sample import LossSpec, check_loss_spec, loss_for_attach
from cockpit_core.hosts.reporting import FindingReporter, Headline, ScalarReporter
from cockpit_huggingface._host import TrainerHost

InfoFn = Callable[[dict[str, Any], Any], dict[str, Any]]
LOGGER_NAME = "transformers.cockpit"
"""The logger of findings: a child of the ``transformers`` library logger, so its handler,
``TrainingArguments(log_level=..., log_level_replica=...)`` and
``transformers.logging.set_verbosity_*`` apply."""
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
STATE_FILE = "cockpit_state.pt"
"""The Cockpit's state (``cp.state_dict()``) in each checkpoint folder of the Trainer."""
_FRAMES = 12  # how far up the stack the Trainer that calls the callback is looked for


class CockpitCallback(TrainerCallback):
    """Track a Trainer's run: add to ``Trainer(callbacks=[...])``, nothing else.

    Args:
        cockpit: A ready Cockpit over the model's parameters; ``None``: built from
            ``quantities`` when training begins.
        quantities: What to track (as ``Cockpit(..., quantities)``; default ``"economy"``).
        attach: Attach a built Cockpit to the model (module hooks, any model).
        loss_fn: The per-sample loss: ``"auto"`` (default: ``causal_lm`` for a causal LM,
            ``cross_entropy``/``mse``/``bce_with_logits`` for sequence classification by the
            model's ``problem_type``, ``cross_entropy`` per token for token classification,
            else what fits the logits and labels), a name of :mod:`cockpit_core.engine.losses`,
            a callable ``loss(outputs, labels) -> [B]`` whose mean is the loss your
            ``compute_loss`` returns, or ``None`` (none). It is checked once against the
            Trainer's loss. A name or callable also goes to ``cp.attach`` (the
            ``torch.func`` provider's loss).
        cockpit_info: Optional ``fn(inputs, outputs) -> dict`` of more ``info`` per
            micro-batch, every key forwarded (``inputs`` before the labels are popped,
            ``outputs`` the model's output); its ``individual_losses`` replace cockpit's.
        report: Send every scalar through ``Trainer.log`` (``report_to`` integrations and
            ``state.log_history``, not the console) at its step.
        console: One line per logging step of the Trainer with a few headline values
            (``True``), the given tags (``["grad_norm/total", "alpha/alpha"]``), or none.
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
        MisuseError: A Cockpit together with ``quantities`` or options, an unknown loss
            name; at the first step, quantities that need per-sample losses when none
            can be computed (the message says why and what to pass).

    """

    def __init__(
        self,
        cockpit: Cockpit | None = None,
        *,
        quantities: Any = None,
        attach: bool = True,
        loss_fn: LossSpec = "auto",
        cockpit_info: InfoFn | None = None,
        report: bool = True,
        console: bool | Sequence[str] = True,
        prefix: str = "cockpit",
        per_param: bool = False,
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
        self.attach, self.loss_fn = attach, check_loss_spec(loss_fn)
        self.cockpit_info = cockpit_info
        self.report, self.console, self.prefix = report, console, prefix
        self.per_param, self.per_param_max = per_param, per_param_max
        self.findings = findings
        self.host: Any = None  # the Trainer
        self.closed = False
        self.resume_from: Path | None = None  # the checkpoint train() resumes from
        self._headline: Headline | None = None
        self._host: TrainerHost | None = None

    def bind(self, trainer: Any) -> None:
        """Serve ``trainer`` (the callback finds it itself; :class:`CockpitMixin` calls this).

        Raises:
            MisuseError: ``trainer`` has another CockpitCallback already.

        """
        if self.host is trainer:
            return
        self._host = TrainerHost(trainer, self)
        self.host = trainer

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The Trainer is built: find it."""
        if self.host is None:
            trainer = _calling_trainer(self)
            if trainer is not None:
                self.bind(trainer)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Build (unless given) and attach the Cockpit; report through the Trainer."""
        if self.host is None:  # added with trainer.add_callback after the Trainer was built
            trainer = _calling_trainer(self)
            if trainer is None:
                raise MisuseError(
                    "cockpit's CockpitCallback could not find the Trainer that runs it; "
                    "pass it as Trainer(..., callbacks=[CockpitCallback(...)]), or build the "
                    "Trainer from class MyTrainer(CockpitMixin, Trainer)."
                )
            self.bind(trainer)
        model: Any = kwargs.get("model")
        if not self.given:
            named = trainable_named_parameters(model, kwargs.get("optimizer"))
            self.cockpit = Cockpit(named, self.quantities, **self.options)
            if self.attach:
                self.cockpit.attach(model, loss_for_attach(self.loss_fn))
        self.closed = False
        cp = self.cockpit
        assert cp is not None and self._host is not None
        self._load_state(cp)
        emit = functools.partial(_trainer_log, self.host) if self.report else None
        if self.findings:
            FindingReporter(_log_finding, emit, self.prefix).follow(cp)
        keep = (ScalarReporter, Headline)  # a second train(): one of each, to this Trainer
        cp.sinks[:] = [s for s in cp.sinks if not isinstance(s, keep)]
        if emit is not None:
            ScalarReporter(emit, self.prefix, self.per_param, self.per_param_max).follow(cp)
        self._headline = None
        if self.console:
            tags = None if self.console is True else list(self.console)
            self._headline = Headline(tags).follow(cp)
        self._host.start(model)

    def resuming(self, checkpoint: str | bool | None) -> None:
        """``trainer.train(resume_from_checkpoint=checkpoint)`` begins: remember the folder.

        ``True`` means the last checkpoint in ``args.output_dir``, as the Trainer reads it.
        """
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.host.args.output_dir)
        self.resume_from = Path(checkpoint) if isinstance(checkpoint, (str, Path)) else None

    def _load_state(self, cp: Cockpit) -> None:
        """Continue the Cockpit of the checkpoint training resumes from, if it holds one."""
        folder, self.resume_from = self.resume_from, None
        if folder is None:
            return
        path = folder / STATE_FILE
        if not path.is_file():
            warnings.warn(
                f"cockpit: the checkpoint {folder} holds no {STATE_FILE} (saved without "
                "cockpit's CockpitCallback?): the quantities start afresh (distance from "
                "here).",
                CockpitWarning,
                stacklevel=2,
            )
            return
        cp.load_state_dict(torch.load(path, weights_only=True))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The Trainer saved a checkpoint: write the Cockpit's state into its folder.

        ``<output_dir>/checkpoint-<global_step>/cockpit_state.pt``, which
        ``trainer.train(resume_from_checkpoint=...)`` loads when training resumes.
        """
        cp = self.cockpit
        if cp is None or not args.should_save:
            return
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if folder.is_dir():
            torch.save(cp.state_dict(), folder / STATE_FILE)

    def on_log(
        self,
        args: Any,
        state: Any,
        control: Any,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """After the Trainer's own training log: the console line of cockpit's newest values."""
        if self._headline is None or not logs or "loss" not in logs:
            return
        line = self._headline.line()
        if line is not None and state.is_world_process_zero:
            tqdm.write(line, file=sys.stdout)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the Cockpit: flush its log and sinks."""
        if self._host is not None:
            self._host.stop()
        self._close()

    def abort(self, err: BaseException) -> None:
        """Training stopped with ``err``: leave the open step and close the Cockpit."""
        if self._host is not None:
            self._host.abort(err)
        self._close()

    def _close(self) -> None:
        if self.cockpit is not None and not self.closed:
            self.closed = True
            self.cockpit.close()


class CockpitMixin:
    """Optional: ``class MyTrainer(CockpitMixin, Trainer)`` hosts the :class:`CockpitCallback`.

    :class:`CockpitCallback` finds its Trainer by itself; the mixin (the earlier API) binds
    it explicitly when the Trainer is built and offers ``trainer.cockpit``.

    Raises:
        MisuseError: No, or more than one, :class:`CockpitCallback` among the callbacks.

    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        handler = self.callback_handler  # type: ignore[attr-defined]  # the Trainer's
        found = [c for c in handler.callbacks if isinstance(c, CockpitCallback)]
        if len(found) != 1:
            raise MisuseError(
                f"{type(self).__name__} (CockpitMixin) needs exactly one "
                f"cockpit_huggingface.CockpitCallback among its callbacks, "
                f"found {len(found)}: pass callbacks=[CockpitCallback(quantities=...)]."
            )
        found[0].bind(self)
        self.cockpit_callback: CockpitCallback = found[0]

    @property
    def cockpit(self) -> Cockpit | None:
        """The Cockpit of the :class:`CockpitCallback` (built when training begins)."""
        return self.cockpit_callback.cockpit


class CockpitTrainer(CockpitMixin, Trainer):
    """Deprecated: a :class:`transformers.Trainer` tracking a given Cockpit.

    Use ``Trainer(..., callbacks=[CockpitCallback(...)])`` instead; it composes with your
    own Trainer subclass. This class now does exactly that (so the Cockpit is closed at the
    end of training and gradient accumulation works).

    Args:
        cockpit: The Cockpit, built from the model's parameters.
        cockpit_info: Optional ``fn(inputs, outputs) -> dict`` adding ``info`` keys.
        *args, **kwargs: Passed to :class:`transformers.Trainer`.

    """

    def __init__(
        self, *args: Any, cockpit: Cockpit, cockpit_info: InfoFn | None = None, **kwargs: Any
    ):
        warnings.warn(
            "CockpitTrainer is deprecated: use Trainer(..., callbacks=[CockpitCallback(cockpit)]) "
            "(or CockpitCallback(quantities=...)), from cockpit_huggingface; "
            "see docs/integrations.md.",
            FutureWarning,
            stacklevel=2,
        )
        callback = CockpitCallback(
            cockpit, cockpit_info=cockpit_info, report=False, console=False, loss_fn=None
        )
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
        super().__init__(*args, **kwargs)
        self.cockpit_info = cockpit_info


def _calling_trainer(callback: CockpitCallback) -> Any:
    """The Trainer up the call stack whose callbacks hold ``callback``, if any.

    The callback's ``on_init_end`` and ``on_train_begin`` are called from the Trainer's own
    methods, whose frames hold the Trainer as ``self``.
    """
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer) and any(
            c is callback for c in candidate.callback_handler.callbacks
        ):
            return candidate
        frame = frame.f_back
    return None


def _log_finding(finding: Finding, text: str) -> None:
    """A finding through the ``transformers`` logging, at the level of its severity."""
    hf_logging.get_logger(LOGGER_NAME).log(_LEVELS[finding.severity], text)


def _trainer_log(trainer: Any, step: int, scalars: dict[str, float]) -> None:
    """Report the scalars of ``step`` through ``Trainer.log``, stamped with that step, quietly.

    ``Trainer.log`` stamps its logs (the log history, every ``report_to`` callback) with
    ``state.global_step``: it is set to ``step`` for the call (the values of step ``t`` come
    while the Trainer is at ``t - 1``, those of ``alpha`` and ``update_size`` at ``t``) and
    restored after it. The Trainer's console printers and the cockpit callbacks are left
    out of the call: the console gets one line per logging step instead (``console``).
    """
    state, handler = trainer.state, trainer.callback_handler
    current, callbacks = state.global_step, handler.callbacks
    quiet = (ProgressCallback, PrinterCallback, CockpitCallback)
    state.global_step = step
    handler.callbacks = [c for c in callbacks if not isinstance(c, quiet)]
    try:
        trainer.log(dict(scalars))
    finally:
        handler.callbacks = callbacks
        state.global_step = current
