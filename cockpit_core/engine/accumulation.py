"""Gradient accumulation: one tracked step over several micro-batches.

With ``K`` micro-batches per optimizer step, the user backpropagates each micro-batch's
mean loss scaled by its share of the accumulated batch, ``loss_k = (B_k / B) mean_k`` (equal
micro-batches: ``mean_k / K``), so the accumulated ``p.grad`` is the gradient of the mean
loss over all ``B`` samples. Quantities then describe that accumulated batch: each
micro-batch's statistics are computed during its own backward pass (with the per-sample
scaling of the accumulated batch) and combined like the statistics of processes under
``torch.distributed`` (:mod:`cockpit_core.distributed.batch`): sums over samples add up,
per-sample rows are concatenated, curvature diagonals (BackPACK computes them for the loss
module's own mean, before the scaling) are weighted by ``B_k / B``, and
``BATCH_PROJECTION`` is projected on the accumulated gradient after the last backward.

With a ``GradScaler`` (``info["grad_scaler"]`` given to ``cp(step, ...)``), each
micro-batch backpropagates ``scaler.scale(loss_k)``; its statistics are unscaled like
those of a single backward pass.

Requests (``cp(step, *requests, accumulate=True)``, e.g. BackPACK extensions) run in every
micro-batch's backward pass; what they leave on the parameters is the provider's business
(BackPACK overwrites its results at each backward: the last micro-batch's remain).

The per-sample scaling needs ``B`` during the first micro-batch's backward pass. Given
``info={"batch_size": B}`` it is known; else cockpit reads it from the first micro-batch
(:func:`batch_from_share`): its loss ``loss_1 = (B_1 / B) mean_1`` and its per-sample
losses (whose mean is ``mean_1``) give ``B = B_1 mean_1 / loss_1``. The step's batch size
is then the sum of the micro-batches' sizes, which must equal ``B``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from cockpit_core.statistics.combine import combine
from cockpit_core.statistics.router import Identity, Results
from cockpit_core.statistics.statistic import Statistic


def micro_batch_size(info: dict[str, Any]) -> int:
    """Samples of one micro-batch: ``info["batch_size"]`` or ``len(individual_losses)`` (0: unknown)."""
    if info.get("batch_size"):
        return int(info["batch_size"])
    if "individual_losses" in info:
        return len(info["individual_losses"])
    return 0


def batch_from_share(loss: Any, losses: Any, samples: int) -> tuple[int, str]:
    """The step's batch size ``B`` that a micro-batch's loss scaling implies, or why none.

    ``loss`` is the micro-batch's backpropagated loss ``(B_k / B) mean_k``, ``losses`` its
    ``samples`` per-sample losses (their mean ``mean_k``): ``B = B_k mean_k / loss``,
    accepted if it is a whole number (to ``1e-3``) of at least ``B_k``.

    Returns:
        ``(B, "")``, or ``(0, why)``.

    """
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        return 0, "the micro-batch's loss is unknown (run.micro_batch(loss=loss))"
    if not isinstance(losses, torch.Tensor) or not samples or losses.numel() != samples:
        return 0, "cockpit does not know the micro-batch's per-sample losses"
    value = float(loss.detach().double())
    mean = float(losses.detach().double().mean())
    if not (math.isfinite(value) and math.isfinite(mean)) or value == 0.0 or mean == 0.0:
        return 0, f"its loss ({value:.6g}) and mean per-sample loss ({mean:.6g}) tell no ratio"
    total = samples * mean / value
    whole = round(total)
    if whole < samples or abs(total - whole) > 1e-3 * max(whole, 1):
        return 0, (
            f"its loss ({value:.6g}) is not its mean per-sample loss ({mean:.6g}) times "
            f"B_k / B for a whole number B >= B_k = {samples}"
        )
    return whole, ""


def merge_stats(
    declared: Sequence[Statistic],
    total: Results,
    total_missing: dict[Identity, str],
    stats: Results,
    missing: dict[Identity, str],
    share: float | None,
) -> None:
    """Combine one micro-batch's statistics into the step's, by each kind's combine rule.

    Args:
        declared: The step's statistics.
        total: The step's statistics so far (updated in place).
        total_missing: The step's missing-statistic messages (updated in place).
        stats: The micro-batch's statistics.
        missing: The micro-batch's missing-statistic messages.
        share: The micro-batch's share of the step's samples (``None``: unknown).

    """
    for key, message in missing.items():
        total_missing.setdefault(key, message)
    by_ident = {s.identity: s for s in declared}
    for ident, values in stats.items():
        stat = by_ident[ident]
        if stat.combine == "mean":  # of the micro-batch's own mean loss: weight by its share
            if share is None:
                total_missing.setdefault(
                    ident, "pass info={'batch_size': ...} to each run.micro_batch()"
                )
                continue
            values = [None if v is None else v * share for v in values]
        old = total.get(ident)
        if old is None:
            total[ident] = list(values)
            continue
        if stat.combine is None:
            total_missing.setdefault(
                ident, f"{stat.describe()} cannot be combined across micro-batches."
            )
            continue
        total[ident] = [combine(stat, a, b) for a, b in zip(old, values)]


def merge_info(total: dict[str, Any], info: dict[str, Any]) -> None:
    """Add a micro-batch's ``loss`` and append its ``individual_losses`` to the step's."""
    if "loss" in info:
        loss = info["loss"]
        total["loss"] = loss if "loss" not in total else total["loss"] + loss
    if "individual_losses" in info:
        losses = info["individual_losses"].detach()
        old = total.get("individual_losses")
        total["individual_losses"] = losses if old is None else torch.cat([old, losses])
