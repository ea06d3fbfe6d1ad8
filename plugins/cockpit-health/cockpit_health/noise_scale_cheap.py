"""Simple gradient noise scale from micro-batch gradients (McCandlish et al., 2018, App. A)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from pydantic import Field

from cockpit_core import (
    CockpitWarning,
    MisuseError,
    Quantity,
    QuantityConfig,
    Requirements,
    StepContext,
)
from cockpit_health.noise_scale import b_simple_ratio

ONE_MICRO_BATCH = (
    "the estimate needs the gradients of at least two micro-batches (two batch sizes), and "
    "this step had one micro-batch on one process: accumulate gradients over several "
    "micro-batches (cp(step, accumulate=True) with run.micro_batch(...)), train on several "
    "processes, or track noise_scale (per-sample statistics) instead"
)

CONSISTENCY = 1e-5
"""Relative tolerance of ``sum_m b_m |g_m|^2 - N |g|^2 >= 0`` (float32 norms: ~1e-7 each)."""


class NoiseScaleCheapConfig(QuantityConfig):
    """Options of :class:`NoiseScaleCheap`."""

    ema: float = Field(
        0.95,
        ge=0.0,
        lt=1.0,
        description="Factor beta of the exponential moving averages of trace_cov and grad_sq "
        "over the tracked steps (bias-corrected); their ratio is b_simple_ema. 0: no "
        "averages.",
    )


class NoiseScaleCheap(Quantity):
    """Simple gradient noise scale ``B_simple = tr(Sigma) / |G|^2`` from micro-batch gradients.

    The estimator of McCandlish, Kaplan, Amodei et al. (2018), "An Empirical Model of
    Large-Batch Training", Appendix A, from gradient norms at two batch sizes; it needs no
    per-sample statistics, only the norm of each micro-batch's own gradient, which the core
    records during its backward pass (``Requirements(micro_batch_norms=True)``). The small
    batches are the step's ``M`` micro-batches of all processes (gradient accumulation, or
    each process's local batch under ``torch.distributed``), the big one their union.

    With micro-batch ``m`` of ``b_m`` samples, ``g_m`` the gradient of its mean loss,
    ``N = sum_m b_m`` and ``g = sum_m (b_m / N) g_m`` the step's gradient, and samples drawn
    independently (``E|g_m|^2 = |G|^2 + tr(Sigma) / b_m``):

        trace_cov = S       = (sum_m b_m |g_m|^2 - N |g|^2) / (M - 1)
                            = sum_m b_m |g_m - g|^2 / (M - 1),
        grad_sq   = |G|^2est = |g|^2 - S / N,
        b_simple  = S / |G|^2est.

    Both ``S`` and ``|G|^2est`` are unbiased for any micro-batch sizes, equal or not:
    ``E[sum_m b_m |g_m|^2] = N |G|^2 + M tr(Sigma)`` and ``E[N |g|^2] = N |G|^2 +
    tr(Sigma)``, so the numerator of ``S`` has the mean ``(M - 1) tr(Sigma)``. They are Appendix A's two-batch-size estimators with
    ``B_big = N`` and ``B_small = N / M`` (the mean micro-batch size; for equal micro-batches
    exactly ``b``) when ``|G_small|^2`` is the sample-weighted mean
    ``sum_m (b_m / N) |g_m|^2``; with one sample per micro-batch they are ``noise_scale``'s.
    ``S`` is clamped at 0 (negative only by rounding; a numerator below ``-1e-5`` times its
    terms means that ``p.grad`` is not the sum of the micro-batches' contributions, e.g.
    gradients not zeroed before the step, and raises); ``b_simple`` is ``inf`` where
    ``|G|^2est <= 0`` (``nan`` if also ``S = 0``).

    At one step ``S`` rests on ``M - 1`` degrees of freedom, so ``b_simple`` is very noisy:
    as the paper recommends, average ``S`` and ``|G|^2`` over steps before dividing. With
    ``ema = beta > 0`` the outputs also hold bias-corrected exponential moving averages
    over the tracked steps (``a_t = beta a_(t-1) + (1 - beta) x_t``, divided by
    ``1 - beta^t``) and their ratio ``b_simple_ema``.

    One micro-batch on one process gives no second batch size: the estimates are NaN and
    ``reason`` says why (a :class:`~cockpit_core.CockpitWarning` once); the averages keep
    their last values; training goes on. Sums run in float64.

    Output: ``{"b_simple", "trace_cov", "grad_sq", "batch_size" (N), "micro_batch_size"
    (N / M), "micro_batches" (M), "reason" ("" when defined)}``, plus ``"b_simple_ema",
    "trace_cov_ema", "grad_sq_ema"`` when ``ema > 0``.
    """

    name = "noise_scale_cheap"
    Config = NoiseScaleCheapConfig
    config: NoiseScaleCheapConfig
    REQUIREMENTS = Requirements(info=frozenset({"batch_size"}), micro_batch_norms=True)
    _warned = False  # about a step with one micro-batch (once per instance)

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """Return the estimates and the batch sizes they come from."""
        norms = ctx.micro_batch_norms
        sizes = norms.samples
        if any(b <= 0 for b in sizes):
            raise MisuseError(
                f"'{self.key}' weights each micro-batch by its size, which cockpit does not "
                "know for some micro-batch: pass run.micro_batch({'batch_size': b, ...}) (or "
                "its individual_losses)."
            )
        n, m = sum(sizes), len(sizes)
        if n != ctx.batch_size:
            raise MisuseError(
                f"'{self.key}': the micro-batches held {n} samples but the step's batch size "
                f"is {ctx.batch_size}: wrap every micro-batch's backward() in "
                "run.micro_batch(...) and pass the step's total batch size."
            )
        small = norms.grad_sq().sum(1)  # |g_m|^2, [M]
        device = small.device
        big = sum(
            (torch.linalg.vector_norm(g, dtype=torch.float64).to(device) ** 2 for g in ctx.grads),
            start=torch.zeros((), dtype=torch.float64, device=device),
        )
        out: dict[str, Any] = {"batch_size": n, "micro_batch_size": n / m, "micro_batches": m}
        if m < 2:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"cockpit: '{self.key}': {ONE_MICRO_BATCH}.", CockpitWarning, stacklevel=2
                )
            out.update(b_simple=math.nan, trace_cov=math.nan, grad_sq=math.nan)
            out["reason"] = ONE_MICRO_BATCH
        else:
            weights = torch.tensor(sizes, dtype=torch.float64, device=device)
            spread = weights @ small - n * big  # sum_m b_m |g_m - g|^2 >= 0
            if float(spread) < -CONSISTENCY * float(weights @ small + n * big):
                raise MisuseError(
                    f"'{self.key}': the step's gradient is not the sum of its micro-batches' "
                    "contributions (|g|^2 exceeds what they allow): zero the gradients before "
                    "the step (optimizer.zero_grad()) and run every backward() of the step "
                    "inside run.micro_batch(...)."
                )
            trace = (spread / (m - 1)).clamp(min=0)
            signal = big - trace / n
            out.update(
                b_simple=float(b_simple_ratio(trace, signal)),
                trace_cov=float(trace),
                grad_sq=float(signal),
                reason="",
            )
        if self.config.ema > 0:
            out.update(self._averages(ctx, out["trace_cov"], out["grad_sq"]))
        return out

    def _averages(self, ctx: StepContext, trace: float, signal: float) -> dict[str, float]:
        """Update the moving averages with this step's estimates (unless NaN); return them."""
        beta = self.config.ema
        state = ctx.cache.get("ema", {"trace": 0.0, "signal": 0.0, "steps": 0})
        if math.isfinite(trace) and math.isfinite(signal):
            state = {
                "trace": beta * state["trace"] + (1 - beta) * trace,
                "signal": beta * state["signal"] + (1 - beta) * signal,
                "steps": state["steps"] + 1,
            }
            ctx.cache.put("ema", state)
        if not state["steps"]:
            return {"b_simple_ema": math.nan, "trace_cov_ema": math.nan, "grad_sq_ema": math.nan}
        correction = 1 - beta ** state["steps"]
        trace_ema = state["trace"] / correction
        signal_ema = state["signal"] / correction
        ratio = b_simple_ratio(
            torch.tensor(trace_ema, dtype=torch.float64),
            torch.tensor(signal_ema, dtype=torch.float64),
        )
        return {
            "b_simple_ema": float(ratio),
            "trace_cov_ema": trace_ema,
            "grad_sq_ema": signal_ema,
        }
