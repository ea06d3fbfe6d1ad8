"""Sanity checks on what the training loop hands to a Cockpit, with messages that say what to do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


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
    present = [(n, p.grad) for n, p in zip(names, params) if p.grad is not None]
    if not present:
        return None
    # one flag per parameter, one device sync for all of them
    flags = torch.stack([torch.isfinite(g).all() for _, g in present])
    if bool(flags.all()):
        return None
    bad = [n for (n, _), ok in zip(present, flags.tolist()) if not ok]
    shown = ", ".join(f"'{n}'" for n in bad[:5]) + (" ..." if len(bad) > 5 else "")
    return f"the gradients of {shown} contain NaN or inf"


def optimizer_mismatch(optimizer: Any, params: Sequence[torch.Tensor]) -> str | None:
    """A message if ``optimizer`` updates other parameters than the Cockpit tracks."""
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        return None
    opt_ids = {id(p) for g in groups for p in g["params"]}
    ids = {id(p) for p in params}
    if opt_ids == ids:
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
    total = float(losses.detach().sum())
    mean = total / losses.numel()
    if abs(loss_value - mean) <= 1e-4 * max(abs(mean), 1e-12):
        return None
    if abs(loss_value - total) <= 1e-4 * max(abs(total), 1e-12):
        return (
            "info['loss'] is the sum of info['individual_losses'], but cockpit's quantities "
            "assume a mean-reduced loss (reduction='mean'); per-sample statistics would be "
            "scaled wrongly. Use reduction='mean' for the loss you call backward() on."
        )
    return (
        f"info['loss'] ({loss_value:.6g}) is not the mean of info['individual_losses'] "
        f"({mean:.6g}); pass the per-sample losses of the same mini-batch."
    )
