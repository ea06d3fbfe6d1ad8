"""The noise-aware quadratic fit along a step and the normalized step size read from it.

Model (Mahsereci & Hennig, "Probabilistic Line Searches for Stochastic Optimization",
JMLR 2017): along the step, ``f(x) = mu_0 + mu_1 x + mu_2 x^2`` for ``x`` in ``[0, t]``.
Four noisy observations: the loss at ``0`` and ``t`` and the directional derivative at
``0`` and ``t``, with variances ``var_f`` and ``var_df``. ``mu`` is the weighted
least-squares (maximum-likelihood) estimate, as in Cockpit 1.0.2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

ZERO_VARIANCE = 1e-10
"""Replaces a variance that is exactly zero (as Cockpit 1.0.2), so that weights exist."""


def fit_quadratic(
    t: float,
    f: Sequence[float],
    df: Sequence[float],
    var_f: Sequence[float],
    var_df: Sequence[float],
) -> np.ndarray | None:
    """Weighted least-squares parabola through two noisy values and two noisy slopes.

    Minimizes ``sum_j (y_j - phi_j . mu)^2 / sigma_j^2`` with ``y = (f(0), f(t), f'(0),
    f'(t))`` and rows ``phi = (1, 0, 0), (1, t, t^2), (0, 1, 0), (0, 1, 2t)``.

    Returns:
        ``mu = (mu_0, mu_1, mu_2)``, or ``None`` if the normal equations are singular
        (e.g. ``t = 0``).

    """
    variances = np.array([v if v != 0 else ZERO_VARIANCE for v in (*var_f, *var_df)], float)
    design = np.array([[1.0, 0.0, 0.0], [1.0, t, t * t], [0.0, 1.0, 0.0], [0.0, 1.0, 2.0 * t]])
    y = np.array([*f, *df], dtype=float)
    weights = 1.0 / variances
    normal = design.T @ (weights[:, None] * design)
    try:
        if not np.all(np.isfinite(normal)):
            return None
        return np.linalg.solve(normal, design.T @ (weights * y))
    except np.linalg.LinAlgError:
        return None


def normalized_step(mu: np.ndarray | None, t: float) -> float:
    """Alpha: where the step of length ``t`` landed on the fitted parabola.

    ``alpha = 2 t / x_bar - 1`` with ``x_bar = -mu_1 / mu_2`` the point on the far side
    of the minimum at the height of the start: ``0`` is the minimum, ``1`` the far side,
    ``-1`` no progress. A parabola that is not convex (``mu_2 <= 0``) gives ``-1`` (still
    going downhill), as does a failed fit with ``t = 0``; any other failed fit gives NaN.
    """
    if mu is None:
        return -1.0 if t == 0 else math.nan
    if mu[2] <= 0:
        return -1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        x_bar = -mu[1] / mu[2]
        return float(2.0 * t / x_bar - 1.0)
