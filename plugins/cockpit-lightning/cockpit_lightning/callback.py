"""PyTorch Lightning: a callback that tracks training with no change to the LightningModule.

::

    trainer = pl.Trainer(callbacks=[CockpitCallback(quantities="economy")], logger=...)
    trainer.fit(module, loader)

At the start of training the callback builds a Cockpit over the optimizer's parameters
(one per optimizer in manual optimization with several) and attaches it to the module
(``cp.attach``, ``docs/any_model.md``). Lightning calls ``on_before_backward`` and
``on_after_backward`` around each backward pass, before clipping and the optimizer step:
the Cockpit step opens in the first and closes in the second; with
``accumulate_grad_batches=K`` it spans the ``K`` backward passes up to
``on_before_optimizer_step`` (``run.micro_batch``). The graph is kept for Hessian-vector
products by :class:`~cockpit_lightning._graph.GraphKeeper`; every scalar
goes to the Trainer's loggers (``cockpit/<quantity>/...``), the dashboard to TensorBoard
loggers at the end, findings of ``diagnoses=[...]`` as rank-zero warnings and counts
(``cockpit/findings/<severity>``). Per-sample losses (for ``alpha``, ``early_stopping``)
come from the module's output and the batch's targets
(:mod:`cockpit_core.hosts.per_sample`). However training ends, the Cockpits are
closed and Lightning's ``backward`` restored, without hiding the exception that stopped
it. Optional: ``self.cockpit_info = {...}`` in ``training_step`` adds ``info`` keys. See
``docs/integrations.md``. Install: ``pip install cockpit-lightning``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.optim import Optimizer

try:
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.utilities import rank_zero_warn
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "cockpit_lightning needs PyTorch Lightning: "
        "pip install cockpit-lightning (or pip install lightning)."
    ) from err

from cockpit_dashboard.image import dashboard_image

from cockpit_core.diagnosis import Finding
from cockpit_core.engine.cockpit import Cockpit
from cockpit_core.engine.mixed_precision import loss_scale
from cockpit_core.errors import CockpitWarning, MisuseError
from cockpit_core.hosts.parameters import (
    batch_size_of,
    optimizer_of,
    reached_parameters,
    trainable_named_parameters,
)
from cockpit_core.hosts.per_sample import (
    LossMatcher,
    LossSpec,
    OutputCatcher,
    check_loss_spec,
    loss_for_attach,
    losses_needed,
    missing_losses_message,
    scaled,
    targets_of,
)
from cockpit_core.hosts.reporting import FindingReporter, ScalarReporter
from cockpit_lightning._graph import GraphKeeper
from cockpit_lightning._steps import AccumulatedStep, second_backward_message

STEP_ONLY = ("loss", "individual_losses", "batch_size")
"""``info`` keys that an accumulated step takes per micro-batch only (summed, concatenated,
and the step's own batch size); every key goes to each micro-batch."""


class CockpitCallback(Callback):
    """Track a Lightning training run: add to ``Trainer(callbacks=[...])``, nothing else.

    Args:
        cockpit: A ready Cockpit over the LightningModule's parameters, or
            ``{optimizer_index: Cockpit}`` (manual optimization, several optimizers);
            ``None``: the callback builds them from ``quantities`` at the start of training.
        quantities: What to track (as ``Cockpit(..., quantities)``; default ``"economy"``).
        attach: Attach built Cockpits to the LightningModule (module hooks, any model).
        loss_fn: The per-sample loss, for quantities that need ``info["individual_losses"]``
            (``alpha``, ``early_stopping``): ``"auto"`` (default: what fits the model's
            output and the batch's targets, ``cross_entropy`` for class scores and class
            ids), a name of :mod:`cockpit_core.engine.losses` (``"cross_entropy"``, ``"mse"``,
            ``"bce_with_logits"``, ``"causal_lm"``), a callable ``loss(outputs, targets)
            -> [B]`` whose mean is the loss ``training_step`` returns, or ``None`` (none).
            Computed from the output of the module (or of the child module
            ``training_step`` calls last) and the batch's targets (the last item of an
            ``(inputs, targets)`` batch, or ``batch["labels"]``), and checked once against
            the loss ``training_step`` returns. A name or callable also goes to
            ``cp.attach`` (the ``torch.func`` provider's loss).
        log_to_loggers: Send every scalar to the Trainer's loggers at its step.
        prefix: First part of the logged keys (``cockpit/loss``, ...).
        per_param: Log per-parameter scalars (``cockpit/grad_norm/<param>``) ...
        per_param_max: ... while a Cockpit tracks at most this many parameters.
        dashboard: At the end, the dashboard as image ``<prefix>/dashboard`` into every
            logger whose ``experiment`` has ``add_image`` (TensorBoard); others skip it.
        dashboard_dpi: Resolution of that image.
        attribute: LightningModule attribute with extra ``info`` (optional).
        findings: Report each new finding of the Cockpits' ``diagnoses`` with Lightning's
            ``rank_zero_warn`` (a ``CockpitWarning`` on global rank 0 only, instead of the
            Cockpit's own) and, with ``log_to_loggers``, the number of findings so far by
            severity as ``<prefix>/findings/<severity>``; ``False``: the Cockpit warns.
        **cockpit_options: More ``Cockpit`` options for built Cockpits (``log``,
            ``on_error``, ``sinks``, ``backend``, ...). With several optimizers, ``log``
            ``run.jsonl`` becomes ``run.optimizer_<i>.jsonl``.

    Step numbers: ``trainer.global_step`` (optimizer steps, so one step per accumulated
    batch); with manual optimization, for each Cockpit the number of ``step()`` calls of
    its optimizer so far.

    Raises:
        MisuseError: A Cockpit together with ``quantities`` or options, a Cockpit that
            would see two backward passes in one step outside gradient accumulation (the
            message says what to do), or a mapping naming a missing optimizer.

    """

    def __init__(
        self,
        cockpit: Cockpit | Mapping[int, Cockpit] | None = None,
        *,
        quantities: Any = None,
        attach: bool = True,
        loss_fn: LossSpec = "auto",
        log_to_loggers: bool = True,
        prefix: str = "cockpit",
        per_param: bool = True,
        per_param_max: int = 32,
        dashboard: bool = True,
        dashboard_dpi: int = 60,
        attribute: str = "cockpit_info",
        findings: bool = True,
        **cockpit_options: Any,
    ):
        super().__init__()
        self.cockpits: dict[int | None, Cockpit] = {}
        if cockpit is not None:
            if quantities is not None or cockpit_options:
                raise MisuseError(
                    "CockpitCallback: pass a ready Cockpit or quantities=... (and Cockpit "
                    "options), not both."
                )
            self.cockpits = _given(cockpit)
        self.quantities = "economy" if quantities is None else quantities
        self.options = dict(cockpit_options)
        self.attach, self.loss_fn = attach, check_loss_spec(loss_fn)
        self.log_to_loggers, self.prefix = log_to_loggers, prefix
        self.per_param, self.per_param_max = per_param, per_param_max
        self.dashboard, self.dashboard_dpi = dashboard, dashboard_dpi
        self.attribute, self.findings = attribute, findings
        self._keeper = GraphKeeper()
        self._run: Any = None  # the open step without accumulation
        self._window: AccumulatedStep | None = None  # the open step with accumulation
        self._accumulate = 1
        self._batch_size: int | None = None
        self._steps: dict[int, int] = {}  # optimizer index -> step() calls so far
        self._batches = 0  # training batches started (a Cockpit spanning several optimizers)
        self._last: dict[int, int] = {}  # id(Cockpit) -> the step of its last backward
        self._warned: set[str] = set()
        self._built = False  # the Cockpits are the callback's own
        self._closed = False
        self._batch: Any = None
        self._catcher: OutputCatcher | None = None
        self._matchers: dict[int, LossMatcher] = {}  # id(Cockpit) -> its per-sample losses
        self._needed: dict[int, list[str]] = {}  # id(Cockpit) -> quantities needing them
        self._resume: dict[str, Any] = {}  # states of a checkpoint, loaded at on_train_start

    @property
    def cockpit(self) -> Cockpit:
        """The Cockpit (the first one, with several)."""
        if not self.cockpits:
            raise MisuseError("CockpitCallback builds its Cockpit when training starts.")
        return next(iter(self.cockpits.values()))

    # -- the run ----------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Build or resolve the Cockpits, keep graphs when needed, connect the loggers."""
        optimizers = list(trainer.optimizers)
        automatic = getattr(pl_module, "automatic_optimization", True)
        self._accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        if not automatic:
            self._accumulate = 1  # Lightning refuses it for manual optimization
        self._steps, self._batches, self._last = {}, 0, {}
        self._closed = False
        if self._built or not self.cockpits:  # a second fit gets fresh Cockpits
            self.cockpits = self._build(pl_module, optimizers, automatic)
            self._built = True
        elif None in self.cockpits:
            cp = self.cockpits.pop(None)
            self.cockpits = {optimizer_of(cp, optimizers): cp}
        unknown = [k for k in self.cockpits if k is not None and k >= max(len(optimizers), 1)]
        if unknown:
            raise MisuseError(
                f"CockpitCallback: optimizer index(es) {unknown} given, but the "
                f"LightningModule configures {len(optimizers)} optimizer(s)."
            )
        resume, self._resume = self._resume, {}
        for index, cp in self.cockpits.items():  # Trainer.fit(ckpt_path=...): continue
            if str(index) in resume:
                cp.load_state_dict(resume[str(index)])
        self._keeper.install(trainer)
        logged = self.log_to_loggers and bool(trainer.loggers)
        emit = functools.partial(_log_metrics, trainer) if logged else None
        for index, cp in self.cockpits.items():
            if self.findings:
                FindingReporter(_warn_finding, emit, self._prefix(index)).follow(cp)
            if emit is not None:
                cp.sinks[:] = [s for s in cp.sinks if not isinstance(s, ScalarReporter)]
                ScalarReporter(
                    emit, self._prefix(index), self.per_param, self.per_param_max
                ).follow(cp)
        pl_module.cockpit = self.cockpit
        if len(self.cockpits) > 1:
            pl_module.cockpits = dict(self.cockpits)
        self._needed = {id(cp): losses_needed(cp) for cp in self.cockpits.values()}
        self._matchers = {id(cp): LossMatcher(self.loss_fn) for cp in self.cockpits.values()}
        self._remove_catcher()
        if self.loss_fn is not None and any(self._needed.values()):
            self._catcher = OutputCatcher(pl_module)

    def state_dict(self) -> dict[str, Any]:
        """The Cockpits' states for Lightning's checkpoint (``cp.state_dict()`` of each).

        ``{"cockpits": {"<optimizer index>": state}}``; empty before training starts.
        """
        if not self.cockpits:
            return {}
        return {"cockpits": {str(i): cp.state_dict() for i, cp in self.cockpits.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the Cockpits' states of a checkpoint (``Trainer.fit(ckpt_path=...)``).

        Lightning restores callbacks before training starts; ``on_train_start`` loads each
        state into the Cockpit of its optimizer once it is built, so every quantity
        continues (``distance`` from the first run's origin, two-step starts, ...).
        """
        self._resume = dict(state_dict.get("cockpits") or {})

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """Count training batches; read the batch size; note the model's output from now on."""
        self._batches += 1
        self._batch_size = batch_size_of(batch)
        self._batch = batch
        if self._catcher is not None:
            self._catcher.reset(self._batch_size)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """Enter the step (or the micro-batch) of the Cockpit this backward pass belongs to."""
        extra = dict(getattr(pl_module, self.attribute, None) or {})
        several = len(trainer.optimizers) > 1 and not getattr(
            pl_module, "automatic_optimization", True
        )
        chosen = self._choose(extra.pop("optimizer_index", None), loss, several)
        if chosen is None:
            return
        index, cp = chosen
        step = self._step(trainer, pl_module, index)
        info: dict[str, Any] = {"loss": loss}
        if self._batch_size is not None:
            info["batch_size"] = self._batch_size
        if trainer.optimizers:
            info["optimizer"] = trainer.optimizers[index if index is not None else 0]
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:  # Lightning hands over the scaled loss: unscale it
            info["grad_scaler"] = scaler
            info["loss"] = loss / loss_scale(scaler)
        info.update(extra)
        if self._accumulate == 1 and self._last.get(id(cp)) == step:
            raise MisuseError(second_backward_message(index, step, self._batches - 1))
        if "individual_losses" not in info and self._needed.get(id(cp)):
            info["individual_losses"] = self._individual_losses(cp, info["loss"])
        self._keeper.want(cp.retain_graph(step))
        if self._accumulate > 1:
            self._micro_batch(cp, step, info)
            return
        run = cp(step, info=info)
        run.__enter__()  # raises on a misuse: nothing to leave then
        self._run = run
        self._last[id(cp)] = step

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        """Leave the step (or micro-batch): before clipping and ``optimizer.step``."""
        if self._window is not None and self._window.micro is not None:
            micro, self._window.micro = self._window.micro, None
            micro.__exit__(None, None, None)
            return
        run, self._run = self._run, None
        if run is not None:
            run.__exit__(None, None, None)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """Count each optimizer's steps; end an accumulated step (before clipping)."""
        for i, opt in enumerate(trainer.optimizers):
            if opt is optimizer:
                self._steps[i] = self._steps.get(i, 0) + 1
        window, self._window = self._window, None
        if window is not None:
            window.run.__exit__(None, None, None)
            self._check_window(window)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Leave an interrupted step, close the Cockpits (their logs), restore Lightning.

        Nothing here raises: the exception that stopped training stays the one you see.
        """
        args = (type(exception), exception, exception.__traceback__)
        window, self._window = self._window, None
        run, self._run = self._run, None
        contexts = [] if window is None else [window.micro, window.run]
        for ctx in [*contexts, run]:
            if ctx is not None:
                _quietly(ctx.__exit__, *args)
        self._finish()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Close the Cockpits; the dashboard to loggers that take images."""
        closing = not self._closed
        self._finish()
        if closing and self.dashboard and self.log_to_loggers:
            self._log_dashboards(trainer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Restore Lightning's ``backward`` and close the Cockpits, however training ended."""
        if stage == "fit":
            self._finish()
        else:
            self._keeper.remove()

    def _finish(self) -> None:
        """Restore Lightning's ``backward``, remove the output hooks, close the Cockpits once."""
        self._keeper.remove()
        self._remove_catcher()
        self._batch = None
        if self._closed:
            return
        self._closed = True
        for cp in self.cockpits.values():
            _quietly(cp.close)

    # -- helpers ------------------------------------------------------------------------

    def _build(
        self, pl_module: Any, optimizers: list[Optimizer], automatic: bool
    ) -> dict[int | None, Cockpit]:
        """One Cockpit over the optimizer's parameters (one per optimizer if several)."""
        several = len(optimizers) > 1 and not automatic
        groups = (
            list(enumerate(optimizers)) if several else [(0, optimizers[0] if optimizers else None)]
        )
        out: dict[int | None, Cockpit] = {}
        for index, opt in groups:
            options = dict(self.options)
            if several and options.get("log") is not None:
                path = Path(options["log"])
                options["log"] = path.with_name(f"{path.stem}.optimizer_{index}{path.suffix}")
            cp = Cockpit(trainable_named_parameters(pl_module, opt), self.quantities, **options)
            if self.attach:
                cp.attach(pl_module, loss_for_attach(self.loss_fn))
            out[index] = cp
        return out

    def _prefix(self, index: int | None) -> str:
        if len(self.cockpits) > 1:
            return f"{self.prefix}/optimizer_{index}".strip("/")
        return self.prefix

    def _micro_batch(self, cp: Cockpit, step: int, info: dict[str, Any]) -> None:
        """Open the accumulated step at its first backward pass; enter this micro-batch.

        Every ``info`` key goes to the micro-batch (``inputs`` and ``targets`` of
        ``cockpit_info`` too); ``loss``, ``individual_losses`` and ``batch_size`` are the
        micro-batch's only.
        """
        size = info.get("batch_size")
        if self._window is None:
            step_info = {k: v for k, v in info.items() if k not in STEP_ONLY}
            total = self._total(size)
            run = cp(step, info={**step_info, "batch_size": total}, accumulate=True)
            run.__enter__()  # raises on a misuse: nothing to leave then
            self._window = AccumulatedStep(run)
        window = self._window
        window.sizes.append(size)
        micro = window.run.micro_batch(info)
        micro.__enter__()
        window.micro = micro

    def _total(self, size: Any) -> int | None:
        """Samples of an accumulated step: ``K`` micro-batches of the first one's size."""
        return None if size is None else int(size) * self._accumulate

    def _individual_losses(self, cp: Cockpit, loss: Any) -> Any:
        """Per-sample losses ``l_n`` of this backward pass from the model's output and targets.

        Lightning backpropagates the loss of ``training_step`` divided by
        ``accumulate_grad_batches`` (``K``, automatic optimization), so ``loss_k = mean(p) /
        K`` for the named loss's ``p_n``, and cockpit's ``loss_k = (B_k / B) mean(l)`` gives
        ``l_n = p_n B / (K B_k)`` (``p_n`` itself for ``K`` equal micro-batches).

        Raises:
            MisuseError: They cannot be computed (the message says why and what to do).

        """
        divided = self._accumulate  # 1 without accumulation and in manual optimization
        output = self._catcher.take() if self._catcher is not None else None
        matcher = self._matchers[id(cp)]
        losses = None
        if self.loss_fn is not None and isinstance(loss, Tensor):
            expected = loss.detach().float() * divided
            losses = matcher(output, targets_of(self._batch), expected)
        if losses is None:
            raise MisuseError(
                missing_losses_message(
                    self._needed[id(cp)],
                    matcher.failure or "loss_fn=None asks for none",
                    "Pass CockpitCallback(..., loss_fn=...): a loss name ('cross_entropy', "
                    "'mse', 'bce_with_logits', 'causal_lm') or a callable loss(outputs, "
                    "targets) -> [B] whose mean is the loss training_step returns (e.g. "
                    "F.cross_entropy(outputs, targets, reduction='none', <your options>)); or "
                    "set self.cockpit_info = {'individual_losses': ...} in training_step; or "
                    "leave out those quantities.",
                )
            )
        size = self._batch_size
        total = self._total(size) if divided > 1 else size
        share = size / total if size and total else 1.0
        return scaled(losses, share, 1.0 / divided)

    def _remove_catcher(self) -> None:
        catcher, self._catcher = self._catcher, None
        if catcher is not None:
            catcher.stop()

    def _check_window(self, window: AccumulatedStep) -> None:
        """Warn once if the accumulated batch was not ``K`` equal micro-batches."""
        message = window.uneven(self._accumulate)
        if message is None or "window" in self._warned:
            return
        self._warned.add("window")
        warnings.warn(message, CockpitWarning, stacklevel=2)

    def _log_dashboards(self, trainer: Any) -> None:
        """The dashboard of each Cockpit into every logger with ``experiment.add_image``."""
        writers: list[Any] = [
            exp
            for exp in (getattr(lg, "experiment", None) for lg in trainer.loggers)
            if callable(getattr(exp, "add_image", None))
        ]
        if not writers:
            return
        for index, cp in self.cockpits.items():
            image = dashboard_image(cp, self.dashboard_dpi) if cp.get_output() else None
            if image is None:
                continue
            tag = f"{self._prefix(index)}/dashboard".strip("/")
            for writer in writers:
                writer.add_image(tag, image, int(trainer.global_step), dataformats="HWC")

    def _choose(self, index: Any, loss: Any, several: bool) -> tuple[int | None, Cockpit] | None:
        """``(optimizer index, Cockpit)`` of this backward pass, or ``None``: not tracked.

        With several optimizers in manual optimization a backward pass that reaches none of
        the Cockpits' parameters (that of an optimizer without a Cockpit) is not tracked.
        """
        if index is not None:
            cp = self.cockpits.get(int(index))
            return None if cp is None else (int(index), cp)
        if not several:
            return next(iter(self.cockpits.items()))
        reached = reached_parameters(loss)
        hits = [
            (i, cp) for i, cp in self.cockpits.items() if any(id(p) in reached for p in cp.params)
        ]
        if len(hits) > 1:
            raise MisuseError(
                f"CockpitCallback: this backward pass reaches the parameters of the Cockpits "
                f"of optimizers {[i for i, _ in hits]}; say which optimizer it belongs to: "
                "self.cockpit_info = {'optimizer_index': i, ...} before manual_backward(), "
                "or use self.toggle_optimizer(opt). If one backward pass serves several "
                "optimizers, track their parameters with one Cockpit instead."
            )
        return hits[0] if hits else None

    def _step(self, trainer: Any, pl_module: Any, index: int | None) -> int:
        if getattr(pl_module, "automatic_optimization", True):
            return int(trainer.global_step)
        if index is None:  # the Cockpit's parameters span several optimizers
            return self._batches - 1
        return self._steps.get(index, 0)


def _given(cockpit: Any) -> dict[int | None, Cockpit]:
    """``{optimizer index or None: Cockpit}`` of a Cockpit or a mapping of Cockpits."""
    if isinstance(cockpit, Cockpit):
        return {None: cockpit}  # its optimizer is found at the start of training
    if (
        isinstance(cockpit, Mapping)
        and cockpit
        and all(isinstance(c, Cockpit) for c in cockpit.values())
    ):
        return {int(k): c for k, c in cockpit.items()}
    raise MisuseError(
        "CockpitCallback needs a Cockpit, a mapping {optimizer_index: Cockpit}, or "
        "quantities=... (e.g. CockpitCallback(quantities='economy'))."
    )


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn`` while an exception propagates: its own failure only warns."""
    try:
        fn(*args)
    except Exception as err:
        warnings.warn(
            f"cockpit: cleaning up after the exception failed too: {err} ({type(err).__name__})",
            CockpitWarning,
            stacklevel=3,
        )


def _warn_finding(finding: Finding, text: str) -> None:
    """A finding as Lightning's rank-zero warning: shown by global rank 0 only."""
    rank_zero_warn(text, category=CockpitWarning)


def _log_metrics(trainer: Any, step: int, scalars: dict[str, float]) -> None:
    """Every logger of the Trainer gets the scalars at the Cockpit's step."""
    for logger in trainer.loggers:
        logger.log_metrics(dict(scalars), step=step)
