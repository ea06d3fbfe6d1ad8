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

Install with ``pip install cockpit-core[lightning]``.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "cockpit_core.integrations.lightning needs PyTorch Lightning: "
        "pip install 'cockpit-core[lightning]' (or pip install lightning)."
    ) from err

from cockpit_core.cockpit import Cockpit
from cockpit_core.errors import MisuseError


class CockpitCallback(Callback):
    """Track a :class:`~cockpit_core.Cockpit` during ``Trainer.fit``.

    Args:
        cockpit: The Cockpit, built from the LightningModule's parameters.
        attribute: Name of the LightningModule attribute holding extra ``info`` for the
            step (``individual_losses``, ``batch_size``, ...).

    The step number is ``trainer.global_step`` (optimizer steps). ``info["loss"]`` is the
    loss Lightning backpropagates and ``info["optimizer"]`` the first optimizer.

    """

    def __init__(self, cockpit: Cockpit, attribute: str = "cockpit_info"):
        super().__init__()
        self.cockpit = cockpit
        self.attribute = attribute
        self._run: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Refuse gradient accumulation (each micro-batch would be its own step)."""
        if getattr(trainer, "accumulate_grad_batches", 1) != 1:
            raise MisuseError(
                "CockpitCallback does not support accumulate_grad_batches > 1 yet: track "
                "without accumulation, or use cp(step, accumulate=True) in a manual loop."
            )
        pl_module.cockpit = self.cockpit

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """Enter the Cockpit step around Lightning's ``backward``."""
        info = {"loss": loss}
        if trainer.optimizers:
            info["optimizer"] = trainer.optimizers[0]
        info.update(getattr(pl_module, self.attribute, None) or {})
        self._run = self.cockpit(int(trainer.global_step), info=info)
        self._run.__enter__()

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        """Leave the step: quantities are computed before clipping and ``optimizer.step``."""
        run, self._run = self._run, None
        if run is not None:
            run.__exit__(None, None, None)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Close the log and sinks."""
        self.cockpit.close()
