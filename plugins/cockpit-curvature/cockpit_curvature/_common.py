"""Helpers shared by the curvature quantities: curvature statistics, flat vectors, errors."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from cockpit_core import (
    DIAG_GGN_EXACT,
    DIAG_HESSIAN,
    CockpitWarning,
    Statistic,
    StepContext,
    UnsupportedModelError,
    diag_ggn_mc,
)
from cockpit_curvature._estimators import CALIBRATED_MIN_PRODUCTS, error_bars_calibrated
from cockpit_curvature._lanczos import lanczos

DiagCurvature = Literal["diag_hessian", "diag_ggn_exact", "diag_ggn_mc"]


_NAMES = {"xtrace": "XTrace", "xdiag": "XDiag"}


def warn_if_uncalibrated(key: str, option: str, method: str, probes: int, instead: str) -> None:
    """Warn (:class:`~cockpit_core.CockpitWarning`) that ``method`` reports no error bars.

    Args:
        key: The quantity's output key.
        option: The option that selects the estimator (``method`` or ``curvature``).
        method: The estimator.
        probes: Its product budget.
        instead: The calibrated-at-any-budget alternative (``method='hutchpp'``).

    """
    if error_bars_calibrated(method, probes):
        return
    used = 2 * (probes // 2)  # XTrace and XDiag use an even number of products
    warnings.warn(
        f"cockpit: '{key}' with {option}={method!r} and probes={probes} ({used} products "
        f"used) reports the estimate and hvps without error bars (std_error and "
        f"std_error_per_param are None): {_NAMES.get(method, method)}'s error bars were "
        f"measured within 20% of the actual spread only from {CALIBRATED_MIN_PRODUCTS} "
        f"products on (docs/quantities/curvature.md). Use probes >= "
        f"{CALIBRATED_MIN_PRODUCTS} for a calibrated error bar, or {instead}, whose error "
        f"bars hold at any budget.",
        CockpitWarning,
        stacklevel=3,
    )


def curvature_statistic(curvature: str, mc_samples: int) -> Statistic:
    """The statistic holding the diagonal named by ``curvature``."""
    if curvature == "diag_hessian":
        return DIAG_HESSIAN
    if curvature == "diag_ggn_exact":
        return DIAG_GGN_EXACT
    if curvature == "diag_ggn_mc":
        return diag_ggn_mc(mc_samples)
    raise ValueError(f"unknown curvature {curvature!r}")


def read_diagonal(ctx: StepContext, stat: Statistic, owner: str, hint: str) -> list[Tensor]:
    """``ctx.stat(stat)``, with a hint of what to do if the model is unsupported."""
    try:
        return ctx.stat(stat)
    except UnsupportedModelError as err:
        raise UnsupportedModelError(f"{err} For '{owner}': {hint}") from None


def total_and_per_param(per_param: Sequence[Tensor | float]) -> dict[str, Any]:
    """``{"total": sum, "per_param": np.ndarray}`` in float64."""
    values = np.array([float(v) for v in per_param], dtype=np.float64)
    return {"total": float(values.sum()), "per_param": values}


def flatten(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenate flattened tensors into one vector."""
    return torch.cat([t.reshape(-1) for t in tensors])


def split_like(vector: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    """Split a flat vector into views shaped like ``like``."""
    parts = torch.split(vector, [t.numel() for t in like])
    return [p.view_as(t) for p, t in zip(parts, like)]


def hessian_matvec(ctx: StepContext) -> Callable[[Tensor], Tensor]:
    """``v -> H v`` on flat float64 CPU vectors over ``ctx.params``, through ``ctx.hvp``."""
    params = ctx.params

    def matvec(vector: Tensor) -> Tensor:
        parts = split_like(vector, params)
        parts = [v.to(dtype=p.dtype, device=p.device) for v, p in zip(parts, params)]
        return flatten(ctx.hvp(parts)).to(device="cpu", dtype=torch.float64)

    return matvec


def native_matvec(ctx: StepContext) -> Callable[[Tensor], Tensor]:
    """``v -> H v`` on flat vectors in the parameters' dtype and device (Lanczos' products)."""
    params = ctx.params
    dtype = params[0].dtype

    def matvec(vector: Tensor) -> Tensor:
        return flatten(ctx.hvp(split_like(vector.to(dtype), params))).to(dtype)

    return matvec


def cached_start(ctx: StepContext, key: str, dim: int, enabled: bool) -> Tensor | None:
    """Ritz vectors a quantity cached at its previous tracked step (a Lanczos warm start).

    ``None`` when warm starts are off, nothing is cached, or the dimension changed.
    """
    if not enabled:
        return None
    vectors: Tensor | None = ctx.cache.get(key)
    if vectors is None or vectors.shape[-1] != dim:
        return None
    return vectors


def keep_until_next_step(
    ctx: StepContext, quantity: Any, key: str, vectors: Tensor, max_gap: int
) -> None:
    """Cache ``vectors`` until ``quantity``'s next tracked step, if it is within ``max_gap``."""
    for step in range(ctx.step + 1, ctx.step + 1 + max_gap):
        if quantity.is_active(step):
            ctx.cache.put(key, vectors, expires_after=step)
            return


def warm_lanczos(
    matvec: Callable[[Tensor], Tensor],
    start: Tensor | None,
    dim: int,
    generator: torch.Generator,
    dtype: torch.dtype,
    device: torch.device,
    **options: Any,
) -> tuple[Any, Tensor]:
    """Lanczos (:func:`~cockpit_curvature._lanczos.lanczos`) from a warm or a random start.

    Args:
        matvec: ``v -> H v``.
        start: The previous step's leading Ritz vectors ``[k + 1, D]`` (:func:`cached_start`)
            or ``None`` (a random start from ``generator``).
        dim: ``D``.
        generator: The step's generator.
        dtype: Dtype of the products.
        device: Device of the products.
        **options: ``k``, ``tol``, ``max_iter``, ``basis_size`` (and ``which``) of ``lanczos``.

    Returns:
        The Lanczos result and the vectors to keep for the next step's warm start (the
        leading Ritz vectors and the next Lanczos vector).

    """
    # a warm block holds the previous k + 1 leading Ritz vectors, so the Ritz value next to
    # the wanted ones approximates the spectral gap from the first products on
    warm = start is not None and start.dim() == 2 and len(start) > options["k"]
    if start is None:
        start = torch.randn(dim, generator=generator, dtype=torch.float64)
    result = lanczos(
        matvec,
        start.to(dtype=dtype, device=device),
        generator=generator,
        gap="ritz" if warm else "converged",
        **options,
    )
    vectors = result.eigenvectors
    if result.next_vector is not None:
        vectors = torch.cat([vectors, result.next_vector])
    return result, vectors.detach()


class WarmStartedLanczos:
    """Mixin of the Lanczos quantities: top eigenpairs, warm-started from the last Ritz vectors.

    Used by ``hess_max_ev`` and ``hess_spectrum``. The vectors live in the quantity's cache under :attr:`CACHE_KEY` until its next tracked
    step, if that comes within ``warm_start_max_gap`` steps. The quantity's config has
    ``k``, ``tol``, ``max_iter``, ``basis_size``, ``warm_start`` and ``warm_start_max_gap``.
    """

    CACHE_KEY = "eigenvectors"
    config: Any

    def top_eigenpairs(
        self,
        ctx: StepContext,
        matvec: Callable[[Tensor], Tensor],
        dim: int,
        generator: torch.Generator,
        **options: Any,
    ) -> Any:
        """Run :func:`warm_lanczos` from the cached start; cache the vectors for next time.

        Args:
            ctx: The step's context (parameters, cache, step).
            matvec: ``v -> H v``.
            dim: ``D``.
            generator: The step's generator.
            **options: Further options of ``lanczos`` (``which``).

        Returns:
            The Lanczos result.

        """
        cfg = self.config
        start = self._warm_start(ctx, dim)
        ctx.cache.pop(self.CACHE_KEY)
        result, keep = warm_lanczos(
            matvec,
            start,
            dim,
            generator,
            ctx.params[0].dtype,
            ctx.params[0].device,
            k=cfg.k,
            tol=cfg.tol,
            max_iter=cfg.max_iter,
            basis_size=cfg.basis_size,
            **options,
        )
        if cfg.warm_start:
            keep_until_next_step(ctx, self, self.CACHE_KEY, keep, cfg.warm_start_max_gap)
        return result

    def _warm_start(self, ctx: StepContext, dim: int) -> Tensor | None:
        """The previous tracked step's leading Ritz vectors, if cached."""
        return cached_start(ctx, self.CACHE_KEY, dim, self.config.warm_start)


def step_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator whose stream depends on ``seed`` and ``step`` only."""
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(step)) % (2**63 - 1))
