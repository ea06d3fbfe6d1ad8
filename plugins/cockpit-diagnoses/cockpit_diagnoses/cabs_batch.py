"""CABS batch: the batch size CABS suggests is far above the one in use."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, Finding, Window, persistent_spans
from cockpit_diagnoses._common import PersistenceConfig, fmt
from cockpit_diagnoses.precedence import GROW_BATCH, won_by


class CABSBatchConfig(PersistenceConfig):
    """Options of :class:`CABSBatch`."""

    batch_size: int | None = Field(
        None,
        ge=1,
        description="Batch size in use; None: read it from cp.log(step, batch_size=B).",
    )
    factor: float = Field(
        4.0,
        gt=1.0,
        description="Report a suggestion more than this many times the batch in use.",
    )


class CABSBatch(Diagnosis):
    """CABS (Balles, Romero & Hennig 2017) suggests a batch ``factor`` x (4) the actual one.

    ``cabs`` (cockpit-gradient-tests) is the batch size that "Coupling adaptive batch sizes
    with learning rates" (UAI 2017, Eq. 22) suggests for the current learning rate,
    ``lr tr(Sigma) / L``. A tracked step is flagged when ``cabs > factor * B``: the batch
    is too small for this learning rate; reported at ``fraction`` (0.8) of ``window`` (10)
    consecutive tracked steps. (A suggestion far *below* ``B`` is not reported: CABS
    suggests batches of 1-2 for many healthy small models.) ``B`` is the ``batch_size`` option or the
    ``batch_size`` metric of ``cp.log`` (the latest at or before each step); without
    either the rule is silent. The rule assumes plain SGD and ``f* = 0``, as CABS does.
    Evidence: the median suggestion, ``B``, their ratio.
    """

    name = "cabs_batch"
    reads = ("cabs",)
    source = "Balles, Romero & Hennig (2017), CABS, UAI, Eq. (22)"
    Config = CABSBatchConfig
    config: CABSBatchConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return the stretches where the suggestion exceeds ``factor`` x the batch size."""
        cfg = self.config
        steps, cabs = window.series("cabs", "total")
        batch = _batch_sizes(window, steps, cfg.batch_size)
        ok = np.isfinite(cabs) & np.isfinite(batch) & (batch > 0)
        steps, cabs, batch = steps[ok], cabs[ok], batch[ok]
        ratio = cabs / batch if len(batch) else np.zeros(0)
        found = []
        for first, last, count in persistent_spans(
            steps, ratio > cfg.factor, cfg.window, cfg.fraction
        ):
            inside = (steps >= first) & (steps <= last)
            median = float(np.median(cabs[inside]))
            used = float(np.median(batch[inside]))
            found.append(
                self.finding(
                    "",
                    "warning",
                    first,
                    last,
                    f"CABS suggests a batch of {fmt(median)}, {fmt(median / used)}x the "
                    f"{fmt(used)} in use: the batch is too small for this learning rate",
                    {
                        "median_cabs": median,
                        "batch_size": used,
                        "ratio": median / used,
                        "factor": cfg.factor,
                        "steps_flagged": count,
                    },
                    f"Grow the batch towards {fmt(median)} (CABS keeps lr x noise / loss "
                    "constant), or lower the learning rate.",
                    GROW_BATCH,
                )
            )
        return found

    def applies(self, window: Window) -> bool:
        """Whether ``cabs`` is logged and a batch size is known."""
        return window.has("cabs") and (
            self.config.batch_size is not None or _logged_batch(window) != {}
        )


def _logged_batch(window: Window) -> dict[int, float]:
    """``{step: batch_size}`` of the ``batch_size`` metric of ``cp.log``."""
    out = {}
    for step, metrics in window.values("metrics"):
        value = metrics.get("batch_size") if isinstance(metrics, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[step] = float(value)
    return out


def _batch_sizes(window: Window, steps: np.ndarray, fixed: int | None) -> np.ndarray:
    """The batch size at each step: ``fixed``, else the latest logged at or before it."""
    if fixed is not None:
        return np.full(len(steps), float(fixed))
    logged = sorted(_logged_batch(window).items())
    out = np.full(len(steps), np.nan)
    for i, step in enumerate(steps):
        before = [b for s, b in logged if s <= step]
        if before:
            out[i] = before[-1]
    return out
