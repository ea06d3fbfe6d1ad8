"""How the effective learning rate ``||Δθ|| / ||g||`` relates to the optimizer's learning rate.

Helpers of the *Effective learning rate* panel
(:func:`cockpit_basic.instruments.draw_effective_lr`): the caption for the logged optimizer
and the learning rates of ``optimizer_hparams``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.panel import values


def _float(value: Any, default: float = 0.0) -> float:
    try:
        return float(value if value is not None else default)
    except (TypeError, ValueError):
        return float("nan")


def lr_relation(hparams: Any) -> str:
    """How ``||Δθ|| / ||g||`` relates to the learning rate, for the logged optimizer.

    Plain SGD (no momentum, no weight decay) steps ``Δθ = -lr g``: the ratio is ``lr``.
    With momentum ``m`` and dampening ``d`` the step is ``lr v``, ``v ← m v + (1-d) g``
    (heavy ball, Polyak 1964, "Some methods of speeding up the convergence of iteration
    methods"), so the ratio approaches ``lr (1-d) / (1-m)`` while successive gradients
    point the same way (Nesterov's variant too), and ``lr (1-d) / sqrt(1-m^2)`` (root mean
    square) for uncorrelated gradients of equal norm, as ``E||v||^2 = (1-d)^2 ||g||^2 /
    (1-m^2)`` then. Weight decay adds ``lr λ θ`` to the step; adaptive optimizers (Adam,
    ...) scale each coordinate: then the ratio is not the learning rate either.

    Args:
        hparams: An ``optimizer_hparams`` value (``{"optimizer", "groups"}``) or ``None``.

    """
    if not isinstance(hparams, Mapping) or not hparams.get("groups"):
        return "= learning rate only for plain SGD\n(no momentum, no weight decay)"
    name, groups = str(hparams.get("optimizer", "?")), hparams["groups"]
    if name != "SGD":
        return f"{name}: not the learning rate\n(the optimizer rescales the gradient)"
    if any(_float(g.get("weight_decay")) != 0 for g in groups):
        return "SGD with weight decay: not the learning rate\n(the step adds lr·λ·θ)"
    m, d, lr = (_float(groups[0].get(k)) for k in ("momentum", "dampening", "lr"))
    if all(_float(g.get("momentum")) == 0 for g in groups):
        if len({_float(g.get("lr")) for g in groups}) > 1:
            return "plain SGD: between the param groups'\nlearning rates"
        return "plain SGD: = learning rate"
    if not 0 < m < 1:
        return f"SGD, momentum {m:g}: not the learning rate"
    eta = "η(1−d)" if d else "η"
    nesterov = any(g.get("nesterov") for g in groups)
    aligned = lr * (1 - d) / (1 - m)
    text = (
        f"SGD{' (Nesterov)' if nesterov else ''}, momentum m = {m:g}, lr η = {lr:g}:\n"
        f"{eta}/(1−m) = {aligned:.3g} if gradients align"
    )
    if nesterov:
        return text
    return f"{text},\n{eta}/√(1−m²) = {lr * (1 - d) / np.sqrt(1 - m * m):.3g} if uncorrelated"


def learning_rates(output: Any) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """``(steps, lr, label)`` from ``optimizer_hparams``: one line, or one per param group."""
    entries = [(s, v.get("groups") or []) for s, v in values(output, "optimizer_hparams")]
    if not entries:
        return []
    count = max(len(groups) for _, groups in entries)
    table = np.full((len(entries), count), np.nan)
    for i, (_, groups) in enumerate(entries):
        for j, group in enumerate(groups):
            table[i, j] = _float(group.get("lr"), np.nan)
    steps = np.asarray([s for s, _ in entries], dtype=float)
    if np.allclose(table, table[:, :1], equal_nan=True, rtol=0, atol=0):
        return [(steps, table[:, 0], "optimizer lr")]
    return [(steps, table[:, j], f"lr (group {j})") for j in range(count)]


def headroom(ax: Any, fraction: float) -> None:
    """Raise the top of the y-axis so the data keep off its top ``fraction`` (for a caption)."""
    low, high = ax.get_ylim()
    if ax.get_yscale() == "log":
        ax.set_ylim(low, high * (high / low) ** (fraction / (1 - fraction)))
    else:
        ax.set_ylim(low, high + (high - low) * fraction / (1 - fraction))
