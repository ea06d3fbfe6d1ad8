"""Gradient accumulation: one tracked step over several micro-batches.

With ``K`` micro-batches per optimizer step, the user backpropagates each micro-batch's
mean loss scaled by its share of the accumulated batch, ``loss_k = (B_k / B) mean_k`` (equal
micro-batches: ``mean_k / K``), so the accumulated ``p.grad`` is the gradient of the mean
loss over all ``B`` samples. Quantities then describe that accumulated batch: each
micro-batch's statistics are computed during its own backward pass (with the per-sample
scaling of the accumulated batch) and combined like the statistics of processes under
``torch.distributed`` (:mod:`cockpit_core.distributed`): sums over samples add up,
per-sample rows are concatenated, curvature diagonals (BackPACK computes them for the loss
module's own mean, before the scaling) are weighted by ``B_k / B``, and
``BATCH_PROJECTION`` is projected on the accumulated gradient after the last backward.

With a ``GradScaler`` (``info["grad_scaler"]`` given to ``cp(step, ...)``), each
micro-batch backpropagates ``scaler.scale(loss_k)``; its statistics are unscaled like
those of a single backward pass.

Requests (``cp(step, *requests, accumulate=True)``, e.g. BackPACK extensions) run in every
micro-batch's backward pass; what they leave on the parameters is the provider's business
(BackPACK overwrites its results at each backward: the last micro-batch's remain).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from cockpit_core.errors import MisuseError
from cockpit_core.mixed_precision import LossGradient
from cockpit_core.statistics.combine import combine

if TYPE_CHECKING:
    from cockpit_core.step import StepRun


@contextmanager
def micro_batch(run: StepRun, info: dict[str, Any] | None) -> Iterator[None]:
    """Collect one micro-batch's statistics around its ``backward()`` (see the module doc).

    Args:
        run: The step's ``with cp(step, info=..., accumulate=True)`` block.
        info: This micro-batch's ``loss`` (the scaled loss that is backpropagated; summed
            over micro-batches), ``individual_losses`` (concatenated) and ``batch_size``.

    """
    if not getattr(run, "accumulate", False):
        raise MisuseError(
            "run.micro_batch() needs a step opened with cp(step, info=..., accumulate=True)."
        )
    info = dict(info or {})
    merged = run.merged
    ctx = None
    stats: dict = {}
    missing: dict = {}
    requests = getattr(run, "requests", ())
    if merged.statistics or requests:
        ctx = run.cp._backend.collect(
            merged,
            run.batch_size,
            info={**run.info, **info},
            eager=False,
            samples=_micro_size(info) or None,
            loss_scale=run.loss_scale,
            requests=requests,
        )
        stats, missing = ctx.__enter__()
    probe = LossGradient(info.get("loss"))
    run.loss_gradients.append(probe)
    try:
        yield
    except BaseException as err:
        probe.close()
        if ctx is not None:
            ctx.__exit__(type(err), err, err.__traceback__)
        raise
    probe.close()
    if ctx is not None:
        ctx.__exit__(None, None, None)
    share = _micro_size(info) / run.batch_size if _micro_size(info) else None
    _merge_stats(run, stats, missing, share)
    _merge_info(run.info, info)


def _micro_size(info: dict[str, Any]) -> int:
    if info.get("batch_size"):
        return int(info["batch_size"])
    if "individual_losses" in info:
        return len(info["individual_losses"])
    return 0


def _merge_stats(run: StepRun, stats: dict, missing: dict, share: float | None) -> None:
    """Combine one micro-batch's statistics into the step's, by each kind's combine rule."""
    for key, message in missing.items():
        run.missing.setdefault(key, message)
    by_ident = {s.identity: s for s in run.merged.statistics}
    for ident, values in stats.items():
        stat = by_ident[ident]
        if stat.combine == "mean":  # of the micro-batch's own mean loss: weight by its share
            if share is None:
                run.missing.setdefault(
                    ident, "pass info={'batch_size': ...} to each run.micro_batch()"
                )
                continue
            values = [None if v is None else v * share for v in values]
        old = run.stats.get(ident)
        if old is None:
            run.stats[ident] = list(values)
            continue
        if stat.combine is None:
            run.missing.setdefault(
                ident, f"{stat.describe()} cannot be combined across micro-batches."
            )
            continue
        run.stats[ident] = [combine(stat, a, b) for a, b in zip(old, values)]


def _merge_info(total: dict[str, Any], info: dict[str, Any]) -> None:
    if "loss" in info:
        loss = info["loss"]
        total["loss"] = loss if "loss" not in total else total["loss"] + loss
    if "individual_losses" in info:
        losses = info["individual_losses"].detach()
        old = total.get("individual_losses")
        total["individual_losses"] = losses if old is None else torch.cat([old, losses])
