"""What ``cp.check(model, sample=...)`` runs: a sample, its loss and per-sample losses.

A sample is either a callable ``sample(model) -> loss`` (the mean loss, or the per-sample
losses ``[B]``: the most general form, e.g. ``lambda m: m(input_ids=x, labels=x).loss``)
or a batch, ``inputs`` alone or ``(inputs, targets)``, whose loss is named
(:data:`PER_SAMPLE_LOSSES`, the per-sample losses of :mod:`cockpit_core.engine.losses`, which
training uses too) or given as a callable ``loss(outputs, targets)``. :func:`sample_spec`
checks it once; :func:`evaluate` runs it on the model copy of the check
(:mod:`cockpit_core.check.run`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch
from torch import Tensor

from cockpit_core.engine.losses import PER_SAMPLE_LOSSES, logits_of
from cockpit_core.errors import MisuseError

Sample = Union[Callable[[torch.nn.Module], Tensor], Tensor, Mapping[str, Any], Sequence[Any]]
"""What ``cp.check(model, sample=...)`` takes: a callable, or a batch."""


def random_targets(outputs: Tensor, loss: str) -> Tensor:
    """Targets for ``outputs`` when a batch brings none.

    Class ids for ``cross_entropy`` and ``causal_lm`` (class scores on the last
    dimension), zeros and ones for ``bce_with_logits``, normal noise for ``mse``.
    """
    outputs = outputs.detach()
    if loss in ("cross_entropy", "causal_lm"):
        return torch.randint(outputs.shape[-1], outputs.shape[:-1], device=outputs.device)
    if loss == "bce_with_logits":
        return torch.randint_like(outputs, 2)
    return torch.randn_like(outputs)


MEAN_MODULES: dict[str, type[torch.nn.Module]] = {
    "cross_entropy": torch.nn.CrossEntropyLoss,
    "mse": torch.nn.MSELoss,
    "bce_with_logits": torch.nn.BCEWithLogitsLoss,
}
"""The ``torch.nn`` loss of a named loss: their mean, as a module (BackPACK needs one)."""


@dataclass(frozen=True)
class SampleSpec:
    """A checked sample: a callable, or a batch with the loss that turns it into losses.

    Attributes:
        call: ``sample(model) -> loss`` (``None`` for a batch).
        inputs: The batch's inputs: a tensor, a tuple (positional) or a dict (keyword).
        targets: Its targets, ``None`` if it has none.
        loss: ``loss(outputs, targets)`` (``loss(outputs)`` without targets): the
            per-sample losses or their mean; for a named loss, the per-sample losses.
        loss_name: The name of a built-in loss (random targets, ``logits`` read from
            model outputs that are not a tensor).
        mean: For a named loss, the loss module that computes the mean loss.

    """

    call: Callable[[torch.nn.Module], Any] | None = None
    inputs: Any = None
    targets: Any = None
    loss: Callable[..., Tensor] | None = None
    loss_name: str | None = None
    mean: torch.nn.Module | None = None


def sample_spec(
    sample: Any,
    loss: Any,
    attached: Any = None,
    prepare: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
) -> SampleSpec:
    """Check ``sample`` and ``loss``; ``attached``: the per-sample loss of ``cp.attach``.

    ``prepare`` readies the loss module of a named loss for the installed providers
    (:meth:`Registry.prepare_module <cockpit_core.plugin.registry.Registry.prepare_module>`:
    BackPACK's curvature starts at an extended loss module); ``None``: as is.

    Raises:
        MisuseError: A sample that is neither a callable nor a batch, a loss with a
            callable sample, an unknown loss name, or a batch without a loss.

    """
    if callable(sample) and not isinstance(sample, (Tensor, torch.nn.Module)):
        if loss is not None:
            raise MisuseError(
                "cp.check(model, sample, loss=...): loss= is for a batch; a callable sample "
                "computes the loss itself (sample(model) -> loss, or per-sample losses [B])."
            )
        return SampleSpec(call=sample)
    if isinstance(sample, (Tensor, Mapping)):
        inputs, targets = sample, None
    elif isinstance(sample, (tuple, list)) and len(sample) == 2:
        inputs, targets = sample
    else:
        raise MisuseError(
            "cp.check(model, sample=...): sample must be a callable sample(model) -> loss, "
            "a batch (inputs, targets), or the inputs alone (a tensor or a dict of keyword "
            f"arguments), got {type(sample).__name__}."
        )
    if isinstance(loss, str):
        if loss not in PER_SAMPLE_LOSSES:
            raise MisuseError(
                f"cp.check(model, sample, loss={loss!r}): unknown loss; name one of "
                f"{sorted(PER_SAMPLE_LOSSES)} or pass a callable loss(outputs, targets)."
            )
        mean = _module(loss, prepare)
        return SampleSpec(None, inputs, targets, PER_SAMPLE_LOSSES[loss], loss, mean)
    name = _plain_name(loss)
    if name is not None:  # the training loss module, e.g. extend(nn.CrossEntropyLoss())
        return SampleSpec(None, inputs, targets, PER_SAMPLE_LOSSES[name], name, loss)
    loss = loss if loss is not None else attached
    if not callable(loss):
        raise MisuseError(
            "cp.check(model, sample=batch) needs the loss of the batch: loss='cross_entropy', "
            "loss='mse' or a callable loss(outputs, targets) returning the per-sample losses "
            "[B] (or their mean); or attach one first with cp.attach(model, loss_fn)."
        )
    return SampleSpec(inputs=inputs, targets=targets, loss=loss)


@dataclass(frozen=True)
class Evaluated:
    """A sample's forward pass: what the step's ``info`` gets.

    Attributes:
        loss: The mean loss (to backpropagate).
        losses: The per-sample losses ``[B]``, ``None`` if the sample gave only the mean.
        batch_size: ``B`` (0 if the sample did not tell it).
        inputs: The batch's inputs (``None`` for a callable sample).
        targets: Its targets, the random ones included (``None`` if there are none).

    """

    loss: Tensor
    losses: Tensor | None
    batch_size: int
    inputs: Any = None
    targets: Any = None


def evaluate(spec: SampleSpec, model: torch.nn.Module) -> Evaluated:
    """Run ``spec`` on ``model``: the loss and, where the sample gives them, the per-sample losses.

    Raises:
        MisuseError: The loss is neither a scalar nor a vector ``[B]``.

    """
    targets = spec.targets
    if spec.call is not None:
        value = spec.call(model)
    else:
        assert spec.loss is not None
        outputs = _call(model, spec.inputs)
        if spec.loss_name is not None:
            outputs = _scores(outputs)
            if targets is None:
                targets = random_targets(outputs, spec.loss_name)
            losses = spec.loss(outputs, targets)
            # the loss module where it is the mean of the per-sample losses (BackPACK's
            # curvature starts from it), else their mean
            whole = spec.mean is not None and (
                spec.loss_name != "cross_entropy" or outputs.dim() == 2
            )
            mean = spec.mean(outputs, targets) if whole else losses.mean()  # type: ignore[misc]
            return Evaluated(mean, losses, len(losses), spec.inputs, targets)
        value = spec.loss(outputs) if targets is None else spec.loss(outputs, targets)
    if not isinstance(value, Tensor) or value.dim() > 1:
        shape = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise MisuseError(
            "the sample's loss must be a scalar (the mean loss) or the per-sample losses "
            f"[B], got {shape}."
        )
    if value.dim() == 1:
        return Evaluated(value.mean(), value, len(value), spec.inputs, targets)
    size = 0 if spec.call is not None else leading_size(spec.inputs)
    return Evaluated(value, None, size, spec.inputs, targets)


def leading_size(batch: Any) -> int:
    """Dimension 0 of the first tensor (of at least one dimension) in ``batch``; 0 if none."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 0
    items = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(batch, (Mapping, tuple, list)):
        for item in items:
            size = leading_size(item)
            if size:
                return size
    return 0


def _call(model: torch.nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _scores(outputs: Any) -> Any:
    """What a named loss reads: the output, its ``logits`` (Hugging Face), a tuple's first item."""
    try:
        return logits_of(outputs)
    except TypeError:
        return outputs


def _module(
    name: str, prepare: Callable[[torch.nn.Module], torch.nn.Module] | None
) -> torch.nn.Module | None:
    """The loss module of ``name``, after ``prepare`` (the providers' preparation).

    BackPACK's curvature (``diag_hessian``, ``diag_ggn``) starts at an extended loss module,
    as in training with ``extend(nn.CrossEntropyLoss())``; other providers leave it as is.
    ``None`` for a loss without one (``causal_lm``: the mean of the per-sample losses).
    """
    if name not in MEAN_MODULES:
        return None
    module = MEAN_MODULES[name]()
    return module if prepare is None else prepare(module)


def _plain_name(loss: Any) -> str | None:
    """The name of ``loss`` if it is a mean-reduced named loss module with default options."""
    for name, cls in MEAN_MODULES.items():
        if type(loss) is cls and loss.reduction == "mean":
            plain = getattr(loss, "weight", None) is None
            plain = plain and getattr(loss, "pos_weight", None) is None
            plain = plain and getattr(loss, "label_smoothing", 0.0) == 0.0
            return name if plain and getattr(loss, "ignore_index", -100) == -100 else None
    return None
