"""Simple gradient noise scale (McCandlish et al., 2018) with a jackknife standard error."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from cockpit_core import (
    BATCH_L2,
    BATCH_PROJECTION,
    MisuseError,
    Quantity,
    Requirements,
    StepContext,
    shard_sum,
)


class NoiseScale(Quantity):
    """Simple gradient noise scale ``B_simple = tr(Sigma) / |G|^2`` and its standard error.

    McCandlish, Kaplan, Amodei et al. (2018), "An Empirical Model of Large-Batch
    Training", Sec. 2.2 and Appendix A: ``Sigma`` is the covariance of the per-sample
    gradients and ``G`` the true (expected) gradient; ``B_simple`` approximates the
    critical batch size, beyond which a larger batch buys little. ``B_simple`` much larger
    than the batch size ``B`` says the gradient is mostly noise (larger batches, or a lower
    learning rate, would help); much smaller, that the batch is larger than it needs to be.

    Estimates from one mini-batch of ``B`` samples, with ``g_n`` the gradient of sample
    ``n``'s own loss (all parameters concatenated) and ``g = (1/B) sum_n g_n``:

        trace_cov = S  = sum_n |g_n - g|^2 / (B - 1) = (sum_n |g_n|^2 - B |g|^2) / (B - 1),
        grad_sq   = |G|^2_est = |g|^2 - S / B,
        b_simple  = S / |G|^2_est.

    Both ``S`` and ``|G|^2_est`` are unbiased (Appendix A's estimators with
    ``B_small = 1``, ``B_big = B``); their ratio is not, and it is noisy at one step: the
    paper averages ``S`` and ``|G|^2`` over many steps before dividing, which the
    ``trace_cov`` and ``grad_sq`` outputs allow (the dashboard panel draws that ratio of
    moving averages too).

    Standard error: the jackknife over the samples, exact and without per-sample
    gradients. Leaving sample ``n`` out, from ``|g_n|^2`` (``BATCH_L2``) and ``g_n . g``
    (``BATCH_PROJECTION``), summed over parameters:

        |g_(-n)|^2 = (B^2 |g|^2 - 2 B g_n . g + |g_n|^2) / (B - 1)^2,
        S_(-n)     = (sum_{m != n} |g_m|^2 - (B - 1) |g_(-n)|^2) / (B - 2),
        b_(-n)     = S_(-n) / (|g_(-n)|^2 - S_(-n) / (B - 1)),
        se         = sqrt((B - 1) / B * sum_n (b_(-n) - mean_m b_(-m))^2).

    Degenerate cases give numbers, never an exception: ``S`` is clamped at 0 (rounding
    only). If ``|G|^2_est <= 0`` the signal is not detectable in the batch and
    ``b_simple`` is ``inf`` (``nan`` if also ``S = 0``); ``se`` is ``inf`` if some
    leave-one-out estimate is not finite (one sample decides whether a signal is seen) and
    ``nan`` for ``B = 2`` (no jackknife with one sample left). ``B < 2`` raises
    :class:`~cockpit_core.MisuseError` (no variance from one sample).

    ``B`` is the leading dimension of the per-sample statistics. Under ``torch.distributed``
    the core gathers them over the processes and ``g`` is the global gradient, so every
    number describes the global batch; nothing is specific to this quantity. Under FSDP2
    ``|g|^2`` is summed from every process's rows of ``g``. Sums over
    samples and parameters run in float64.

    Output: ``{"b_simple", "se", "trace_cov", "grad_sq"}`` (floats) and ``"batch_size"``
    (``B``, to compare ``b_simple`` with). Cost: the per-sample statistics ``BATCH_L2``
    and ``BATCH_PROJECTION`` (``O(B D)``, shared with the gradient tests). Without them,
    from the gradients of the step's micro-batches: ``noise_scale_cheap``.
    """

    name = "noise_scale"
    shards = True  # FSDP2: rows of ctx.grads, |g|^2 summed over processes
    REQUIREMENTS = Requirements(statistics=(BATCH_L2, BATCH_PROJECTION))

    def compute(self, ctx: StepContext) -> dict[str, float]:
        """Return ``{"b_simple", "se", "trace_cov", "grad_sq", "batch_size"}``."""
        sq_norms = _summed(ctx.stat(BATCH_L2))  # |g_n|^2, [B]
        projections = _summed(ctx.stat(BATCH_PROJECTION))  # g_n . g, [B]
        batch_size = _batch_size(sq_norms, projections, ctx)
        if batch_size < 2:
            raise MisuseError(
                f"'{self.key}' needs at least 2 samples per mini-batch (got {batch_size}): it "
                "estimates the variance of the per-sample gradients. Use a larger batch, or "
                "do not track this quantity."
            )
        device = _device(sq_norms, projections, ctx)
        if sq_norms is None:
            sq_norms = torch.zeros(batch_size, dtype=torch.float64, device=device)
        if projections is None:
            projections = torch.zeros(batch_size, dtype=torch.float64, device=device)
        grad_sq = shard_sum(  # FSDP2: the rows' sums over the processes
            sum(
                (
                    torch.linalg.vector_norm(g, dtype=torch.float64).to(device) ** 2
                    for g in ctx.grads
                ),
                start=torch.zeros((), dtype=torch.float64, device=device),
            )
        )
        return noise_scale_estimates(sq_norms, projections, grad_sq, batch_size)


def noise_scale_estimates(
    sq_norms: Tensor, projections: Tensor, grad_sq: Tensor, batch_size: int
) -> dict[str, float]:
    """The outputs of :class:`NoiseScale` from the summed per-sample statistics.

    Args:
        sq_norms: ``|g_n|^2`` of each sample, ``[B]`` float64.
        projections: ``g_n . g`` of each sample, ``[B]`` float64.
        grad_sq: ``|g|^2`` of the mini-batch gradient, a float64 scalar.
        batch_size: ``B``.

    Returns:
        ``{"b_simple", "se", "trace_cov", "grad_sq", "batch_size"}``.

    """
    b = batch_size
    total = sq_norms.sum()
    trace, signal, ratio = _estimate(total, grad_sq, b)
    if b < 3:
        se = math.nan
    else:
        loo_grad_sq = (b * b * grad_sq - 2 * b * projections + sq_norms) / (b - 1) ** 2
        _, _, loo = _estimate(total - sq_norms, loo_grad_sq, b - 1)
        if bool(torch.isfinite(loo).all()):
            se = math.sqrt((b - 1) / b * float(((loo - loo.mean()) ** 2).sum()))
        else:
            se = math.inf
    return {
        "b_simple": float(ratio),
        "se": se,
        "trace_cov": float(trace),
        "grad_sq": float(signal),
        "batch_size": b,
    }


def _estimate(sum_sq: Tensor, grad_sq: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(S, |G|^2_est, B_simple)`` from ``sum_n |g_n|^2`` and ``|g|^2`` of ``n`` samples.

    Element-wise on tensors (the jackknife passes ``[B]`` leave-one-out values). ``S`` is
    clamped at 0 (negative only by rounding); ``B_simple`` is ``inf`` where the signal
    estimate is ``<= 0`` and ``S > 0``, ``nan`` where both are ``<= 0``.
    """
    trace = ((sum_sq - n * grad_sq) / (n - 1)).clamp(min=0)
    signal = grad_sq - trace / n
    return trace, signal, b_simple_ratio(trace, signal)


def b_simple_ratio(trace: Tensor, signal: Tensor) -> Tensor:
    """``S / |G|^2_est`` where the signal is detected (``> 0``); else ``inf``, or ``nan`` if ``S = 0``.

    Element-wise; shared by :class:`NoiseScale` and ``noise_scale_cheap``.
    """
    detected = signal > 0
    undefined = torch.where(
        trace > 0, torch.full_like(trace, math.inf), torch.full_like(trace, math.nan)
    )
    return torch.where(detected, trace / torch.where(detected, signal, 1.0), undefined)


def _summed(values: Sequence[Tensor | None]) -> Tensor | None:
    """Sum over parameters of ``[B]`` per-sample values in float64 (``None``: no parameter had one)."""
    present = [v.detach().to(torch.float64) for v in values if v is not None]
    if not present:
        return None
    device = present[0].device
    return torch.stack([v.to(device) for v in present]).sum(0)


def _batch_size(sq_norms: Tensor | None, projections: Tensor | None, ctx: StepContext) -> int:
    """``B``: the length of the per-sample statistics, else ``ctx.batch_size``."""
    for v in (sq_norms, projections):
        if v is not None:
            return int(v.shape[0])
    return ctx.batch_size


def _device(sq_norms: Tensor | None, projections: Tensor | None, ctx: StepContext) -> torch.device:
    """Where the statistics live (the first gradient's device if none was computed)."""
    for v in (sq_norms, projections):
        if v is not None:
            return v.device
    return ctx.grads[0].device if ctx.grads else torch.device("cpu")
