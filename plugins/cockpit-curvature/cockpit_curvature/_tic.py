"""Shared base of the Takeuchi information criterion quantities ``tic_diag`` and ``tic_trace``."""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
from pydantic import Field
from torch import Tensor

from cockpit_core import (
    SUM_GRAD_SQUARED,
    Quantity,
    QuantityConfig,
    Requirements,
    StepContext,
)
from cockpit_curvature._common import (
    curvature_statistic,
    hessian_matvec,
    read_diagonal,
    step_generator,
    warn_if_uncalibrated,
)
from cockpit_curvature._estimators import (
    CALIBRATED_MIN_PRODUCTS,
    DIAG_ESTIMATORS,
    DiagEstimate,
    error_bars_calibrated,
)
from cockpit_curvature._options import alias_validator, options_validator

_HINT = (
    "TIC needs a curvature diagonal: from BackPACK on the modules it supports, from the "
    "autodiff provider on any model (pip install cockpit-autodiff; cp.attach(model, loss_fn) "
    "and info['inputs'], info['targets']; exact, one Hessian-vector product per parameter "
    "entry), or estimated from Hessian-vector products on any model, with error bars: "
    "curvature='hutchinson' (probes=S, S products; standard error of entry j: "
    "sqrt(sum_{l != j} H_jl^2 / S)) or curvature='xdiag' (probes=m, m products, default "
    f"{CALIBRATED_MIN_PRODUCTS}; error O(1/m) in the part of H outside its top m/2 "
    "eigenvectors, best when the spectrum decays; error bars only from "
    f"{CALIBRATED_MIN_PRODUCTS} products). The TIC divides by the diagonal: check its "
    "std_error. hess_trace with "
    "method='hutchinson' and hess_max_ev need no diagonal."
)

_MIN_PROBES = {"hutchinson": 1, "xdiag": 4}
"""Fewest products each diagonal estimator can work with."""


class TICConfig(QuantityConfig):
    """Options of the TIC quantities."""

    curvature: Literal["diag_hessian", "diag_ggn_exact", "diag_ggn_mc", "hutchinson", "xdiag"] = (
        Field(
            "diag_hessian",
            description="Curvature diagonal: 'diag_hessian' (exact Hessian diagonal; Cockpit "
            "1.0.2's default, alias 'diag_h'; entries can be negative), 'diag_ggn_exact' or "
            "'diag_ggn_mc' (generalized Gauss-Newton, never negative), or the Hessian "
            "diagonal estimated from Hessian-vector products (any model; with error bars): "
            "'hutchinson' (Rademacher probes z, mean of z * Hz) or 'xdiag' (XDiag: low-rank "
            "sketch plus Hutchinson on the rest, every probe used for both).",
        )
    )
    mc_samples: int = Field(1, ge=1, description="Monte-Carlo samples of curvature='diag_ggn_mc'.")
    probes: int | None = Field(
        None,
        ge=1,
        description="Hessian-vector products of curvature='hutchinson' (one per probe; at "
        "least 2 for an error bar) or 'xdiag' (at least 4; an even number is used; error "
        f"bars only from {CALIBRATED_MIN_PRODUCTS}). Not set: {CALIBRATED_MIN_PRODUCTS} for "
        "'xdiag', 10 for 'hutchinson'.",
    )
    seed: int = Field(
        0,
        ge=0,
        description="Seed of the probes of 'hutchinson' and 'xdiag' (combined with the step "
        "number).",
    )
    epsilon: float = Field(
        1e-7, ge=0, description="Added to the curvature before dividing (Cockpit 1.0.2: 1e-7)."
    )
    negative_curvature: Literal["keep", "abs", "exclude"] = Field(
        "keep",
        description="Curvature entries below zero (possible with 'diag_hessian' and the "
        "estimators): 'keep' them (Cockpit 1.0.2; the TIC can then be negative or huge), use "
        "their absolute value ('abs'), or 'exclude' them (and their gradient moments) from "
        "the sums.",
    )

    _alias = alias_validator("curvature")
    _options_match_curvature = options_validator("curvature", _MIN_PROBES)


class TICBase(Quantity):
    """Reads the gradient second moment and the curvature diagonal; subclasses combine them.

    Thomas et al. (2020), "On the interplay between noise and curvature and its effect on
    optimization and generalization" (AISTATS), approximate the Takeuchi information
    criterion ``tr(H^-1 C)`` with ``C = (1/B) sum_n g_n g_n^T`` the uncentred second moment
    of the per-sample gradients ``g_n`` and ``H`` the curvature.

    With an estimated diagonal ``h`` (``curvature='hutchinson'`` or ``'xdiag'``) the value
    ``f(h)`` gets a first-order (delta-method) standard error: ``f(h) ~ f(h*) + w^T (h -
    h*)`` with ``w = grad f(h)``, and ``w^T h`` is the mean of ``w^T x_i`` over the
    estimator's samples ``x_i``, so its standard error is theirs (covariances between
    entries included). XDiag's error bars are reported only from
    ``CALIBRATED_MIN_PRODUCTS`` (24) products on (measured off by more than 20% below):
    with fewer ``probes`` the errors are ``None`` and the constructor warns; ``probes``
    defaults to 24 for ``xdiag``. Subclasses implement :meth:`combine`, in which
    ``per_param[b]`` may depend only on block ``b``.
    """

    Config = TICConfig
    config: TICConfig

    def __init__(self, config: Any = None, **kwargs: Any):
        super().__init__(config, **kwargs)
        cfg = self.config
        if cfg.curvature in DIAG_ESTIMATORS:
            assert cfg.probes is not None, "the config validator fills in the estimator's probes"
            warn_if_uncalibrated(
                self.key, "curvature", cfg.curvature, cfg.probes, "curvature='hutchinson'"
            )

    def requirements(self) -> Requirements:
        """Per-sample ``sum_n g_n^2`` and the curvature diagonal (or the loss graph)."""
        cfg = self.config
        if cfg.curvature in DIAG_ESTIMATORS:
            return Requirements(
                statistics=(SUM_GRAD_SQUARED,), info=frozenset({"loss"}), loss_graph=True
            )
        return Requirements(
            statistics=(SUM_GRAD_SQUARED, curvature_statistic(cfg.curvature, cfg.mc_samples))
        )

    def combine(self, pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, list[Tensor]]:
        """``(total, per_param)`` from flat ``(m, h)`` per parameter (differentiable in ``h``)."""
        raise NotImplementedError

    def values(
        self, moments: list[Tensor], curvatures: list[Tensor]
    ) -> tuple[Tensor, list[Tensor]]:
        """:meth:`combine` after the ``negative_curvature`` guard, from flat float64 parts."""
        option = self.config.negative_curvature
        pairs = []
        for moment, curv in zip(moments, curvatures):
            if option == "abs":
                curv = curv.abs()
            elif option == "exclude":
                keep = curv.detach() >= 0
                moment, curv = moment[keep], curv[keep]
            pairs.append((moment, curv))
        return self.combine(pairs)

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total", "per_param"}``; the estimators add error bars and ``hvps``.

        The error bars are ``None`` for XDiag below ``CALIBRATED_MIN_PRODUCTS`` products.
        """
        cfg = self.config
        if cfg.curvature not in DIAG_ESTIMATORS:
            stat = curvature_statistic(cfg.curvature, cfg.mc_samples)
            diagonal = read_diagonal(ctx, stat, self.key, _HINT)  # first: its error has the hint
            moments = self._moments(ctx)
            total, per_param = self.values(moments, [d.reshape(-1).double() for d in diagonal])
            return self.as_output(total, per_param)
        moments = self._moments(ctx)
        estimator = DIAG_ESTIMATORS[cfg.curvature]
        gen = step_generator(cfg.seed, ctx.step)
        dim = sum(m.numel() for m in moments)
        assert cfg.probes is not None, "the config validator fills in the estimator's probes"
        estimate = estimator(hessian_matvec(ctx), dim, cfg.probes, gen)
        return self.with_error_bars(estimate, [m.cpu() for m in moments])

    @staticmethod
    def _moments(ctx: StepContext) -> list[Tensor]:
        """Flat float64 ``m = (1/B) sum_n g_n^2`` per parameter."""
        return [sgs.reshape(-1).double() / ctx.batch_size for sgs in ctx.stat(SUM_GRAD_SQUARED)]

    def with_error_bars(self, estimate: DiagEstimate, moments: list[Tensor]) -> dict[str, Any]:
        """The output from an estimated diagonal, with delta-method standard errors.

        Args:
            estimate: The Hessian diagonal over all parameters (flat, float64, CPU).
            moments: Flat float64 CPU ``m`` per parameter.

        Returns:
            ``{"total", "per_param", "std_error", "std_error_per_param", "hvps"}``; both
            errors ``None`` when the configured estimator's error bars are not calibrated
            (:func:`~cockpit_curvature._estimators.error_bars_calibrated`).

        """
        cfg = self.config
        sizes = [m.numel() for m in moments]
        # only reached for the randomized estimators, whose probes the validator filled in
        if not error_bars_calibrated(cfg.curvature, cast(int, cfg.probes)):
            total, per_param = self.values(moments, list(torch.split(estimate.diagonal, sizes)))
            out = self.as_output(total, per_param)
            out.update(std_error=None, std_error_per_param=None, hvps=estimate.hvps)
            return out
        with torch.enable_grad():
            curvature = estimate.diagonal.detach().requires_grad_(True)
            total, per_param = self.values(moments, list(torch.split(curvature, sizes)))
            parts = torch.stack(per_param)
            (w_total,) = torch.autograd.grad(
                total, curvature, retain_graph=True, materialize_grads=True
            )
            # per_param[b] depends on block b only: one gradient holds every block's weights
            (w_parts,) = torch.autograd.grad(parts.sum(), curvature, materialize_grads=True)
        out = self.as_output(total.detach(), list(parts.detach()))
        out["std_error"] = float(estimate.std_error_of(w_total))
        out["std_error_per_param"] = estimate.std_error_of(w_parts, sizes).numpy()
        out["hvps"] = estimate.hvps
        return out

    @staticmethod
    def as_output(total: Tensor, per_param: list[Tensor]) -> dict[str, Any]:
        """``{"total": float, "per_param": np.ndarray}``."""
        return {"total": float(total), "per_param": torch.stack(per_param).cpu().numpy()}
