"""Trace of the Hessian (or of a Gauss-Newton approximation), per parameter and in total."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cockpit_core import Quantity, QuantityConfig, Requirements, StepContext
from cockpit_curvature._common import (
    curvature_statistic,
    hessian_matvec,
    read_diagonal,
    step_generator,
    total_and_per_param,
    warn_if_uncalibrated,
)
from cockpit_curvature._estimators import (
    CALIBRATED_MIN_PRODUCTS,
    ESTIMATORS,
    error_bars_calibrated,
)
from cockpit_curvature._options import alias_validator, options_validator

_HINT = "use method='hutchinson', which needs only Hessian-vector products."

_MIN_PROBES = {"hutchinson": 1, "hutchpp": 3, "xtrace": 4}
"""Fewest products each stochastic method can work with."""


class HessTraceConfig(QuantityConfig):
    """Options of :class:`HessTrace`."""

    method: Literal[
        "diag_hessian", "diag_ggn_exact", "diag_ggn_mc", "hutchinson", "hutchpp", "xtrace"
    ] = Field(
        "diag_hessian",
        description="How the trace is obtained: 'diag_hessian' (exact Hessian diagonal, "
        "from BackPACK or, on any model, cockpit-autodiff; Cockpit 1.0.2's default, alias "
        "'diag_h'), 'diag_ggn_exact' / 'diag_ggn_mc' (diagonal of the generalized Gauss-Newton matrix, exact or Monte-Carlo), "
        "or a randomized estimator from Hessian-vector products (any model; with error bars): "
        "'hutchinson' (Rademacher probes), 'hutchpp' (Hutch++: low-rank sketch plus "
        "Hutchinson on the rest) or 'xtrace' (XTrace: exchangeable leave-one-out Hutch++).",
    )
    mc_samples: int = Field(1, ge=1, description="Monte-Carlo samples of method='diag_ggn_mc'.")
    probes: int | None = Field(
        None,
        ge=1,
        description="Hessian-vector products of 'hutchinson' (one per probe), 'hutchpp' (at "
        "least 3: a third sketch, a third its basis, the rest probes) or 'xtrace' (at least 4; "
        "an even number is used; error bars only from "
        f"{CALIBRATED_MIN_PRODUCTS}). Not set: {CALIBRATED_MIN_PRODUCTS} for 'xtrace', 10 "
        "for the others.",
    )
    seed: int = Field(
        0,
        ge=0,
        description="Seed of the probes of 'hutchinson', 'hutchpp' and 'xtrace' (combined with "
        "the step number).",
    )

    _alias = alias_validator("method")
    _options_match_method = options_validator("method", _MIN_PROBES)


class HessTrace(Quantity):
    """Trace of the Hessian of the mini-batch loss, ``tr(H) = sum_i tr(H_ii)`` over blocks.

    ``H_ii`` is the diagonal block of parameter ``i``. The exact methods sum a curvature
    diagonal computed by BackPACK during the backward pass (Dangel et al., 2020,
    "BackPACK: Packing more into backprop"): the Hessian's (``diag_hessian``, as Cockpit
    1.0.2) or the generalized Gauss-Newton matrix's (``diag_ggn_exact``; ``diag_ggn_mc``
    samples it). The randomized methods need no BackPACK support, only Hessian-vector
    products on the flat vector of all tracked parameters, and report error bars
    (``std_error``, ``std_error_per_param``) and their cost (``hvps``). XTrace's error
    bars are reported only from ``CALIBRATED_MIN_PRODUCTS`` (24) products on (measured off
    by more than 20% below, :mod:`cockpit_curvature._estimators.base`): with fewer ``probes``
    they are ``None`` and the constructor warns; ``probes`` defaults to 24 for ``xtrace``.

    - ``hutchinson`` (Hutchinson, 1989, "A stochastic estimator of the trace of the
      influence matrix"): with Rademacher probes ``v`` (entries +-1),
      ``E[v_i^T (H v)_i] = tr(H_ii)``, so ``tr(H_ii) ~ (1 / S) sum_s v_s,i^T (H v_s)_i``
      with ``S`` probes, one Hessian-vector product each, shared by all blocks.
    - ``hutchpp`` (Meyer et al., 2021, "Hutch++: Optimal stochastic trace estimation"):
      ``tr(H) = tr(Q^T H Q) + tr(P H P)`` with ``Q = orth(H S)`` from a sketch ``S`` and
      ``P = I - Q Q^T``; the first term exactly, the second with Hutchinson.
    - ``xtrace`` (Epperly, Tropp & Webber, 2024, "XTrace: Making the most of every sample
      in stochastic trace estimation"): the mean of the Hutch++ estimates that leave each
      probe out of the sketch and use it for the correction.

    See :mod:`cockpit_curvature._estimators` for the formulas.
    """

    name = "hess_trace"
    Config = HessTraceConfig
    config: HessTraceConfig

    def __init__(self, config: Any = None, **kwargs: Any):
        super().__init__(config, **kwargs)
        cfg = self.config
        if cfg.method in _MIN_PROBES:
            assert cfg.probes is not None, "the config validator fills in the method's probes"
            warn_if_uncalibrated(self.key, "method", cfg.method, cfg.probes, "method='hutchpp'")

    def requirements(self) -> Requirements:
        """A curvature statistic, or the loss graph for the randomized methods."""
        cfg = self.config
        if cfg.method in _MIN_PROBES:
            return Requirements(info=frozenset({"loss"}), loss_graph=True)
        return Requirements(statistics=(curvature_statistic(cfg.method, cfg.mc_samples),))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": tr, "per_param": [tr(H_ii)]}``, plus error bars and cost.

        The randomized methods add ``std_error`` (of ``total``), ``std_error_per_param``
        and ``hvps`` (Hessian-vector products used); both errors are ``None`` for XTrace
        below ``CALIBRATED_MIN_PRODUCTS`` products.
        """
        cfg = self.config
        if cfg.method in _MIN_PROBES:
            estimator = ESTIMATORS[cfg.method]
            sizes = [p.numel() for p in ctx.params]
            gen = step_generator(cfg.seed, ctx.step)
            assert cfg.probes is not None, "the config validator fills in the method's probes"
            est = estimator(hessian_matvec(ctx), sizes, cfg.probes, gen)
            out = total_and_per_param(list(est.per_param))
            calibrated = error_bars_calibrated(cfg.method, cfg.probes)
            out["std_error"] = est.std_error if calibrated else None
            out["std_error_per_param"] = est.std_error_per_param if calibrated else None
            out["hvps"] = est.hvps
            return out
        stat = curvature_statistic(cfg.method, cfg.mc_samples)
        diagonal = read_diagonal(ctx, stat, self.key, _HINT)
        return total_and_per_param([d.double().sum() for d in diagonal])
