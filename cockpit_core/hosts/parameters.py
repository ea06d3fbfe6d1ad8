"""Which parameters a framework's optimizers update, and which a backward pass reaches.

For framework integrations (:mod:`cockpit_core.hosts`), which build Cockpits from a model
and its optimizers without the user naming the parameters: the Lightning and Hugging Face
ones (``cockpit-lightning``, ``cockpit-huggingface``) use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from cockpit_core.engine.cockpit import Cockpit


def optimizer_parameter_ids(optimizer: Any) -> set[int]:
    """``id`` of every parameter in the optimizer's ``param_groups``."""
    return {id(p) for group in getattr(optimizer, "param_groups", ()) for p in group["params"]}


def trainable_named_parameters(
    model: torch.nn.Module, optimizer: Any = None
) -> list[tuple[str, torch.nn.Parameter]]:
    """``(name, parameter)`` of the model's trainable parameters, in the model's order.

    With ``optimizer``, only those it updates (a parameter the optimizer does not own has
    no update to describe); without, every parameter that requires a gradient.
    """
    owned = optimizer_parameter_ids(optimizer) if optimizer is not None else None
    return [
        (name, p)
        for name, p in model.named_parameters()
        if p.requires_grad and (owned is None or id(p) in owned)
    ]


def optimizer_of(cp: Cockpit, optimizers: Sequence[Any]) -> int | None:
    """The index of the optimizer that updates exactly (else all of) the Cockpit's parameters.

    ``None`` if the parameters span several optimizers.
    """
    if len(optimizers) <= 1:
        return 0
    ids = {id(p) for p in cp.params}
    sets = [optimizer_parameter_ids(opt) for opt in optimizers]
    for i, s in enumerate(sets):
        if s == ids:
            return i
    for i, s in enumerate(sets):
        if ids <= s:
            return i
    return None


def reached_parameters(loss: Any) -> set[int]:
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


def batch_size_of(batch: Any) -> int | None:
    """The first dimension of the first tensor in ``batch`` (nested tuples, lists, dicts)."""
    todo = [batch]
    while todo:
        item = todo.pop(0)
        if isinstance(item, torch.Tensor):
            if item.dim() > 0:
                return int(item.shape[0])
        elif isinstance(item, Mapping):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
    return None
