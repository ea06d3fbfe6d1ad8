"""What cockpit saw of one forward pass of the model and of the loss calls after it."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten

TARGET_NAMES = ("labels", "targets", "target", "label", "y")
"""Names of the model's ``forward`` parameters whose argument is taken as the targets."""


@dataclass
class LossCall:
    """One call of the loss: the loss module, or a functional loss on the model's output.

    Attributes:
        fn: The module or the function.
        args: Its positional arguments.
        kwargs: Its keyword arguments.
        result: What it returned.

    """

    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any


@dataclass
class ForwardPass:
    """What cockpit saw of one forward pass of the model, and of the loss calls after it.

    Attributes:
        batch_size: Dimension 0 of the first tensor argument (0: none).
        inputs: The call's arguments without the targets (a tensor, a tuple, a dict), or
            ``None`` (see ``inputs_note``).
        inputs_note: Why ``inputs`` is ``None``.
        targets: The targets found in the call, or ``None``.
        outputs: What the model returned (set when the pass ends).
        scores: The tensor of scores in ``outputs`` (:func:`~cockpit_core.engine.losses.logits_of`).
        finished: Whether the pass returned.
        module_calls: Calls of the loss module after the pass.
        caught: Functional loss calls on its output.

    """

    batch_size: int
    inputs: Any
    inputs_note: str | None
    targets: Any
    outputs: Any = None
    scores: Tensor | None = None
    finished: bool = False
    module_calls: list[LossCall] = field(default_factory=list)
    caught: list[LossCall] = field(default_factory=list)


@dataclass
class Observed:
    """What a step takes from its forward pass.

    Attributes:
        info: The ``info`` entries cockpit could fill.
        reasons: For each wanted key it could not fill, why not.

    """

    info: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)


def record_call(
    signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ForwardPass:
    """The batch size, the targets and the inputs of a call ``model(*args, **kwargs)``."""
    batch = 0
    direct = [*args, *kwargs.values()]  # the common case: a tensor argument
    leaves = direct if any(isinstance(a, Tensor) for a in direct) else None
    for leaf in leaves if leaves is not None else tree_flatten((args, kwargs))[0]:
        if isinstance(leaf, Tensor) and leaf.dim() > 0:
            batch = int(leaf.shape[0])
            break
    position, key = target_of(signature, args, kwargs)
    targets = args[position] if position is not None else kwargs.get(key) if key else None
    rest = [a for i, a in enumerate(args) if i != position]
    named = {k: v for k, v in kwargs.items() if k != key}
    inputs: Any = None
    note = None
    if not named:
        inputs = rest[0] if len(rest) == 1 else tuple(rest)
    elif not rest:
        inputs = named
    else:
        note = (
            "the model was called with positional and keyword arguments, which "
            "info['inputs'] cannot hold (a tensor, a tuple or a dict)"
        )
    return ForwardPass(batch, inputs, note, targets)


def forward_signature(model: torch.nn.Module) -> inspect.Signature | None:
    """The signature of ``model.forward`` (``None``: Python cannot tell it)."""
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None


def target_of(
    signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[int | None, str | None]:
    """Where the targets are in a call: ``(position, None)``, ``(None, keyword)`` or neither."""
    for name in TARGET_NAMES:
        if isinstance(kwargs.get(name), Tensor):
            return None, name
    if signature is None:
        return None, None
    params = list(signature.parameters.values())
    positional = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    for name in TARGET_NAMES:
        if name in positional:
            index = positional.index(name)
            if index < len(args) and isinstance(args[index], Tensor):
                return index, None
    variadic = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if variadic and not positional and len(args) == 2 and all(isinstance(a, Tensor) for a in args):
        return 1, None
    return None, None


def as_targets(call: LossCall, scores: Tensor | None) -> Any:
    """The target argument of a caught loss call, shaped like the model's output.

    ``y.view(-1)`` of a loss on ``logits.view(-1, V)`` becomes ``[B, T]`` again (class
    ids: the scores' shape without the class axis; else the scores' shape).
    """
    target = call.args[1] if len(call.args) > 1 else call.kwargs.get("target")
    if not isinstance(target, Tensor) or scores is None:
        return target
    if target.numel() == scores.numel():
        return target.reshape(scores.shape)
    if scores.dim() > 1 and target.numel() == scores[..., 0].numel():
        return target.reshape(scores.shape[:-1])
    return target
