"""The loss of training as the user named it (``loss_fn=``), and checking what it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from cockpit_core.engine.losses import PER_SAMPLE_LOSSES, module_equivalent, per_sample_loss

LOSS_NAMES = ", ".join(f"'{n}'" for n in PER_SAMPLE_LOSSES)
"""The named per-sample losses, for messages."""


@dataclass(frozen=True)
class LossSpec:
    """The loss of training, as the user named it (``loss_fn=``).

    Attributes:
        given: What the user passed.
        module: A loss module (one with a ``reduction`` attribute) whose calls cockpit
            observes, else ``None``.
        per_sample: ``per_sample(outputs, targets) -> [B]`` from the model's outputs and
            the targets (a named loss, the callable, or a plain loss module's equivalent),
            else ``None``.
        for_func: The per-sample loss the ``torch.func`` provider evaluates.

    """

    given: Any
    module: torch.nn.Module | None
    per_sample: Callable[..., Tensor] | None
    for_func: Callable[..., Tensor]

    @property
    def label(self) -> str:
        """The loss, for messages."""
        if isinstance(self.given, str):
            return repr(self.given)
        if self.module is not None:
            return f"the loss module {type(self.module).__name__}"
        return getattr(self.given, "__name__", type(self.given).__name__)


def loss_spec(loss_fn: Any) -> LossSpec | None:
    """Resolve ``loss_fn``: a loss module, a name of :data:`PER_SAMPLE_LOSSES`, or a callable.

    Raises:
        ValueError: An unknown name (the message lists the known ones).
        TypeError: Neither a string nor a callable.

    """
    if loss_fn is None:
        return None
    if isinstance(loss_fn, str):
        fn = per_sample_loss(loss_fn)
        return LossSpec(loss_fn, None, fn, fn)
    if isinstance(loss_fn, torch.nn.Module) and isinstance(
        getattr(loss_fn, "reduction", None), str
    ):
        return LossSpec(loss_fn, loss_fn, module_equivalent(loss_fn), loss_fn)
    if callable(loss_fn):
        return LossSpec(loss_fn, None, loss_fn, loss_fn)
    raise TypeError(
        f"loss_fn must be a loss module, a name ({LOSS_NAMES}) or a callable "
        f"loss_fn(outputs, targets), got {type(loss_fn).__name__}"
    )


def shape_problem(losses: Any, batch: int, spec: LossSpec) -> str | None:
    """Why ``losses`` are not per-sample losses ``[B]`` (``None``: they are)."""
    if not isinstance(losses, Tensor):
        return f"{spec.label} returned a {type(losses).__name__}, not per-sample losses [B]"
    if losses.dim() != 1 or (batch and losses.shape[0] != batch):
        return (
            f"{spec.label} returned a tensor of shape {list(losses.shape)}, not the per-sample "
            f"losses [{batch}] (a loss_fn must not reduce over the batch)"
        )
    return None
