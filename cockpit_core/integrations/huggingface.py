"""Hugging Face Trainer: a ``Trainer`` subclass whose ``training_step`` runs inside a Cockpit step.

Trainer callbacks cannot serve: they see neither the loss nor the inputs, and
``on_pre_optimizer_step`` runs after gradient clipping, so quantities computed there
describe clipped gradients (a callback-only host gave a wrong GSNR). ``CockpitTrainer``
overrides ``training_step`` instead: it computes the loss as the Trainer does and wraps
the backward pass in ``with cockpit(step, info=...)``.

Per-sample statistics come from the Cockpit's statistics providers: build it with
``Cockpit(model, ...)`` (or call ``cp.attach(model)``) so that module hooks serve the
model's linear, embedding, normalization and attention layers in the Trainer's own pass
(``docs/any_model.md``); ``cp.check(model)`` shows which provider serves each parameter.

Mixed precision: with ``fp16=True`` the Accelerator scales the loss with its
``GradScaler`` (``self.accelerator.scaler``); ``CockpitTrainer`` passes it as
``info["grad_scaler"]``, so every statistic is of the unscaled gradients. ``info["loss"]`` is
the unscaled loss (the Accelerator scales it inside ``backward``).
Install with ``pip install cockpit-core[huggingface]``.
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import Trainer
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "cockpit_core.integrations.huggingface needs transformers: "
        "pip install 'cockpit-core[huggingface]' (or pip install transformers)."
    ) from err

from cockpit_core.cockpit import Cockpit
from cockpit_core.errors import MisuseError


class CockpitTrainer(Trainer):
    """A :class:`transformers.Trainer` that tracks a :class:`~cockpit_core.Cockpit`.

    Args:
        cockpit: The Cockpit, built from the model's parameters.
        cockpit_info: Optional ``fn(inputs, outputs) -> dict`` adding ``info`` keys (e.g.
            ``individual_losses``); ``loss``, ``batch_size`` and ``optimizer`` are set.
        *args, **kwargs: Passed to :class:`transformers.Trainer`.

    The step number is ``state.global_step``. ``info`` holds ``loss`` (unscaled),
    ``batch_size``, ``optimizer`` and, when the Accelerator scales the loss (``fp16``),
    ``grad_scaler``. Gradient accumulation (``gradient_accumulation_steps > 1``) is
    refused for now.

    """

    def __init__(self, *args: Any, cockpit: Cockpit, cockpit_info: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.args.gradient_accumulation_steps != 1:
            raise MisuseError(
                "CockpitTrainer does not support gradient_accumulation_steps > 1 yet."
            )
        self.cockpit = cockpit
        self.cockpit_info = cockpit_info

    def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """Compute the loss, then run ``backward`` inside the Cockpit step.

        ``num_items_in_batch`` (for losses normalised over accumulated micro-batches) is
        not passed on: without gradient accumulation the model's own mean loss is the same.
        """
        model.train()
        if callable(getattr(self.optimizer, "train", None)):  # schedule-free optimizers
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
        if self.args.n_gpu > 1:
            loss = loss.mean()
        step = int(self.state.global_step)
        info = {"loss": loss, "batch_size": _batch_size(inputs), "optimizer": self.optimizer}
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            info["grad_scaler"] = scaler
        if self.cockpit_info is not None:
            info.update(self.cockpit_info(inputs, outputs))
        with self.cockpit(step, info=info):
            self.accelerator.backward(loss, retain_graph=self.cockpit.retain_graph(step))
        return loss.detach()


def _batch_size(inputs: dict[str, Any]) -> int:
    for value in inputs.values():
        shape = getattr(value, "shape", None)
        if shape:
            return int(shape[0])
    raise MisuseError("CockpitTrainer could not find the batch size in the inputs.")
