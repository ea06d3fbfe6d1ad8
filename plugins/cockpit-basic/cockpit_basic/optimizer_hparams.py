"""The optimizer's type and hyperparameters (learning rate, momentum, ...) at each step."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from cockpit_core import Quantity, Requirements, StepContext, tracked_params

IMPLEMENTATION_FLAGS = frozenset({"foreach", "fused", "capturable", "differentiable"})
"""Param-group entries that choose a kernel, not the math: left out of the record."""


def unwrap(optimizer: Any) -> Any:
    """The torch optimizer inside wrappers (accelerate's ``.optimizer``, Lightning's ``._optimizer``)."""
    for _ in range(8):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer or not hasattr(inner, "param_groups"):
            break
        optimizer = inner
    return optimizer


def _plain(value: Any) -> Any:
    """``value`` as a bool, number, string or list of numbers; ``None`` if it is none of them."""
    if isinstance(value, torch.Tensor):
        return float(value.detach()) if value.numel() == 1 else None
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Real):
        return float(value) if not isinstance(value, numbers.Integral) else int(value)
    if isinstance(value, (tuple, list)) and value:
        items = [_plain(v) for v in value]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
            return [float(v) for v in items]
    return None


def group_hparams(group: dict[str, Any]) -> dict[str, Any]:
    """The hyperparameters of one param group: every plain entry but ``params`` and flags."""
    out = {}
    for key, value in group.items():
        if key == "params" or key in IMPLEMENTATION_FLAGS:
            continue
        plain = _plain(value)
        if plain is not None:
            out[str(key)] = plain
    return out


class OptimizerHparams(Quantity):
    """Type and hyperparameters of ``info["optimizer"]`` during the step.

    The value is ``{"optimizer": class name, "groups": [hyperparameters of each param
    group]}``, e.g. ``{"optimizer": "SGD", "groups": [{"lr": 0.1, "momentum": 0.9,
    "dampening": 0.0, "nesterov": False, "weight_decay": 0.0, "maximize": False}]}``. Only
    groups that hold a tracked parameter are listed, in the optimizer's order; a group's
    entries are its numbers, booleans, strings and tuples of numbers (``betas``), without
    ``params`` and the kernel switches ``foreach``, ``fused``, ``capturable`` and
    ``differentiable``. Read inside the ``with cp(step)`` block, before ``optimizer.step()``,
    so ``lr`` is the learning rate of this step's update (a scheduler stepped after
    ``optimizer.step()`` shows at the next step). Wrappers with an ``optimizer`` or
    ``_optimizer`` attribute (accelerate, Lightning) are unwrapped.

    Under FSDP2 the groups are matched against the tracked ``DTensor`` s (the optimizer's
    parameters), not the local rows (``cockpit_core.tracked_params``).

    It needs no ``info`` key: without ``info["optimizer"]`` it records nothing at that step
    (so presets can include it at no cost), and the panels that use it say so.
    """

    name = "optimizer_hparams"
    REQUIREMENTS = Requirements()

    def compute(self, ctx: StepContext) -> dict[str, Any] | None:
        """Return the optimizer's class name and its tracked param groups' hyperparameters."""
        if ctx.optimizer is None:
            return None
        optimizer = unwrap(ctx.optimizer)
        groups = getattr(optimizer, "param_groups", None)
        if groups is None:
            raise TypeError(
                f"info['optimizer'] is a {type(optimizer).__name__} without param_groups; "
                "pass the torch.optim.Optimizer that updates the tracked parameters."
            )
        tracked = {id(p) for p in tracked_params(ctx.params)}  # the optimizer's own tensors
        chosen = [group_hparams(g) for g in groups if any(id(p) in tracked for p in g["params"])]
        return {"optimizer": type(optimizer).__name__, "groups": chosen}
