"""Top-k eigenvalues and eigenvalue density of the mini-batch loss Hessian."""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from cockpit_core import Quantity, QuantityConfig, Requirements, StepContext
from cockpit_curvature._common import WarmStartedLanczos, native_matvec, step_generator
from cockpit_curvature._slq import PAD, broaden, slq


class HessSpectrumConfig(QuantityConfig):
    """Options of :class:`HessSpectrum`."""

    k: int = Field(5, ge=1, description="Number of largest eigenvalues to compute (top-k).")
    tol: float = Field(
        1e-4,
        gt=0,
        lt=1,
        description="Relative accuracy of the top-k: stop when every wanted eigenvalue's "
        "residual-based error bound is below tol * |eigenvalue|.",
    )
    max_iter: int = Field(
        100, ge=1, description="Most Hessian-vector products of the top-k per tracked step."
    )
    basis_size: int = Field(
        20,
        ge=3,
        description="Lanczos vectors of the top-k kept before a thick restart (memory: twice "
        "that many copies of the parameters).",
    )
    warm_start: bool = Field(
        True,
        description="Start the top-k from the k + 1 leading Ritz vectors of the previous "
        "tracked step (kept in the cache until then: k + 1 copies of the parameters).",
    )
    warm_start_max_gap: int = Field(
        1000,
        ge=1,
        description="Keep eigenvectors for a warm start only if the next tracked step is at "
        "most this many steps away.",
    )
    slq_probes: int = Field(
        4, ge=1, description="Random start vectors of stochastic Lanczos quadrature."
    )
    slq_steps: int = Field(
        20,
        ge=1,
        description="Lanczos steps (Hessian-vector products, quadrature nodes) per probe "
        "(memory: that many copies of the parameters).",
    )
    slq_distribution: Literal["rademacher", "gaussian"] = Field(
        "rademacher",
        description="Distribution of the probes: 'rademacher' (+-1 entries) or 'gaussian'; "
        "both normalized to unit length.",
    )
    grid: int = Field(256, ge=2, description="Points of the grid the density is given on.")
    sigma: float = Field(
        0.02,
        gt=0,
        le=1,
        description="Width of the Gaussian kernels that broaden the quadrature nodes, "
        "relative to the range of the spectrum.",
    )
    seed: int = Field(
        0, ge=0, description="Seed of the probes and the start vector (with the step)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> HessSpectrumConfig:
        if self.basis_size < self.k + 2:
            raise ValueError(
                f"basis_size ({self.basis_size}) must be at least k + 2 ({self.k + 2})"
            )
        needed = math.ceil((1 + 2 * PAD * self.sigma) / self.sigma) + 1
        if self.grid < needed:
            raise ValueError(
                f"grid ({self.grid}) must be at least {needed} for sigma={self.sigma}: the "
                "grid spacing must not exceed the kernel width, or the density is not resolved"
            )
        return self


class HessSpectrum(WarmStartedLanczos, Quantity):
    """Top-k eigenvalues and eigenvalue density of the Hessian ``H`` of the mini-batch loss.

    Top-k: Lanczos iteration with full reorthogonalization and thick restarts (Lanczos,
    1950; Wu & Simon, 2000), warm-started from the previous tracked step's ``k + 1`` leading
    Ritz vectors, with the residual-based stopping rule of ``hess_max_ev``.

    Density: stochastic Lanczos quadrature (Lin, Saad & Yang, 2016; Ghorbani, Krishnan &
    Xiao, 2019). For each of ``n`` unit probes ``v`` (``E[v v^T] = I / D``), ``m`` Lanczos
    steps give ``T_m = S diag(theta) S^T``; nodes ``theta_j`` with weights ``S_1j^2 / n``
    estimate the spectral measure ``(1/D) sum_i delta(t - lambda_i)``, and

        phi(t) = sum_l w_l exp(-(t - theta_l)^2 / (2 s^2)) / (s sqrt(2 pi))

    on a grid, with ``s = sigma * (lambda_max - lambda_min)``. One Hessian-vector product
    (Pearlmutter, 1994) per Lanczos step.
    """

    name = "hess_spectrum"
    Config = HessSpectrumConfig
    REQUIREMENTS = Requirements(info=frozenset({"loss"}), loss_graph=True)

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"top", "nodes", "weights", "grid", "density", "sigma", "hvps", "converged"}``.

        ``top``: the ``k`` largest eigenvalues, descending; ``nodes``/``weights``: the SLQ
        rule (``slq_probes * slq_steps`` entries, probe after probe, weights summing to 1);
        ``grid``/``density``: the broadened density; ``sigma``: the absolute kernel width;
        ``hvps``: Hessian-vector products used; ``converged``: whether the top-k met ``tol``
        within ``max_iter`` products.
        """
        cfg = self.config
        params = ctx.params
        dtype, device = params[0].dtype, params[0].device
        gen = step_generator(cfg.seed, ctx.step)
        dim = sum(p.numel() for p in params)

        matvec = native_matvec(ctx)
        # probes first: their random numbers do not depend on a warm or cold start
        quad = slq(
            matvec, dim, cfg.slq_probes, cfg.slq_steps, cfg.slq_distribution, gen, dtype, device
        )
        result = self.top_eigenpairs(ctx, matvec, dim, gen)
        top = np.asarray(result.eigenvalues, dtype=np.float64)
        grid, density, sigma = broaden(quad.nodes, quad.weights, cfg.sigma, cfg.grid, also=top)
        return {
            "top": top,
            "nodes": quad.nodes,
            "weights": quad.weights,
            "grid": grid,
            "density": density,
            "sigma": float(sigma),
            "hvps": int(quad.matvecs + result.matvecs),
            "converged": bool(result.converged),
        }
