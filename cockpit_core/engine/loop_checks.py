"""Sanity checks on what the training loop hands to a Cockpit, with messages that say what to do."""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

Shape = tuple[int, ...]
"""A parameter's shape."""

GradientMark = tuple[weakref.ref[torch.Tensor], int] | None
"""What a ``p.grad`` was: a weak reference to it and its version (``None``: no gradient)."""


def nonfinite_reason(
    info: Mapping[str, Any], params: Sequence[torch.Tensor], names: Sequence[str]
) -> str | None:
    """Why this step's loss or gradients are not finite, or ``None`` if they are."""
    loss = info.get("loss")
    if (
        isinstance(loss, torch.Tensor)
        and loss.numel() == 1
        and not torch.isfinite(loss.detach()).all()
    ):
        return f"the loss is {float(loss.detach())}"
    present = [(n, p.grad) for n, p in zip(names, params) if p.grad is not None and p.numel()]
    if not present:
        return None
    # ||g|| is finite only if every entry is: one batched reduction for all parameters, one
    # device sync (the 2-norm: the max-norm kernel is ~6x slower on the CPU); a norm that is
    # not finite is confirmed with max |g|, which is NaN or inf exactly when g holds one (the
    # 2-norm of large finite entries can overflow)
    grads = [g for _, g in present]
    with torch.no_grad():
        flags = _finite(torch._foreach_norm(grads, 2))
        if bool(flags.all()):
            return None
        suspects = [k for k, ok in enumerate(flags.tolist()) if not ok]
        confirmed = _finite(torch._foreach_norm([grads[k] for k in suspects], math.inf))
    bad = [present[k][0] for k, ok in zip(suspects, confirmed.tolist()) if not ok]
    if not bad:
        return None
    shown = ", ".join(f"'{n}'" for n in bad[:5]) + (" ..." if len(bad) > 5 else "")
    return f"the gradients of {shown} contain NaN or inf"


def _finite(norms: Sequence[torch.Tensor]) -> torch.Tensor:
    """Whether each norm is finite, as one boolean tensor (on the first norm's device)."""
    device = norms[0].device
    if any(t.device != device for t in norms):  # a model split across devices
        norms = [t.to(device) for t in norms]
    return torch.isfinite(torch.stack(list(norms)))  # stack promotes mixed dtypes


def optimizer_mismatch(optimizer: Any, params: Sequence[torch.Tensor]) -> str | None:
    """A message if ``optimizer`` does not update every parameter the Cockpit tracks.

    Tracking a subset of the optimizer's parameters (one group, one part of the model) is
    fine: learning rates and updates are looked up per parameter.
    """
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        return None
    opt_ids = {id(p) for g in groups for p in g["params"]}
    ids = {id(p) for p in params}
    if ids <= opt_ids:
        return None
    untracked = len(opt_ids - ids)
    unoptimized = len(ids - opt_ids)
    return (
        f"info['optimizer'] updates {untracked} parameter(s) the Cockpit does not track and "
        f"does not update {unoptimized} tracked parameter(s); quantities that use the update "
        "or the learning rate (update_size, alpha, cabs) may be wrong. Build the Cockpit "
        "from the same parameters as the optimizer."
    )


def reduction_mismatch(info: Mapping[str, Any]) -> str | None:
    """A message if ``info['loss']`` is the sum, not the mean, of ``info['individual_losses']``."""
    loss, losses = info.get("loss"), info.get("individual_losses")
    if not isinstance(loss, torch.Tensor) or not isinstance(losses, torch.Tensor):
        return None
    if losses.numel() < 2 or loss.numel() != 1:
        return None
    loss_value = float(loss.detach())
    total = float(losses.detach().double().sum())
    mean = total / losses.numel()
    # half-precision losses (autocast) are rounded to a few digits
    rtol = max(1e-4, 4 * max(_eps(loss), _eps(losses)))
    if abs(loss_value - mean) <= rtol * max(abs(mean), 1e-12):
        return None
    if abs(loss_value - total) <= rtol * max(abs(total), 1e-12):
        return (
            "info['loss'] is the sum of info['individual_losses'], but cockpit's quantities "
            "assume a mean-reduced loss (reduction='mean'); per-sample statistics would be "
            "scaled wrongly. Use reduction='mean' for the loss you call backward() on."
        )
    return (
        f"info['loss'] ({loss_value:.6g}) is not the mean of info['individual_losses'] "
        f"({mean:.6g}); pass the per-sample losses of the same mini-batch."
    )


def _eps(tensor: torch.Tensor) -> float:
    return torch.finfo(tensor.dtype).eps if tensor.is_floating_point() else 0.0


def gradient_precision(grad: torch.Tensor) -> torch.dtype:
    """The precision ``grad`` was formed in: bfloat16 or float16 if it holds only such numbers.

    Under autocast a float32 parameter's gradient is formed in the activations' dtype and
    then cast to float32, so every element is a bfloat16 (float16) number; a gradient
    formed in float32 is one only by chance (2**-16, 2**-13 per element).
    """
    if grad.dtype not in (torch.float32, torch.float64):
        return grad.dtype
    for dtype in (torch.bfloat16, torch.float16):
        if bool((grad.to(dtype).to(grad.dtype) == grad).all()):
            return dtype
    return grad.dtype


def per_sample_mismatch(
    name: str,
    ratio: float,
    residual: float,
    batch_size: int,
    dtype: torch.dtype = torch.float32,
) -> str | None:
    """A message if ``p.grad`` is not the mean of the per-sample gradients cockpit computed.

    Per-sample statistics assume that the backpropagated loss is the mean of ``batch_size``
    per-sample losses and that ``p.grad`` holds only this step's gradient. A loss scaled
    without telling cockpit is not seen here (the per-sample gradients are scaled alike):
    :func:`scaled_loss` reports it.

    The tolerance is ``max(1e-3, 2 * eps)`` of ``dtype``, the precision ``p.grad`` was
    formed in: float32 rounding stays far below 1e-3. Under autocast each element of
    ``p.grad`` is a sum over the batch rounded to ``dtype`` (relative error up to its unit
    roundoff ``eps / 2``: 2**-8 for bfloat16, 2**-11 for float16), while cockpit averages
    the same half-precision factors in float32; so ``ratio`` and ``residual`` may be off by
    ``eps / 2``, and by ``eps`` if the sum is also rounded in blocks; twice that is
    allowed (1.6e-2 for bfloat16, 2e-3 for float16). A wrong batch size, a sum-reduced loss
    or an un-zeroed ``p.grad`` change them far more (unless, under bfloat16, the batch size
    is off by under 1.6%).

    Args:
        name: The parameter that was checked.
        ratio: ``c`` in ``p.grad ~ c * mean_n g_n`` (least squares), after unscaling.
        residual: ``||p.grad - c * mean_n g_n|| / ||p.grad||``.
        batch_size: The step's ``info["batch_size"]``.
        dtype: The precision of ``p.grad`` (:func:`gradient_precision`).

    """
    tol = max(1e-3, 2 * torch.finfo(dtype).eps) if dtype.is_floating_point else 1e-3
    if abs(ratio - 1.0) <= tol and residual <= tol:
        return None
    samples = ratio * batch_size
    if (
        residual <= tol
        and batch_size > 0
        and round(samples) >= 1
        and abs(samples - round(samples)) < 1e-2
    ):
        if round(samples) != batch_size:
            return (
                f"per-sample statistics are scaled wrongly: info['batch_size'] is {batch_size}, "
                f"but the per-sample gradients of '{name}' average to p.grad / {ratio:.6g}, as "
                f"if the mini-batch had {round(samples)} samples. Pass the number of samples "
                "of the mean loss you backpropagate, info={'batch_size': len(x), ...}."
            )
    return (
        f"the gradient of '{name}' is not the mean of its per-sample gradients (p.grad ~ "
        f"{ratio:.6g} x their mean, residual {residual:.2g}): per-sample statistics assume "
        f"that the loss you backpropagate is the mean over info['batch_size'] = {batch_size} "
        "samples of their own losses and that p.grad was zeroed before the step. Check "
        "batch_size, the loss reduction, opt.zero_grad(), and gradient changes inside the "
        "`with cp(...)` block."
    )


def scaled_loss(seen: float | None, scale: float, has_scaler: bool) -> str | None:
    """A message if the gradient that reached ``info["loss"]`` is not the announced scale.

    Args:
        seen: The gradient ``backward`` sent into ``info["loss"]`` (``None``: none went
            through it, e.g. ``info["loss"]`` is not the tensor that was backpropagated).
        scale: ``info["grad_scaler"].get_scale()``, 1 without a scaler.
        has_scaler: Whether ``info["grad_scaler"]`` was given.

    """
    if seen is None or not math.isfinite(seen) or abs(seen - scale) <= 1e-6 * max(scale, 1.0):
        return None
    if not has_scaler:
        return (
            f"the loss was backpropagated multiplied by {seen:.6g} (the gradient reaching "
            "info['loss'] is not 1), so every gradient is scaled (torch.amp.GradScaler?). "
            "Pass the scaler, info={'grad_scaler': scaler, ...}, so that every statistic is "
            "computed on unscaled gradients (docs/mixed_precision.md); until then they are "
            f"{seen:.6g} x too large"
        )
    if abs(seen - 1.0) <= 1e-6:
        return (
            f"the tensor in info['loss'] looks like the scaled loss: backward sent 1 into it, while "
            f"info['grad_scaler'] scales by {scale:.6g}. Pass the unscaled loss, "
            "info={'loss': loss, ...} with scaler.scale(loss).backward() inside the block "
            "(docs/mixed_precision.md)"
        )
    return (
        f"the loss was backpropagated multiplied by {seen:.6g}, but info['grad_scaler'] "
        f"scales by {scale:.6g}: statistics are unscaled by the wrong factor. Pass the scaler "
        "that scales this loss, and call scaler.update() only after the `with cp(...)` block"
    )


def scaler_skipped(scale: float) -> str:
    """The reason of a step whose ``GradScaler`` found inf/NaN gradients."""
    return (
        f"the GradScaler found inf/NaN gradients (scale {scale:.6g}): it skips this "
        "optimizer step and lowers the scale, which is normal now and then (more often in "
        "the first steps)"
    )


def batch_norm_in_training(model: torch.nn.Module | None) -> list[str]:
    """Names of the model's BatchNorm modules that are in training mode."""
    if model is None:
        return []
    return [
        name or type(m).__name__
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training
    ]


def batch_norm_in_graph(
    loss: Any, params: Sequence[torch.Tensor], names: Sequence[str]
) -> list[str]:
    """BatchNorm calls in the autograd graph of ``loss`` that normalized with batch statistics.

    For a Cockpit that does not know the model: autograd records every BatchNorm call as a
    node that saved whether it used the batch's statistics (``_saved_training``; a
    ``*WithUpdate*`` node always does) and leads to the parameters it used. Each is named
    by the module of its tracked parameters (``'1'`` for ``'1.weight'``).
    """
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return []
    owners = {id(p): n.rpartition(".")[0] or n for p, n in zip(params, names)}
    found, seen, stack = set(), set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        nexts = [n for n, _ in node.next_functions if n is not None]
        stack.extend(nexts)
        kind = type(node).__name__
        if "BatchNorm" in kind and getattr(node, "_saved_training", "WithUpdate" in kind):
            used = (owners.get(id(getattr(n, "variable", None))) for n in nexts)
            found.add(next((o for o in used if o is not None), "<untracked>"))
    return sorted(found)


BATCH_NORM_REASON = (
    "in training mode BatchNorm mixes the samples of a batch, so per-sample gradients are "
    "not defined"
)


def batch_norm_message(names: Sequence[str]) -> str:
    """The warning for BatchNorm modules in training mode while per-sample statistics run."""
    shown = ", ".join(f"'{n}'" for n in names[:5]) + (" ..." if len(names) > 5 else "")
    return (
        f"BatchNorm module(s) {shown} are in training mode while per-sample statistics are "
        f"tracked: {BATCH_NORM_REASON} (neither for the BatchNorm parameters nor for the "
        "layers before them; each sample's gradient also depends on the other samples). "
        "Per-sample quantities (gradient tests, GSNR, alpha, histograms, TIC) are "
        "then not meaningful. Use GroupNorm/LayerNorm, or track them with the model in eval mode"
    )


def names_text(names: Sequence[str]) -> str:
    """``'a', 'b', 'c' ...``: at most five names."""
    return ", ".join(f"'{n}'" for n in names[:5]) + (
        f" and {len(names) - 5} more" if len(names) > 5 else ""
    )


class ParameterWatch:
    """Notices tracked parameters that change shape, get frozen or unfrozen, or leave the model.

    Args:
        params: The tracked parameters.
        names: Their names.

    """

    def __init__(self, params: Sequence[torch.Tensor], names: Sequence[str]):
        self.params, self.names = list(params), list(names)
        self.shapes = [tuple(p.shape) for p in self.params]
        self.requires = [bool(p.requires_grad) for p in self.params]

    def changes(self) -> tuple[list[int], list[int], list[tuple[int, Shape, Shape]]]:
        """``(frozen, unfrozen, reshaped)`` since the last call (indices; old and new shape)."""
        frozen: list[int] = []
        unfrozen: list[int] = []
        reshaped: list[tuple[int, Shape, Shape]] = []
        for i, p in enumerate(self.params):
            shape, requires = tuple(p.shape), bool(p.requires_grad)
            if shape != self.shapes[i]:
                reshaped.append((i, self.shapes[i], shape))
                self.shapes[i] = shape
            if requires != self.requires[i]:
                (unfrozen if requires else frozen).append(i)
                self.requires[i] = requires
        return frozen, unfrozen, reshaped

    def removed(self, model: torch.nn.Module | None) -> list[int]:
        """Tracked parameters that ``model`` no longer holds (a replaced layer)."""
        if model is None:
            return []
        held = {id(p) for p in model.parameters()}
        return [i for i, p in enumerate(self.params) if id(p) not in held]

    def frozen_message(self, step: int, frozen: Sequence[int]) -> str:
        """The warning for parameters that stopped requiring gradients."""
        return (
            f"parameter(s) {names_text([self.names[i] for i in frozen])} no longer require "
            f"gradients at step {step} (frozen): from now on quantities treat them as having a "
            "zero gradient (a stale p.grad is ignored) and leave them out of per-sample "
            "statistics, so values describe the parameters that still train and cannot be "
            "compared with earlier steps. To track only the trainable parameters, build a "
            "new Cockpit from them."
        )

    def unfrozen_message(self, step: int, unfrozen: Sequence[int]) -> str:
        """The warning for parameters that require gradients again."""
        return (
            f"parameter(s) {names_text([self.names[i] for i in unfrozen])} require gradients "
            f"again at step {step} (unfrozen): their statistics are missing at this step if "
            "the statistics providers did not observe the forward pass for them, and are "
            "computed again from the next tracked step on. Values before and after the "
            "change describe different sets of parameters."
        )

    def reshaped_message(self, step: int, reshaped: Sequence[tuple[int, Shape, Shape]]) -> str:
        """The warning for parameters that changed shape."""
        shown = ", ".join(
            f"'{self.names[i]}' {list(old)} -> {list(new)}" for i, old, new in reshaped[:5]
        )
        return (
            f"parameter(s) changed shape at step {step} ({shown}): the two points of two-step "
            "quantities that started before (update_size, alpha, ...) cannot be compared, so "
            "those values are dropped; quantities that keep state across steps (distance) "
            "record errors, and the log's header still lists the old shapes. After changing "
            "the architecture, build a new Cockpit (with a new log)."
        )

    def removed_message(self, step: int, removed: Sequence[int]) -> str:
        """The warning for tracked parameters the attached model no longer holds."""
        return (
            f"parameter(s) {names_text([self.names[i] for i in removed])} are no longer part "
            f"of the attached model at step {step} (a replaced layer?): they get no gradient, "
            "so quantities count them as zero and the new layer's parameters are not tracked. "
            "Build a new Cockpit from the new model's parameters."
        )


def gradient_marks(params: Sequence[torch.Tensor]) -> list[GradientMark]:
    """What each ``p.grad`` is now (a weak reference and its version), to see changes."""
    marks: list[GradientMark] = []
    for p in params:
        g = p.grad
        marks.append(None if g is None else (weakref.ref(g), g._version))
    return marks


def gradients_changed(params: Sequence[torch.Tensor], marks: Sequence[GradientMark]) -> bool:
    """Whether some parameter's gradient was set or changed since :func:`gradient_marks`."""
    for p, mark in zip(params, marks):
        g = p.grad
        if g is None:
            continue
        if mark is None or mark[0]() is not g or g._version != mark[1]:
            return True
    return False


def no_backward_reason(step: int) -> str:
    """Why a step without ``backward()`` inside its block is skipped."""
    return (
        f"no tracked parameter received a gradient inside `with cp({step}, ...)`: "
        "backward() was not called in the block (or ran before it)"
    )
