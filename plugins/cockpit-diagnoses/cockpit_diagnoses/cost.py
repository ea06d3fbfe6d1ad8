"""Cost: cockpit's own overhead is above the user's budget; the schedule that would meet it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig, Finding, Window


class CostConfig(DiagnosisConfig):
    """Options of :class:`Cost`."""

    max_overhead: float = Field(
        1.0,
        gt=0.0,
        description="Share of plain training time cockpit may add, over all steps (1.0: double).",
    )
    severity: Literal["info", "warning"] = Field(
        "info", description="Severity of the finding ('warning' fails `cockpit diagnose`)."
    )
    min_records: int = Field(10, ge=1, description="Tracked steps measured before judging.")


@dataclass(frozen=True)
class Overhead:
    """What cockpit adds to training, from ``cost`` records.

    Attributes:
        overhead: Added time as a share of plain training time, amortized over all steps.
        extra_s: Seconds cockpit adds to a tracked step, on average.
        plain_iteration_s: Seconds of a plain (untracked) iteration.
        tracked_fraction: Share of the steps that are tracked.
        lower_bound: Whether no plain step was measured (every step tracked), so that only
            cockpit's own code is counted: the overhead is at least this.
        measured: How many tracked steps the estimate rests on.

    """

    overhead: float
    extra_s: float
    plain_iteration_s: float
    tracked_fraction: float
    lower_bound: bool
    measured: int

    def every(self, budget: float) -> int:
        """The ``every`` of a schedule that keeps the overhead within ``budget``."""
        return max(1, math.ceil(self.extra_s / (budget * self.plain_iteration_s) - 1e-9))


def _number(value: Any) -> float | None:
    """``value`` as a finite float, else ``None`` (``None``, booleans, strings, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _computed(record: Mapping[str, Any]) -> frozenset[str]:
    """The quantities computed at the record's step."""
    spent = record.get("quantities_s")
    return frozenset(map(str, spent)) if isinstance(spent, Mapping) else frozenset()


def typical_mean(pairs: list[tuple[frozenset[str], float]]) -> float:
    """The mean over steps of the median within each group: robust, and fair to rare groups.

    Steps that compute the same quantities cost about the same, up to noise (another
    process, the garbage collector): the median of each group ignores such outliers, and
    weighting each group by its size keeps a costly quantity tracked at few steps.
    """
    groups: dict[frozenset[str], list[float]] = {}
    for group, value in pairs:
        groups.setdefault(group, []).append(value)
    return sum(len(v) * statistics.median(v) for v in groups.values()) / len(pairs)


def estimate(records: list[Mapping[str, Any]]) -> Overhead | None:
    """The overhead of the run whose ``cost`` records these are (``None``: cannot tell).

    With plain steps measured, a tracked step costs ``block_s - plain_block_s`` more than a
    plain one (averaged by :func:`typical_mean`, at least 0), at a share
    ``tracked / (tracked + untracked)`` of the steps, relative to the median plain
    iteration. Without, the lower bound: cockpit's own time ``cockpit_s`` (averaged alike)
    over the median of ``iteration_s - cockpit_s``.
    """
    tracked = len(records)
    if not tracked:
        return None
    untracked = sum(max(0, int(_number(r.get("untracked_before")) or 0)) for r in records)
    fraction = tracked / (tracked + untracked)
    extras, plains = [], []
    for r in records:
        block, p_block, p_iter = (
            _number(r.get(k)) for k in ("block_s", "plain_block_s", "plain_iteration_s")
        )
        if block is not None and p_block is not None and p_iter is not None and p_iter > 0:
            extras.append((_computed(r), block - p_block))
            plains.append(p_iter)
    if extras:
        extra = max(0.0, typical_mean(extras))
        iteration = statistics.median(plains)
        return Overhead(
            extra * fraction / iteration, extra, iteration, fraction, False, len(extras)
        )
    for r in records:
        own, whole = _number(r.get("cockpit_s")), _number(r.get("iteration_s"))
        if own is not None and whole is not None:
            extras.append((_computed(r), own))
            plains.append(whole - own)
    if not extras:
        return None
    extra, iteration = max(0.0, typical_mean(extras)), statistics.median(plains)
    if iteration <= 0:
        return None
    return Overhead(extra * fraction / iteration, extra, iteration, fraction, True, len(extras))


def expensive_quantities(records: list[Mapping[str, Any]], top: int = 3) -> list[dict[str, Any]]:
    """The ``top`` quantities with the most compute time: key, seconds per tracked step, share."""
    totals: dict[str, float] = {}
    for r in records:
        spent = r.get("quantities_s")
        if not isinstance(spent, Mapping):
            continue
        for key, seconds in spent.items():
            value = _number(seconds)
            if value is not None and value >= 0:
                totals[str(key)] = totals.get(str(key), 0.0) + value
    whole = sum(totals.values())
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [
        {
            "quantity": k,
            "mean_s": _short(v / len(records)),
            "share": _short(v / whole if whole > 0 else 0.0),
        }
        for k, v in ranked
    ]


def _short(value: float) -> float:
    """``value`` to 4 significant digits (evidence that reads well in a report)."""
    return float(f"{value:.4g}")


class Cost(Diagnosis):
    """Cockpit adds more than ``max_overhead`` (100 %) to the time of plain training.

    Reads the ``cost`` records cockpit writes for each tracked step (its block time, its own
    time, and the medians of plain, untracked steps; see ``docs/log_format.md``). A tracked
    step costs ``block_s - plain_block_s`` more than a plain one (the median over the steps
    that compute the same quantities, averaged over all steps: :func:`typical_mean`), at a
    share ``tracked / (tracked + untracked)`` of the steps; divided by the median plain
    iteration time this is the amortized overhead. When every step is tracked there is no plain step to
    compare with; the overhead is then at least cockpit's own time over the rest of the
    iteration. Reported (``info``, or ``severity="warning"``) when the overhead is above
    the budget, once ``min_records`` (10) tracked steps are measured. The suggestion is the
    ``every`` that meets the budget, and the quantities that take the most compute time.
    """

    name = "cost"
    reads = ()
    reads_records = ("cost",)
    source = "rule: cockpit's measured overhead against the user's budget"
    Config = CostConfig
    config: CostConfig

    def check(self, window: Window) -> list[Finding]:
        """Return one finding if the overhead is above the budget."""
        cfg = self.config
        records = sorted(
            (r for r in window.cost if type(r.get("step")) is int), key=lambda r: r["step"]
        )
        found = estimate(records)
        if found is None or found.measured < cfg.min_records:
            return []
        if found.overhead <= cfg.max_overhead:
            return []
        every = found.every(cfg.max_overhead)
        top = expensive_quantities(records)
        about = "at least" if found.lower_bound else "about"
        names = ", ".join(f"'{q['quantity']}' ({100 * q['share']:.0f} %)" for q in top)
        example = top[0]["quantity"] if top else "hess_max_ev"
        suggestion = (
            f"Track each quantity every {every} steps{' or less often' * found.lower_bound} "
            f'to stay within the budget: {{ name = "{example}", every = {every} }} in a config '
            f'file, {{"name": "{example}", "every": {every}}} in Python.'
        )
        if names:
            suggestion += f" The most compute time goes to {names}: schedule them less often."
        return [
            self.finding(
                "",
                cfg.severity,
                records[0]["step"],
                records[-1]["step"],
                f"cockpit adds {about} {100 * found.overhead:.0f} % to training time "
                f"(budget {100 * cfg.max_overhead:.0f} %)",
                {
                    "overhead": found.overhead,
                    "max_overhead": cfg.max_overhead,
                    "lower_bound": found.lower_bound,
                    "extra_per_tracked_step_s": found.extra_s,
                    "plain_iteration_s": found.plain_iteration_s,
                    "tracked_fraction": found.tracked_fraction,
                    "tracked_steps": len(records),
                    "measured_steps": found.measured,
                    "every": every,
                    "expensive_quantities": top,
                },
                suggestion,
            )
        ]
