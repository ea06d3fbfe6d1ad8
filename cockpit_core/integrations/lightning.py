"""PyTorch Lightning: a callback that wraps each ``backward()`` in a Cockpit step.

Lightning calls ``on_before_backward(trainer, module, loss)`` right before and
``on_after_backward`` right after the backward pass, before gradient clipping and the
optimizer step, so the Cockpit sees the same loss and gradients as the optimizer. The
LightningModule provides what the loss alone does not tell (per-sample losses, batch size)
by setting ``self.cockpit_info`` in ``training_step``::

    def training_step(self, batch, batch_idx):
        x, y = batch
        losses = F.cross_entropy(self(x), y, reduction="none")
        self.cockpit_info = {"individual_losses": losses.detach(), "batch_size": len(x)}
        return losses.mean()

Quantities that need Hessian-vector products also need the graph kept::

    def backward(self, loss, *args, **kwargs):
        loss.backward(retain_graph=self.cockpit.retain_graph(self.global_step))

Mixed precision: with ``precision="16-mixed"`` Lightning scales the loss with
``trainer.precision_plugin.scaler``; the callback passes it as ``info["grad_scaler"]`` and
the unscaled loss as ``info["loss"]``, so every statistic is of the unscaled gradients.

Several optimizers (manual optimization): give one Cockpit per optimizer,
``CockpitCallback({0: cp_a, 1: cp_b})``, each built from that optimizer's parameters. Each
``manual_backward`` is tracked by the Cockpit of the optimizer it belongs to, with that
optimizer's own step counter (its number of ``step()`` calls so far). Which optimizer a
backward pass belongs to is ``self.cockpit_info["optimizer_index"]`` if set, else the one
Cockpit whose parameters the loss reaches (e.g. with ``self.toggle_optimizer(opt)``); one
that reaches no Cockpit's parameters (an optimizer without a Cockpit) is not tracked.

Install with ``pip install cockpit-core[lightning]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "cockpit_core.integrations.lightning needs PyTorch Lightning: "
        "pip install 'cockpit-core[lightning]' (or pip install lightning)."
    ) from err

import torch

from cockpit_core.cockpit import Cockpit
from cockpit_core.errors import MisuseError
from cockpit_core.mixed_precision import loss_scale


class CockpitCallback(Callback):
    """Track one Cockpit, or one per optimizer, during ``Trainer.fit``.

    Args:
        cockpit: The Cockpit, built from the LightningModule's parameters, or a mapping
            ``{optimizer_index: Cockpit}`` (manual optimization with several optimizers),
            each built from the parameters of that optimizer.
        attribute: Name of the LightningModule attribute holding extra ``info`` for the
            step (``individual_losses``, ``batch_size``, ...; ``optimizer_index`` names
            the optimizer of the next ``manual_backward``).

    Step numbers: with automatic optimization ``trainer.global_step``; with manual
    optimization, for each Cockpit the number of ``step()`` calls of its optimizer so far
    (the training batch for a single Cockpit whose parameters span several optimizers).
    ``info["loss"]`` is the (unscaled) loss Lightning backpropagates, ``info["optimizer"]``
    the Cockpit's optimizer and ``info["grad_scaler"]`` Lightning's ``GradScaler``, if any.

    Raises:
        MisuseError: A Cockpit would see two backward passes in one of its steps (see
            the message for what to do), or the mapping names an optimizer that does not
            exist.

    """

    def __init__(self, cockpit: Cockpit | Mapping[int, Cockpit], attribute: str = "cockpit_info"):
        super().__init__()
        if isinstance(cockpit, Mapping):
            if not cockpit or not all(isinstance(c, Cockpit) for c in cockpit.values()):
                raise MisuseError(
                    "CockpitCallback needs a Cockpit or a mapping {optimizer_index: Cockpit}."
                )
            self.cockpits: dict[int | None, Cockpit] = {int(k): c for k, c in cockpit.items()}
        else:
            self.cockpits = {None: cockpit}  # its optimizer is found at the start of training
        self.attribute = attribute
        self._run: Any = None
        self._steps: dict[int, int] = {}  # optimizer index -> step() calls so far
        self._batches = 0  # training batches started (a Cockpit spanning several optimizers)
        self._last: dict[int, int] = {}  # id(Cockpit) -> the step of its last backward

    @property
    def cockpit(self) -> Cockpit:
        """The Cockpit (the first one, given a mapping)."""
        return next(iter(self.cockpits.values()))

    # -- the run ----------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Refuse gradient accumulation; find each Cockpit's optimizer."""
        if getattr(trainer, "accumulate_grad_batches", 1) != 1:
            raise MisuseError(
                "CockpitCallback does not support accumulate_grad_batches > 1 yet: track "
                "without accumulation, or use cp(step, accumulate=True) in a manual loop."
            )
        optimizers = list(trainer.optimizers)
        if None in self.cockpits:
            cp = self.cockpits.pop(None)
            self.cockpits = {_optimizer_of(cp, optimizers): cp}
        unknown = [k for k in self.cockpits if k is not None and k >= len(optimizers)]
        if unknown:
            raise MisuseError(
                f"CockpitCallback: optimizer index(es) {unknown} given, but the "
                f"LightningModule configures {len(optimizers)} optimizer(s)."
            )
        pl_module.cockpit = self.cockpit
        if len(self.cockpits) > 1:
            pl_module.cockpits = dict(self.cockpits)

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """Count training batches."""
        self._batches += 1

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """Count each optimizer's steps (the step number of its Cockpit)."""
        for i, opt in enumerate(trainer.optimizers):
            if opt is optimizer:
                self._steps[i] = self._steps.get(i, 0) + 1

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """Enter the step of the Cockpit this backward pass belongs to."""
        extra = dict(getattr(pl_module, self.attribute, None) or {})
        several = len(trainer.optimizers) > 1 and not getattr(
            pl_module, "automatic_optimization", True
        )
        chosen = self._choose(extra.pop("optimizer_index", None), loss, several)
        if chosen is None:
            return
        index, cp = chosen
        step = self._step(trainer, pl_module, index)
        if self._last.get(id(cp)) == step:
            raise MisuseError(self._twice_message(index, step, pl_module))
        self._last[id(cp)] = step
        info: dict[str, Any] = {"loss": loss}
        optimizers = trainer.optimizers
        if optimizers:
            info["optimizer"] = optimizers[index if index is not None else 0]
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:  # Lightning hands over the scaled loss: unscale it
            info["grad_scaler"] = scaler
            info["loss"] = loss / loss_scale(scaler)
        info.update(extra)
        self._run = cp(step, info=info)
        self._run.__enter__()

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        """Leave the step: quantities are computed before clipping and ``optimizer.step``."""
        run, self._run = self._run, None
        if run is not None:
            run.__exit__(None, None, None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Leave a step that ``backward`` interrupted."""
        run, self._run = self._run, None
        if run is not None:
            run.__exit__(type(exception), exception, exception.__traceback__)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Close the logs and sinks."""
        for cp in self.cockpits.values():
            cp.close()

    # -- helpers ------------------------------------------------------------------------

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
        reached = _reached_parameters(loss)
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

    def _twice_message(self, index: int | None, step: int, pl_module: Any) -> str:
        which = "the Cockpit" if index is None else f"the Cockpit of optimizer {index}"
        if index is None:
            fix = (
                "Its parameters belong to several optimizers, each with its own backward "
                "pass: give each optimizer its own Cockpit, CockpitCallback({0: Cockpit("
                "params_of_opt_0, ...), 1: Cockpit(params_of_opt_1, ...)})."
            )
        else:
            fix = (
                "Call the optimizer's step() after each manual_backward() it tracks (gradient "
                "accumulation is not supported), or set self.cockpit_info['optimizer_index'] "
                "to the optimizer each backward pass belongs to."
            )
        return (
            f"CockpitCallback: {which} would see a second backward pass at its step {step} "
            f"(training batch {self._batches - 1}) before its optimizer stepped; a Cockpit "
            f"tracks one backward pass per step. {fix}"
        )


def _optimizer_of(cp: Cockpit, optimizers: Sequence[Any]) -> int | None:
    """The index of the optimizer that updates exactly (else all of) the Cockpit's parameters.

    ``None`` if the parameters span several optimizers.
    """
    if len(optimizers) <= 1:
        return 0
    ids = {id(p) for p in cp.params}
    sets = [{id(p) for g in opt.param_groups for p in g["params"]} for opt in optimizers]
    for i, s in enumerate(sets):
        if s == ids:
            return i
    for i, s in enumerate(sets):
        if ids <= s:
            return i
    return None


def _reached_parameters(loss: Any) -> set[int]:
    """``id`` of every leaf tensor the backward pass of ``loss`` accumulates a gradient into."""
    out: set[int] = set()
    fn = getattr(loss, "grad_fn", None)
    if not isinstance(loss, torch.Tensor) or fn is None:
        return out
    seen, todo = set(), [fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            out.add(id(variable))
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return out
