"""Per-sample losses for framework integrations: the one place they are computed.

Quantities such as ``alpha`` and ``early_stopping`` need each sample's own loss ``l_n``
(``info["individual_losses"]``), defined so that the loss a framework backpropagates for a
micro-batch ``k`` of ``B_k`` samples, in a step of ``B`` samples, is

    loss_k = (B_k / B) * mean_{n in k} l_n,

so that the losses of a step's micro-batches add up to the mean of ``l_n`` over the step's
samples and ``grad l_n`` is the per-sample gradient the statistics providers compute
(``cockpit_core.engine.accumulation``). A framework computes ``loss_k`` from the model's outputs,
the targets and its own normalization; :class:`LossMatcher` computes per-sample losses
``p_n`` of a named loss (:mod:`cockpit_core.engine.losses`) on the same outputs and targets,
checks once that their mean is the framework's loss of the micro-batch (so a label
smoothing, class weights or a custom loss are never mistaken for a standard one), and
:func:`scaled` turns them into ``l_n``.

When the core observes the model's forward pass and takes a named loss itself
(``Cockpit(model, loss_fn=...)``), the integrations hand the name over and this module
shrinks to the checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from cockpit_core.engine.cockpit import Cockpit
from cockpit_core.engine.losses import PER_SAMPLE_LOSSES, logits_of, per_sample_loss
from cockpit_core.errors import MisuseError

LossSpec = str | Callable[..., Tensor] | None
"""``"auto"`` (found from the outputs and targets), a name of :mod:`cockpit_core.engine.losses`,
a callable ``loss(outputs, targets) -> [B]`` or ``None`` (never computed)."""

NORMALIZED = ("causal_lm", "cross_entropy")
"""Named losses whose per-sample values depend on the number of tokens the loss divides by."""

TARGET_KEYS = ("labels", "label", "targets", "target", "y")
"""Keys of a dict batch that hold the targets, in order of preference."""

RTOL = 1e-4
"""How closely the mean of the per-sample losses must equal the framework's loss.

Far above float32 rounding (summation order; bfloat16 logits are upcast as the frameworks
do) and below what a label smoothing of 0.05 changes even at initialization, where the
predictions are nearly uniform and smoothing changes the loss least."""


def losses_needed(cp: Cockpit) -> list[str]:
    """Keys of the Cockpit's quantities that need ``info["individual_losses"]``."""
    out = []
    for q in cp.quantities:
        try:
            if "individual_losses" in q.required_info():
                out.append(q.key)
        except Exception:  # plugin code: the planner reports it when it plans the step
            continue
    return out


def loss_for_attach(loss_fn: LossSpec) -> Callable[..., Tensor] | None:
    """The per-sample loss to give ``cp.attach`` (the ``torch.func`` provider's), if named."""
    if callable(loss_fn):
        return loss_fn
    if isinstance(loss_fn, str) and loss_fn != "auto":
        return per_sample_loss(loss_fn)
    return None


def check_loss_spec(loss_fn: Any) -> LossSpec:
    """``loss_fn`` if it is a valid :data:`LossSpec`.

    Raises:
        MisuseError: An unknown name, or neither a name, a callable nor ``None``.

    """
    if loss_fn is None or callable(loss_fn) or loss_fn == "auto":
        spec: LossSpec = loss_fn  # a callable is taken to be loss(outputs, targets) -> [B]
        return spec
    if isinstance(loss_fn, str):
        try:
            per_sample_loss(loss_fn)
        except ValueError as err:
            raise MisuseError(f"CockpitCallback(loss_fn=...): {err}.") from None
        return loss_fn
    raise MisuseError(
        "CockpitCallback(loss_fn=...) takes 'auto', a loss name "
        f"({', '.join(PER_SAMPLE_LOSSES)}), a callable loss(outputs, targets) -> [B] or None, "
        f"not {type(loss_fn).__name__}."
    )


def targets_of(batch: Any) -> Tensor | None:
    """The targets of a batch, or ``None``.

    ``batch["labels"]`` (or ``label``, ``targets``, ``target``, ``y``) of a dict, the last
    item of an ``(inputs, targets)`` tuple or list.
    """
    if isinstance(batch, Mapping):
        for key in TARGET_KEYS:
            value = batch.get(key)
            if isinstance(value, Tensor):
                return value
        return None
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        last = batch[-1]
        if isinstance(last, Tensor):
            return last
    return None


def scaled(losses: Tensor, share: float, factor: Tensor | float = 1.0) -> Tensor:
    """``l_n = p_n * factor / share``: per-sample losses in cockpit's convention.

    Args:
        losses: ``p_n`` of one micro-batch, whose mean is the loss the model computed.
        share: The micro-batch's share of the step's samples, ``B_k / B``.
        factor: What the framework multiplies the model's loss by before ``backward``
            (``1 / K`` when it divides by the number of micro-batches).

    """
    return losses.detach() * (factor / share)


class LossMatcher:
    """Per-sample losses of one micro-batch, checked against the framework's loss.

    The first call tries the candidate losses (the given one, or for ``"auto"`` those that
    fit the outputs' and targets' shapes; ``causal_lm`` first for a causal language model)
    and, for the losses that divide by a number of tokens, the given ``normalizer`` and the
    micro-batch's own count. The first whose mean equals ``expected`` (relative
    :data:`RTOL`) is kept for the rest of the run, without further checks.

    Args:
        loss_fn: See :data:`LossSpec` (not ``None``).
        hint: Candidates to try first for ``"auto"`` (e.g. ``("causal_lm",)`` for a
            causal language model).

    Attributes:
        chosen: ``(label, loss, normalized)`` once a candidate matched.
        failure: Why no candidate matched (``None`` until one failed).

    """

    def __init__(self, loss_fn: LossSpec, hint: Sequence[str] = ()):
        self.loss_fn = loss_fn
        self.hint = tuple(hint)
        self.chosen: tuple[str, Callable[..., Tensor], bool] | None = None
        self.failure: str | None = None

    def __call__(
        self, outputs: Any, targets: Any, expected: Tensor | float, normalizer: Any = None
    ) -> Tensor | None:
        """Per-sample losses ``[B]`` (detached) whose mean is ``expected``, or ``None``.

        Args:
            outputs: The model's outputs (a tensor, ``.logits``, or a tuple).
            targets: The targets (``labels``) of the micro-batch.
            expected: The loss the model (or the user's code) computed for the micro-batch.
            normalizer: The number of label tokens the framework divides the summed token
                losses by (Hugging Face's ``num_items_in_batch``), if any.

        """
        if self.chosen is not None:
            _, fn, normalized = self.chosen
            return _call(fn, outputs, targets, normalizer if normalized else None).detach()
        if outputs is None or not isinstance(targets, Tensor):
            self.failure = (
                "cockpit saw no model output"
                if outputs is None
                else "cockpit found no targets (labels) in the batch"
            )
            return None
        want = float(expected)
        tried = []
        for label, fn in self._candidates(outputs, targets):
            options = [True, False] if normalizer is not None and label in NORMALIZED else [False]
            for normalized in options:
                try:
                    with torch.no_grad():
                        losses = _call(fn, outputs, targets, normalizer if normalized else None)
                except Exception as err:
                    tried.append(f"'{label}' failed: {err}")
                    break
                size = _leading(outputs)
                if losses.dim() != 1 or (size is not None and len(losses) != size):
                    tried.append(f"'{label}' gave shape {list(losses.shape)}, not [B]")
                    break
                mean = float(losses.float().mean()) if losses.numel() else float("nan")
                if abs(mean - want) <= RTOL * abs(want) + 1e-7:
                    self.chosen = (label, fn, normalized)
                    return losses.detach()
                how = " divided by num_items_in_batch" if normalized else ""
                tried.append(f"'{label}'{how} has mean {mean:.6g}")
        self.failure = (
            f"no per-sample loss reproduces the loss {want:.6g} of the first micro-batch: "
            + ("; ".join(tried) if tried else "no candidate fits the outputs and targets")
        )
        return None

    def _candidates(self, outputs: Any, targets: Tensor) -> list[tuple[str, Callable[..., Tensor]]]:
        if callable(self.loss_fn):
            return [(getattr(self.loss_fn, "__name__", "loss_fn"), self.loss_fn)]
        if self.loss_fn != "auto":
            return [(str(self.loss_fn), per_sample_loss(str(self.loss_fn)))]
        names = [*self.hint, *_by_shape(outputs, targets)]
        return [(n, per_sample_loss(n)) for n in dict.fromkeys(names)]


def _call(fn: Callable[..., Tensor], outputs: Any, targets: Tensor, normalizer: Any) -> Tensor:
    outputs = _unpacked(outputs)
    scores = _scores(outputs)
    if (
        scores is not None
        and targets.is_floating_point()
        and scores.shape[-1:] == (1,)
        and targets.dim() == scores.dim() - 1
    ):
        outputs = scores.squeeze(-1)  # one regression output per sample, targets [B]
    if scores is not None and targets.device != scores.device:
        targets = targets.to(scores.device)
    if normalizer is not None:
        return fn(outputs, targets, normalizer=normalizer)
    return fn(outputs, targets)


def _unpacked(outputs: Any) -> Any:
    """A plain dict output's ``"logits"`` (``ModelOutput`` has them as an attribute too)."""
    if isinstance(outputs, Mapping) and isinstance(outputs.get("logits"), Tensor):
        return outputs["logits"]
    return outputs


def _scores(outputs: Any) -> Tensor | None:
    try:
        return logits_of(_unpacked(outputs))
    except TypeError:
        return None


def _leading(outputs: Any) -> int | None:
    scores = _scores(outputs)
    return int(scores.shape[0]) if scores is not None and scores.dim() > 0 else None


def _by_shape(outputs: Any, targets: Tensor) -> list[str]:
    """Named losses that fit the shapes of the scores and targets."""
    scores = _scores(outputs)
    if scores is None or scores.dim() == 0 or not scores.is_floating_point():
        return []
    if not targets.is_floating_point():  # class ids
        if scores.dim() == targets.dim() + 1:
            same = tuple(scores.shape[:-1]) == tuple(targets.shape)
            return (
                ["cross_entropy", "causal_lm"] if scores.dim() == 3 and same else ["cross_entropy"]
            )
        return []
    if tuple(scores.shape) == tuple(targets.shape):
        return ["mse", "bce_with_logits", "cross_entropy"]
    if scores.shape[-1:] == (1,) and tuple(scores.shape[:-1]) == tuple(targets.shape):
        return ["mse"]
    return []


def missing_losses_message(needed: list[str], failure: str | None, fix: str) -> str:
    """Why the quantities ``needed`` cannot run, and what to pass instead."""
    names = ", ".join(f"'{n}'" for n in needed)
    verb = "needs" if len(needed) == 1 else "need"
    cause = failure or "no per-sample loss was given"
    return (
        f"cockpit: {names} {verb} per-sample losses (info['individual_losses']), and {cause}. {fix}"
    )


class OutputCatcher:
    """Keeps the model's output of a training step, for per-sample losses from it.

    Forward hooks on a module and its direct children note the output of each outermost
    call (one not inside another hooked call) whose first dimension is the batch size:
    ``self(x)`` gives the module's output, ``self.net(x)`` the child's, and ``self.head(
    self.encoder(x))`` the head's (the last one). Nothing is kept between :meth:`reset`
    and the first such call, or after :meth:`stop`.

    Args:
        module: The module whose forward pass (or whose children's) computes the outputs.

    """

    def __init__(self, module: torch.nn.Module):
        self.output: Any = None
        self.batch_size: int | None = None
        self._depth = 0
        self._handles: list[Any] = []
        for m in (module, *module.children()):
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._leave))

    def reset(self, batch_size: int | None) -> None:
        """A new training step of ``batch_size`` samples begins."""
        self.output, self.batch_size, self._depth = None, batch_size, 0

    def take(self) -> Any:
        """The output noted since :meth:`reset` (``None`` if none); forgotten after."""
        output, self.output = self.output, None
        return output

    def stop(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _enter(self, module: Any, args: Any) -> None:
        self._depth += 1

    def _leave(self, module: Any, args: Any, output: Any) -> None:
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0 and torch.is_grad_enabled():
            size = _leading(output)
            if size is not None and (self.batch_size is None or size == self.batch_size):
                self.output = output
