"""Trace of the Hessian (or of a Gauss-Newton approximation), per parameter and in total."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator

from cockpit_core import Quantity, QuantityConfig, Requirements, StepContext
from cockpit_curvature._common import (
    curvature_statistic,
    normalize_curvature,
    read_diagonal,
    split_like,
    step_generator,
    total_and_per_param,
)

_HINT = "use method='hutchinson', which needs only Hessian-vector products."


class HessTraceConfig(QuantityConfig):
    """Options of :class:`HessTrace`."""

    method: Literal["diag_hessian", "diag_ggn_exact", "diag_ggn_mc", "hutchinson"] = Field(
        "diag_hessian",
        description="How the trace is obtained: 'diag_hessian' (exact Hessian diagonal, "
        "BackPACK DiagHessian; Cockpit 1.0.2's default, alias 'diag_h'), 'diag_ggn_exact' / "
        "'diag_ggn_mc' (diagonal of the generalized Gauss-Newton matrix, exact or Monte-Carlo), "
        "or 'hutchinson' (Rademacher probes and Hessian-vector products; any model).",
    )
    mc_samples: int = Field(1, ge=1, description="Monte-Carlo samples of method='diag_ggn_mc'.")
    probes: int = Field(
        10, ge=1, description="Rademacher probes (one Hessian-vector product each) of 'hutchinson'."
    )
    seed: int = Field(
        0, ge=0, description="Seed of the 'hutchinson' probes (combined with the step number)."
    )

    @field_validator("method", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        return normalize_curvature(value)

    @model_validator(mode="after")
    def _options_match_method(self) -> HessTraceConfig:
        if "mc_samples" in self.model_fields_set and self.method != "diag_ggn_mc":
            raise ValueError("mc_samples applies only to method='diag_ggn_mc'")
        for opt in ("probes", "seed"):
            if opt in self.model_fields_set and self.method != "hutchinson":
                raise ValueError(f"{opt} applies only to method='hutchinson'")
        return self


class HessTrace(Quantity):
    """Trace of the Hessian of the mini-batch loss, ``tr(H) = sum_i tr(H_ii)`` over blocks.

    ``H_ii`` is the diagonal block of parameter ``i``. The exact methods sum a curvature
    diagonal computed by BackPACK during the backward pass (Dangel et al., 2020,
    "BackPACK: Packing more into backprop"): the Hessian's (``diag_hessian``, as Cockpit
    1.0.2) or the generalized Gauss-Newton matrix's (``diag_ggn_exact``; ``diag_ggn_mc``
    samples it). ``hutchinson`` needs no BackPACK support (Hutchinson, 1989, "A stochastic
    estimator of the trace of the influence matrix"): with Rademacher probes ``v`` (entries
    +-1), ``E[v_i^T (H v)_i] = tr(H_ii)``, so::

        tr(H_ii) ~ (1 / S) sum_s v_s,i^T (H v_s)_i

    with ``S`` probes, one Hessian-vector product each, shared by all blocks.
    """

    name = "hess_trace"
    Config = HessTraceConfig

    def requirements(self) -> Requirements:
        """A curvature statistic, or the loss graph for ``hutchinson``."""
        cfg = self.config
        if cfg.method == "hutchinson":
            return Requirements(info={"loss"}, loss_graph=True)
        return Requirements(statistics=(curvature_statistic(cfg.method, cfg.mc_samples),))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return ``{"total": tr, "per_param": [tr(H_ii)]}``."""
        cfg = self.config
        if cfg.method == "hutchinson":
            return total_and_per_param(self._hutchinson(ctx))
        stat = curvature_statistic(cfg.method, cfg.mc_samples)
        diagonal = read_diagonal(ctx, stat, self.key, _HINT)
        return total_and_per_param([d.double().sum() for d in diagonal])

    def _hutchinson(self, ctx: StepContext) -> list[torch.Tensor]:
        gen = step_generator(self.config.seed, ctx.step)
        sums = torch.zeros(len(ctx.params), dtype=torch.float64)
        dim = sum(p.numel() for p in ctx.params)
        for _ in range(self.config.probes):
            signs = torch.randint(0, 2, (dim,), generator=gen).to(torch.float64) * 2 - 1
            probe = split_like(signs, ctx.params)
            probe = [v.to(dtype=p.dtype, device=p.device) for v, p in zip(probe, ctx.params)]
            hv = ctx.hvp(probe)
            sums += torch.stack([(v * h).sum().double().cpu() for v, h in zip(probe, hv)])
        return list(sums / self.config.probes)
