"""Largest eigenvalue(s) of the mini-batch loss Hessian, from Hessian-vector products."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from cockpit_core import Quantity, QuantityConfig, Requirements, StepContext
from cockpit_curvature._common import WarmStartedLanczos, native_matvec, step_generator


class HessMaxEVConfig(QuantityConfig):
    """Options of :class:`HessMaxEV`."""

    which: Literal["largest_algebraic", "largest_magnitude"] = Field(
        "largest_algebraic",
        description="'largest_algebraic': the largest eigenvalues (most positive); "
        "'largest_magnitude': the eigenvalues of largest absolute value, signed (what "
        "Cockpit 1.0.2's power iteration approximates).",
    )
    k: int = Field(1, ge=1, description="Number of eigenvalues to compute (top-k).")
    tol: float = Field(
        1e-4,
        gt=0,
        lt=1,
        description="Relative accuracy: stop when every wanted eigenvalue's residual-based "
        "error bound is below tol * |eigenvalue|.",
    )
    max_iter: int = Field(100, ge=1, description="Most Hessian-vector products per tracked step.")
    basis_size: int = Field(
        20,
        ge=3,
        description="Lanczos vectors kept before a thick restart (memory: twice that many "
        "copies of the parameters, the vectors and their Hessian-vector products).",
    )
    warm_start: bool = Field(
        True,
        description="Start from the k + 1 leading Ritz vectors of the previous tracked step "
        "(kept in the cache until then: k + 1 copies of the parameters).",
    )
    warm_start_max_gap: int = Field(
        1000,
        ge=1,
        description="Keep eigenvectors for a warm start only if the next tracked step is at "
        "most this many steps away.",
    )
    seed: int = Field(0, ge=0, description="Seed of the random start vector (with the step).")

    @model_validator(mode="after")
    def _basis_holds_k(self) -> HessMaxEVConfig:
        if self.basis_size < self.k + 2:
            raise ValueError(
                f"basis_size ({self.basis_size}) must be at least k + 2 ({self.k + 2})"
            )
        return self


class HessMaxEV(WarmStartedLanczos, Quantity):
    """Largest eigenvalue(s) of the Hessian ``H`` of the mini-batch loss.

    Computed by Lanczos iteration (Lanczos, 1950) with full reorthogonalization and thick
    restarts (Wu & Simon, 2000), using one Hessian-vector product ``H v`` per iteration
    (Pearlmutter, 1994, "Fast exact multiplication by the Hessian"). A Ritz pair
    ``(theta, x)`` has residual ``rho = ||H x - theta x||`` for free; the iteration stops
    when the Kato-Temple error bound ``min(rho, rho^2 / delta) <= tol * |theta|`` holds
    (``delta``: the gap to the rest of the spectrum) for each wanted eigenvalue, or after
    ``max_iter`` products.

    Cold start: a random vector; ``delta`` is taken from the nearest other Ritz value once
    that one has converged. Warm start (``warm_start``): a Rayleigh-Ritz step on the ``k + 1``
    leading Ritz vectors of the previous tracked step (``k + 1`` products), then Lanczos
    from there (an augmented Krylov space, Morgan, 1996). Because the block already holds an
    approximation of the next eigenvector, ``delta`` is taken from the nearest other Ritz
    value at once, which saves the products needed to resolve it. The core cache keeps the
    vectors until the next tracked step only.
    """

    name = "hess_max_ev"
    Config = HessMaxEVConfig
    REQUIREMENTS = Requirements(info=frozenset({"loss"}), loss_graph=True)

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"value", "eigenvalues", "hvps", "converged"}``.

        ``value`` is the most wanted eigenvalue (a float), ``eigenvalues`` the ``k`` wanted
        ones (most wanted first), ``hvps`` the Hessian-vector products this quantity used,
        ``converged`` whether the tolerance was met within ``max_iter`` products.
        """
        cfg = self.config
        gen = step_generator(cfg.seed, ctx.step)
        dim = sum(p.numel() for p in ctx.params)
        result = self.top_eigenpairs(ctx, native_matvec(ctx), dim, gen, which=cfg.which)
        values = np.asarray(result.eigenvalues, dtype=np.float64)
        return {
            "value": float(values[0]),
            "eigenvalues": values,
            "hvps": int(result.matvecs),
            "converged": bool(result.converged),
        }
