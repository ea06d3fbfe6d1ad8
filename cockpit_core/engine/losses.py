"""Per-sample losses of the standard training losses, by name.

Per-sample quantities need each sample's own loss ``l_n`` (``info["individual_losses"]``),
defined so that the loss the training backpropagates is their mean, ``L = (1/B) sum_n
l_n``: then ``B * dL/d(output_n)`` is the gradient of ``l_n``, the convention of every
per-sample statistic. For the losses below cockpit computes them from the model's outputs
and the targets:

``cross_entropy``
    Class scores ``[B, C]`` (targets ``[B]`` or class probabilities ``[B, C]``), or a
    sequence ``[B, T, C]`` with targets ``[B, T]`` (``ignore_index`` left out). With a
    sequence, ``F.cross_entropy`` averages over the ``N`` kept tokens of the whole batch,
    so sample ``n``'s loss is its tokens' sum scaled by ``B / N``:
    ``l_n = (B / N) sum_t ce_nt``, whose mean is that average even when sequences keep
    different numbers of tokens.
``causal_lm``
    The same on next-token prediction: the logits of position ``t`` against the label of
    ``t + 1`` (``transformers``' causal-LM loss, labels ``-100`` ignored). ``normalizer``
    replaces ``N``: ``transformers`` divides by ``num_items_in_batch``, the label tokens of
    all micro-batches of an accumulated step.
``mse``, ``bce_with_logits``
    The mean over each sample's entries (their mean is the ``reduction="mean"`` loss).

Model outputs may be a tensor, a ``transformers`` model output (its ``logits``) or a tuple
(its first item, e.g. nanoGPT's ``(logits, loss)``).

The same convention gives the per-sample losses of a loss *call* the training made (a loss
module such as ``nn.CrossEntropyLoss(weight=..., label_smoothing=...)``, or
``F.cross_entropy(logits.view(-1, V), y.view(-1), ignore_index=-1)``):
:func:`module_losses` and :func:`call_losses` evaluate the call again with
``reduction="none"`` and divide each sample's sum of entries by what the reduction divides
the whole sum by (the kept targets, or their class weights, for cross-entropy and NLL;
every entry otherwise), after checking that this reproduces the call's own value.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def logits_of(outputs: Any) -> Tensor:
    """The tensor of scores in a model's outputs: the tensor, ``outputs.logits``, or ``outputs[0]``.

    Raises:
        TypeError: No tensor where one was expected.

    """
    if isinstance(outputs, Tensor):
        return outputs
    logits = getattr(outputs, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    if isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], Tensor):
        return outputs[0]
    raise TypeError(
        f"cannot find the model's scores in its output of type {type(outputs).__name__}: "
        "return a tensor, an object with .logits, or a tuple whose first item is the tensor"
    )


def _element_losses(
    scores: Tensor, targets: Tensor, ignore_index: int, normalizer: float | Tensor | None
) -> Tensor:
    """``(B / N) sum_e ce_ne`` over each sample's elements (tokens, pixels), ``[B]``.

    ``N`` is the number of kept elements of the batch (``normalizer`` if given), so the
    mean over the samples is ``F.cross_entropy``'s mean-reduced loss.
    """
    batch = scores.shape[0]
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    losses = F.cross_entropy(scores, targets, ignore_index=ignore_index, reduction="none")
    losses = losses.reshape(batch, -1)
    if normalizer is None:
        if targets.is_floating_point():  # class probabilities: every element counts
            normalizer = losses.shape[1] * batch
        else:
            normalizer = (targets != ignore_index).sum().clamp(min=1)
    count = torch.as_tensor(normalizer, dtype=losses.dtype, device=losses.device)
    return losses.sum(1) * (batch / count)


def cross_entropy(
    outputs: Any,
    targets: Tensor,
    *,
    ignore_index: int = -100,
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Per-sample cross-entropy ``[B]`` (see the module docstring for sequences).

    Args:
        outputs: Class scores ``[B, C]``, ``[B, T, C]`` (class last, the language-model
            layout: targets ``[B, T]``) or ``[B, C, ...]`` (PyTorch's layout), or a model
            output holding them.
        targets: Class ids, or class probabilities shaped like the scores.
        ignore_index: A target id that counts for nothing.
        normalizer: The number of elements the training loss divides by (default: the
            kept elements of this batch).

    """
    scores = logits_of(outputs)
    if scores.dim() <= 2:
        return F.cross_entropy(scores, targets, ignore_index=ignore_index, reduction="none")
    if not targets.is_floating_point() and tuple(targets.shape) == tuple(scores.shape[:-1]):
        scores = scores.movedim(-1, 1)  # class last -> PyTorch's class dimension
    return _element_losses(scores, targets, ignore_index, normalizer)


def causal_lm(
    outputs: Any,
    labels: Tensor,
    *,
    ignore_index: int = -100,
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Per-sample next-token cross-entropy ``[B]``: logits of ``t`` against the label of ``t + 1``."""
    scores = logits_of(outputs)[:, :-1].movedim(-1, 1)  # [B, V, T - 1]
    return _element_losses(scores, labels[:, 1:].to(scores.device), ignore_index, normalizer)


def mse(outputs: Any, targets: Tensor) -> Tensor:
    """Per-sample squared error ``[B]``: the mean over each sample's entries."""
    losses = F.mse_loss(logits_of(outputs), targets, reduction="none")
    return losses.flatten(1).mean(1) if losses.dim() > 1 else losses


def bce_with_logits(outputs: Any, targets: Tensor) -> Tensor:
    """Per-sample binary cross-entropy on logits ``[B]``: the mean over each sample's entries."""
    scores = logits_of(outputs)
    losses = F.binary_cross_entropy_with_logits(scores, targets.to(scores.dtype), reduction="none")
    return losses.flatten(1).mean(1) if losses.dim() > 1 else losses


# -- per-sample losses of a loss call the training made -------------------------------------

CAUGHT_FUNCTIONALS: tuple[Callable[..., Tensor], ...] = (
    F.cross_entropy,
    F.mse_loss,
    F.binary_cross_entropy_with_logits,
)
"""Functional losses whose calls on the model's outputs cockpit recognizes."""

_CLASS_MODULES = (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)
_HALF = (torch.float16, torch.bfloat16)


def module_losses(
    module: torch.nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    result: Any,
    batch: int,
    scores: Tensor | None = None,
) -> Tensor:
    """Per-sample losses ``[B]`` of a call ``module(*args, **kwargs) -> result`` of a loss module.

    The module is evaluated again with ``reduction="none"`` (any module with a
    ``reduction`` attribute that its ``forward`` reads, as every ``torch.nn`` loss does);
    ``ignore_index`` and class ``weight`` of ``nn.CrossEntropyLoss``/``nn.NLLLoss`` and
    ``label_smoothing`` are honoured.

    Args:
        module: The loss module.
        args: The call's positional arguments (input, target, ...).
        kwargs: Its keyword arguments.
        result: What the call returned (the reduced loss, or the entries for
            ``reduction="none"``).
        batch: The number of samples ``B`` of the model's forward pass.
        scores: The model's output, to tell the samples of a flattened input apart.

    Raises:
        ValueError: The module has no usable ``reduction``, its entries do not reproduce its
            value, or its entries cannot be assigned to the ``B`` samples.

    """
    reduction = getattr(module, "reduction", None)
    what = type(module).__name__
    if not isinstance(reduction, str):
        raise ValueError(f"{what} has no reduction attribute to evaluate it per entry")
    input, target = _input_and_target(args, kwargs, what)
    if reduction == "none":
        elements = result
    else:
        module.reduction = "none"  # type: ignore[assignment]  # (a str attribute)
        try:
            with torch.no_grad():
                elements = module.forward(*args, **kwargs)
        finally:
            module.reduction = reduction  # type: ignore[assignment]
    classes = isinstance(module, _CLASS_MODULES) and not target.is_floating_point()
    ignore_index = getattr(module, "ignore_index", -100) if classes else None
    weight = getattr(module, "weight", None) if classes else None
    return _per_sample(
        elements, reduction, input, target, result, batch, scores, weight, ignore_index, what
    )


def call_losses(
    func: Callable[..., Tensor],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    result: Any,
    batch: int,
    scores: Tensor | None = None,
) -> Tensor:
    """Per-sample losses ``[B]`` of a functional loss call ``func(*args, **kwargs) -> result``.

    ``func`` is one of :data:`CAUGHT_FUNCTIONALS`; its ``ignore_index``, ``weight`` and
    ``label_smoothing`` are honoured. Arguments as for :func:`module_losses`.

    Raises:
        ValueError: Deprecated ``size_average``/``reduce`` arguments, entries that do not
            reproduce the call's value, or entries that cannot be assigned to the samples.

    """
    what = f"F.{func.__name__}"
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    for legacy in ("size_average", "reduce"):
        if arguments.get(legacy) is not None:
            raise ValueError(f"{what}(..., {legacy}=...) is deprecated: pass reduction= instead")
    reduction = arguments["reduction"]
    input, target = arguments["input"], arguments["target"]
    arguments["reduction"] = "none"
    with torch.no_grad():
        elements = func(**arguments)
    classes = func is F.cross_entropy and not target.is_floating_point()
    ignore_index = arguments["ignore_index"] if classes else None
    weight = arguments.get("weight") if classes else None
    return _per_sample(
        elements, reduction, input, target, result, batch, scores, weight, ignore_index, what
    )


def _input_and_target(
    args: Sequence[Any], kwargs: Mapping[str, Any], what: str
) -> tuple[Tensor, Tensor]:
    values = [*args[:2], *(kwargs[k] for k in ("input", "target") if k in kwargs)]
    if len(values) < 2 or not all(isinstance(v, Tensor) for v in values[:2]):
        raise ValueError(f"{what} was not called as loss(input, target) with two tensors")
    return values[0], values[1]


def _per_sample(
    elements: Any,
    reduction: str,
    input: Tensor,
    target: Tensor,
    result: Any,
    batch: int,
    scores: Tensor | None,
    weight: Tensor | None,
    ignore_index: int | None,
    what: str,
) -> Tensor:
    """``l_n = B * (sum of sample n's entries) / D``, ``D`` what the reduction divides by."""
    if not isinstance(elements, Tensor) or elements.dim() == 0:
        raise ValueError(f"{what} with reduction='none' returned no loss per entry")
    elements = elements.detach()
    if elements.dtype in _HALF:
        elements = elements.float()
    if reduction == "sum":
        count: int | Tensor = 1
    elif reduction == "batchmean":
        count = input.shape[0]
    elif reduction == "mean" and ignore_index is not None:
        kept = target != ignore_index
        count = kept.sum() if weight is None else weight[target[kept]].sum()
    elif reduction in ("mean", "none"):  # "none": the training takes the mean of the entries
        count = elements.numel()
    else:
        raise ValueError(f"{what} has the reduction {reduction!r}, which cockpit does not know")
    divisor = torch.as_tensor(count, dtype=elements.dtype, device=elements.device)
    if reduction != "none":
        _check_reproduces(elements, divisor, result, what)
    rows = _sample_rows(elements, batch, input, scores, what)
    return rows.sum(1) * (batch / divisor)


def _check_reproduces(elements: Tensor, count: Tensor, result: Any, what: str) -> None:
    """Raise if ``sum(elements) / count`` is not the call's reduced value."""
    if not isinstance(result, Tensor) or result.numel() != 1:
        raise ValueError(f"{what} returned no scalar loss to compare its entries with")
    expected = float(result.detach().double())
    got = float(elements.double().sum() / count.double())
    eps = torch.finfo(result.dtype).eps if result.is_floating_point() else 0.0
    tolerance = max(1e-4, 4 * eps)
    if not abs(got - expected) <= tolerance * max(abs(expected), 1e-12):
        raise ValueError(
            f"{what} evaluated per entry does not reproduce its value ({got:.6g} instead of "
            f"{expected:.6g}), so cockpit cannot tell how it weights the samples"
        )


def _sample_rows(
    elements: Tensor, batch: int, input: Tensor, scores: Tensor | None, what: str
) -> Tensor:
    """``elements`` as ``[B, entries]``: sample ``n``'s entries in row ``n``.

    Rows of the entries are the samples, or, for a loss on a flattened view of the model's
    output (``logits.view(-1, V)`` of ``[B, T, V]``), consecutive blocks of rows are.
    """
    if elements.shape[0] == batch:
        return elements.reshape(batch, -1)
    flattened = (
        scores is not None
        and scores.dim() > 0
        and scores.shape[0] == batch
        and elements.numel() % batch == 0
        and input.numel() == scores.numel()
        and input.is_contiguous()
        and scores.is_contiguous()
        and input.data_ptr() == scores.data_ptr()
    )
    if flattened:
        return elements.reshape(batch, -1)
    raise ValueError(
        f"cannot tell which of the {elements.shape[0]} rows of {what}'s input belong to "
        f"which of the {batch} samples: its input is neither [B, ...] nor a flattened view "
        "of the model's output"
    )


def module_equivalent(module: torch.nn.Module) -> Callable[..., Tensor] | None:
    """The per-sample loss of a mean-reduced loss module from outputs and targets, if it has one.

    ``nn.CrossEntropyLoss`` (with its ``ignore_index``; without class weights or label
    smoothing), ``nn.MSELoss`` and ``nn.BCEWithLogitsLoss`` (without weights); else ``None``.
    """
    if getattr(module, "reduction", None) != "mean":
        return None
    if type(module) is torch.nn.CrossEntropyLoss:
        if module.weight is not None or module.label_smoothing != 0.0:
            return None
        return functools.partial(cross_entropy, ignore_index=module.ignore_index)
    if type(module) is torch.nn.MSELoss:
        return mse
    if type(module) is torch.nn.BCEWithLogitsLoss:
        if module.weight is not None or module.pos_weight is not None:
            return None
        return bce_with_logits
    return None


PER_SAMPLE_LOSSES: dict[str, Callable[..., Tensor]] = {
    "cross_entropy": cross_entropy,
    "causal_lm": causal_lm,
    "mse": mse,
    "bce_with_logits": bce_with_logits,
}
"""The losses cockpit knows by name: ``loss(outputs, targets) -> [B]``."""


def per_sample_loss(name: str) -> Callable[..., Tensor]:
    """The per-sample loss called ``name``.

    Raises:
        ValueError: An unknown name (the message lists the known ones).

    """
    try:
        return PER_SAMPLE_LOSSES[name]
    except KeyError:
        known = ", ".join(f"'{n}'" for n in PER_SAMPLE_LOSSES)
        raise ValueError(
            f"unknown loss {name!r}: cockpit knows {known}; pass a callable "
            "loss(outputs, targets) -> per-sample losses [B] for any other"
        ) from None
