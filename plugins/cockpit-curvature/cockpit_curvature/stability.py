"""Stability thresholds of optimizers for the largest Hessian eigenvalue (edge of stability).

Gradient descent with learning rate ``eta`` on a quadratic with curvature ``lambda`` is
stable iff ``lambda < 2/eta``; with heavy-ball momentum ``beta`` iff
``lambda < (2 + 2 beta)/eta``. Cohen et al. (2021, "Gradient Descent on Neural Networks
Typically Occurs at the Edge of Stability", ICLR) find that full-batch training drives
``lambda_max`` of the loss Hessian up to this threshold and then hovers at it. Everything here
reads logged values (``optimizer_hparams`` of cockpit-basic), so it works on a log offline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

EOS_FRACTION = 0.9
"""lambda_max at or above this fraction of the threshold counts as at the edge."""
EOS_MIN_STEPS = 3
"""Consecutive tracked steps at the edge before the panel says the run is at the edge."""

ADAPTIVE = frozenset(
    {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "Rprop"}
    | {"SparseAdam", "Adafactor"}
)
"""Optimizers whose step is preconditioned: the threshold is on P^-1 H, not on H."""

_SGD_KEYS = ("lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize")


def sgd_threshold(
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
) -> float:
    """Largest stable ``lambda_max`` of the loss Hessian for ``torch.optim.SGD``.

    ``torch.optim.SGD`` with momentum runs ``v <- beta v + (1 - d) g``, ``theta <- theta -
    eta v`` (Nesterov: ``theta <- theta - eta (g + beta v)``), with ``g = grad L + wd theta``.
    On a quadratic along an eigenvector with eigenvalue ``lambda + wd`` the iteration is a
    linear recurrence in ``(theta, v)``; its roots stay inside the unit circle (Jury's
    criterion) iff ``eta (1 - d) (lambda + wd) < 2 (1 + beta)`` for heavy ball (Cohen et
    al. 2021: ``(2 + 2 beta)/eta``) and ``eta (lambda + wd) < 2 (1 + beta) / (1 + 2 beta)``
    for Nesterov (characteristic polynomial ``z^2 - (1 + beta)(1 - h) z + beta (1 - h)``,
    ``h = eta (lambda + wd)``; derived here in the same way). Hence

        heavy ball:  lambda_max < 2 (1 + beta) / (eta (1 - d)) - wd
        Nesterov:    lambda_max < 2 (1 + beta) / (eta (1 + 2 beta)) - wd

    and ``2/eta - wd`` without momentum (``dampening`` only acts with momentum; PyTorch
    allows Nesterov only without dampening). The first step of PyTorch's momentum skips the
    dampening, which does not change the asymptotic rule.

    Args:
        lr: Learning rate ``eta`` (> 0).
        momentum: ``beta`` in ``[0, 1)``.
        dampening: ``d`` in ``[0, 1)``.
        nesterov: Nesterov momentum.
        weight_decay: L2 weight decay ``wd`` added to the gradient.

    Returns:
        The threshold; ``inf`` when no curvature makes the step unstable (``d = 1``).

    Raises:
        ValueError: A learning rate that is not positive, or momentum outside ``[0, 1)``.

    """
    if not lr > 0:
        raise ValueError(f"the learning rate must be positive, got {lr}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    if momentum == 0:
        return 2.0 / lr - weight_decay
    if nesterov:
        return 2.0 * (1 + momentum) / (lr * (1 + 2 * momentum)) - weight_decay
    if dampening >= 1:
        return math.inf
    return 2.0 * (1 + momentum) / (lr * (1 - dampening)) - weight_decay


def sgd_formula(momentum: float, dampening: float, nesterov: bool, weight_decay: float) -> str:
    r"""The threshold's formula in matplotlib math text, e.g. ``$2(1+\beta)/\eta$``."""
    if momentum == 0:
        core = r"2/\eta"
    elif nesterov:
        core = r"2(1+\beta)/((1+2\beta)\eta)"
    elif dampening:
        core = r"2(1+\beta)/((1-d)\eta)"
    else:
        core = r"2(1+\beta)/\eta"
    return f"${core}{'-wd' if weight_decay else ''}$"


def threshold(hparams: Any) -> tuple[float, str]:
    """``(threshold, formula)`` from an ``optimizer_hparams`` value, or ``(nan, why not)``.

    Only ``torch.optim.SGD`` (class name ``SGD``) gets a threshold, and only when every
    tracked param group has the same one. For adaptive optimizers (Adam, RMSprop, ...) the
    stability threshold bounds the preconditioned sharpness ``lambda_max(P^-1 H)``, which
    needs the optimizer's state; the raw ``lambda_max(H)`` is then shown without threshold.
    """
    if not isinstance(hparams, Mapping):
        return math.nan, "no optimizer hyperparameters logged"
    name = str(hparams.get("optimizer", "?"))
    groups = hparams.get("groups") or []
    if not groups:
        return math.nan, "the optimizer updates no tracked parameter"
    if name != "SGD":
        if name in ADAPTIVE:
            return math.nan, (
                f"{name} is adaptive: its threshold bounds the preconditioned Hessian, "
                "not H. Raw Hessian shown, no threshold."
            )
        return math.nan, f"no stability threshold known for {name}: raw Hessian, no threshold."
    found = [_sgd_group(g) for g in groups]
    for value, why in found:
        if math.isnan(value):
            return value, why
    if len(set(found)) > 1:
        return math.nan, "SGD param groups have different hyperparameters: no single threshold."
    return found[0]


def _sgd_group(group: Mapping[str, Any]) -> tuple[float, str]:
    hp: dict[str, Any] = {k: group.get(k) for k in _SGD_KEYS}
    if hp["maximize"]:
        return math.nan, "SGD with maximize=True ascends: no threshold for lambda_max."
    try:
        lr, beta = float(hp["lr"]), float(hp["momentum"] or 0.0)
        d, wd = float(hp["dampening"] or 0.0), float(hp["weight_decay"] or 0.0)
        nesterov = bool(hp["nesterov"])
        value = sgd_threshold(lr, beta, d, nesterov, wd)
    except (TypeError, ValueError) as err:
        return math.nan, f"SGD hyperparameters without a threshold ({err})."
    return value, sgd_formula(beta, d, nesterov, wd)


def aligned_thresholds(
    steps: Sequence[float] | np.ndarray,
    hparam_steps: Sequence[float] | np.ndarray,
    thresholds: Sequence[float] | np.ndarray,
) -> np.ndarray:
    """The threshold in force at each of ``steps``: the last one logged at or before it."""
    hs = np.asarray(hparam_steps, dtype=float)
    th = np.asarray(thresholds, dtype=float)
    idx = np.searchsorted(hs, np.asarray(steps, dtype=float), side="right") - 1
    out = np.full(len(idx), np.nan)
    ok = idx >= 0
    out[ok] = th[idx[ok]]
    return out


def edge_of_stability_spans(
    steps: Sequence[float] | np.ndarray,
    lam: Sequence[float] | np.ndarray,
    thresholds: Sequence[float] | np.ndarray,
    fraction: float = EOS_FRACTION,
    min_steps: int = EOS_MIN_STEPS,
) -> list[tuple[float, float, int]]:
    """Runs of consecutive tracked steps with ``lam >= fraction * threshold``.

    Returns ``(first step, last step, number of tracked steps)`` of every run of at least
    ``min_steps`` entries; a NaN value or threshold ends a run.
    """
    lam = np.asarray(lam, dtype=float)
    thr = np.asarray(thresholds, dtype=float)
    with np.errstate(invalid="ignore"):
        at_edge = np.isfinite(lam) & np.isfinite(thr) & (lam >= fraction * thr)
    spans, start = [], None
    for i, flag in enumerate([*at_edge.tolist(), False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start >= min_steps:
                spans.append((float(steps[start]), float(steps[i - 1]), i - start))
            start = None
    return spans
