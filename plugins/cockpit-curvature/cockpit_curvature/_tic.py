"""Shared base of the Takeuchi information criterion quantities ``tic_diag`` and ``tic_trace``."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator
from torch import Tensor

from cockpit_core import (
    SUM_GRAD_SQUARED,
    Quantity,
    QuantityConfig,
    Requirements,
    StepContext,
)
from cockpit_curvature._common import (
    DiagCurvature,
    curvature_statistic,
    normalize_curvature,
    read_diagonal,
)

_HINT = (
    "TIC needs a curvature diagonal: from BackPACK on the modules it supports, or from the "
    "autodiff provider on any model (pip install cockpit-autodiff; cp.attach(model, loss_fn) "
    "and info['inputs'], info['targets']); hess_trace with method='hutchinson' and "
    "hess_max_ev work without either."
)


class TICConfig(QuantityConfig):
    """Options of the TIC quantities."""

    curvature: DiagCurvature = Field(
        "diag_hessian",
        description="Curvature diagonal: 'diag_hessian' (exact Hessian diagonal; Cockpit "
        "1.0.2's default, alias 'diag_h'; entries can be negative), 'diag_ggn_exact' or "
        "'diag_ggn_mc' (generalized Gauss-Newton, never negative).",
    )
    mc_samples: int = Field(1, ge=1, description="Monte-Carlo samples of curvature='diag_ggn_mc'.")
    epsilon: float = Field(
        1e-7, ge=0, description="Added to the curvature before dividing (Cockpit 1.0.2: 1e-7)."
    )
    negative_curvature: Literal["keep", "abs", "exclude"] = Field(
        "keep",
        description="Curvature entries below zero (possible with 'diag_hessian'): 'keep' them "
        "(Cockpit 1.0.2; the TIC can then be negative or huge), use their absolute value "
        "('abs'), or 'exclude' them (and their gradient moments) from the sums.",
    )

    @field_validator("curvature", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        return normalize_curvature(value)

    @model_validator(mode="after")
    def _mc_samples_match(self) -> TICConfig:
        if "mc_samples" in self.model_fields_set and self.curvature != "diag_ggn_mc":
            raise ValueError("mc_samples applies only to curvature='diag_ggn_mc'")
        return self


class TICBase(Quantity):
    """Reads the gradient second moment and the curvature diagonal; subclasses combine them.

    Thomas et al. (2020), "On the interplay between noise and curvature and its effect on
    optimization and generalization" (AISTATS), approximate the Takeuchi information
    criterion ``tr(H^-1 C)`` with ``C = (1/B) sum_n g_n g_n^T`` the uncentred second moment
    of the per-sample gradients ``g_n`` and ``H`` the curvature.
    """

    Config = TICConfig

    def requirements(self) -> Requirements:
        """Per-sample ``sum_n g_n^2`` and the configured curvature diagonal."""
        cfg = self.config
        return Requirements(
            statistics=(SUM_GRAD_SQUARED, curvature_statistic(cfg.curvature, cfg.mc_samples))
        )

    def moments_and_curvature(self, ctx: StepContext) -> list[tuple[Tensor, Tensor]]:
        """Per parameter: flat ``m = (1/B) sum_n g_n^2`` and the guarded curvature diagonal."""
        cfg = self.config
        stat = curvature_statistic(cfg.curvature, cfg.mc_samples)
        diagonal = read_diagonal(ctx, stat, self.key, _HINT)
        second = ctx.stat(SUM_GRAD_SQUARED)
        batch_size = ctx.batch_size
        out = []
        for sgs, curv in zip(second, diagonal):
            moment = sgs.reshape(-1).double() / batch_size
            curv = curv.reshape(-1).double()
            if cfg.negative_curvature == "abs":
                curv = curv.abs()
            elif cfg.negative_curvature == "exclude":
                keep = curv >= 0
                moment, curv = moment[keep], curv[keep]
            out.append((moment, curv))
        return out

    @staticmethod
    def as_output(total: Tensor, per_param: list[Tensor]) -> dict[str, Any]:
        """``{"total": float, "per_param": np.ndarray}``."""
        return {"total": float(total), "per_param": torch.stack(per_param).cpu().numpy()}
