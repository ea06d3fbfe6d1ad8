"""Shared by the spike rules: a value far above its trailing window, and what jumped with it.

A tracked value is a spike when its robust z-score against the ``window`` tracked values
before it, ``(x - median) / (1.4826 MAD)``, exceeds ``threshold``, and it exceeds the
largest of those values (spikes among them left out) by more than ``margin`` times that
largest value's distance from the median: ``x - max > margin (max - median)``. The second
test adapts to heavy-tailed noise (small batches near convergence, where a few hard
examples make a batch's loss several times the median): a window whose largest value is
already far out asks a spike to be further out still. The median and the median absolute deviation (MAD; ``1.4826 MAD`` is the standard deviation
of normal noise) are those of the trailing window without the step itself, so an earlier
spike in the window hardly moves them, where it would inflate a standard deviation and
hide the next spike. A spike lasts until the value is back at or below that median: the
excursion and its recovery (with any aftershock on the way back) are one spike.

The attribution names the parameters whose own gradient norm (``grad_norm``'s
``per_param``) and update ratio (``update_ratio``'s ``per_param``, cockpit-health:
``||theta_{s+1} - theta_s|| / ||theta_s||`` under step ``s``) jumped most relative to their
median over the same trailing window, and the step's batch as the training script logged it
(``cp.log(step, batch_id=...)``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig, Finding, Window
from cockpit_diagnoses._common import fmt
from cockpit_diagnoses.precedence import LOWER_LR

MAD_TO_STD = 1.4826
"""``1 / Phi^-1(3/4)``: the MAD times this is the standard deviation of normal noise."""

_BLOCK = 4096
"""Windows whose median is taken at once (4096 x 50 values: 1.6 MB)."""

BATCH_METRICS: tuple[str, ...] = ("batch_id", "batch")
"""Metrics of ``cp.log(step, ...)`` that identify a step's batch, the first one found wins."""


class SpikeConfig(DiagnosisConfig):
    """Options of the spike rules (:mod:`cockpit_diagnoses.loss_spike`, ``grad_norm_spike``)."""

    window: int = Field(
        50, ge=2, description="Tracked steps before a step that its value is compared with."
    )
    min_window: int = Field(
        20,
        ge=2,
        description="Fewest earlier tracked steps with a finite value needed to judge a step.",
    )
    threshold: float = Field(
        6.0,
        gt=0.0,
        description="Report a robust z-score (x - median) / (1.4826 MAD) above this.",
    )
    margin: float = Field(
        2.0,
        ge=0.0,
        description="... and a value above the window's largest (earlier spikes left out) by "
        "more than this many times that largest value's distance from the median.",
    )
    layers: int = Field(
        3, ge=0, description="Parameters named in the attribution: those that jumped most."
    )

    @model_validator(mode="after")
    def _min_window_fits(self) -> SpikeConfig:
        if self.min_window > self.window:
            raise ValueError(
                f"min_window ({self.min_window}) must not exceed window ({self.window})"
            )
        return self


@dataclass(frozen=True)
class Spike:
    """One spike: from its first flagged step until the value is back at its window's median.

    Attributes:
        first_step: The first flagged step (where the spike starts).
        last_step: The last tracked step whose value is still above ``median``.
        count: Flagged tracked steps within the spike.
        value: The value at ``first_step``.
        median: Median of the trailing window of ``first_step``.
        scale: ``1.4826 MAD`` of that window (0 for a constant window).
        z: The robust z-score at ``first_step`` (``inf`` above a constant window).
        window_max: The largest value of the window before ``first_step``, earlier spikes
            left out: the level the spike rose above by ``margin``.
        trailing: Values in the window.
        peak_step: The flagged step with the largest value.
        peak_value: Its value.

    """

    first_step: int
    last_step: int
    count: int
    value: float
    median: float
    scale: float
    z: float
    window_max: float
    trailing: int
    peak_step: int
    peak_value: float


def trailing_stats(
    values: np.ndarray, window: int, min_window: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median, ``1.4826 MAD`` and robust z-score of each entry against the ones before it.

    Entry ``i`` is compared with entries ``max(0, i - window) .. i - 1``; entries with fewer
    than ``min_window`` before them get NaN. A constant window has scale 0: an entry above
    it gets ``z = inf``, one equal to it NaN.
    """
    n = len(values)
    median = np.full(n, np.nan)
    scale = np.full(n, np.nan)
    for i in range(min_window, min(window, n)):  # windows still growing
        median[i], scale[i] = _median_scale(values[:i])
    if n > window:  # full windows: row j is values[j : j + window], the window of j + window
        rows = np.lib.stride_tricks.sliding_window_view(values[:-1], window)
        for lo in range(0, len(rows), _BLOCK):  # in blocks: bounded memory on long logs
            past = rows[lo : lo + _BLOCK]
            med = np.median(past, axis=1)
            median[window + lo : window + lo + len(past)] = med
            mad = np.median(np.abs(past - med[:, None]), axis=1)
            scale[window + lo : window + lo + len(past)] = MAD_TO_STD * mad
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (values - median) / scale
    return median, scale, z


def _median_scale(past: np.ndarray) -> tuple[float, float]:
    med = float(np.median(past))
    return med, MAD_TO_STD * float(np.median(np.abs(past - med)))


def find_spikes(steps: np.ndarray, values: np.ndarray, cfg: SpikeConfig) -> list[Spike]:
    """The spikes of the finite series ``values`` at ``steps`` (see the module docstring).

    A spike starts at a flagged step and lasts while the value stays above the median of
    the window before its start (the excursion and its recovery: aftershocks on the way
    back are the same spike). The steps of a spike are left out of the largest value of
    later windows, so a second, smaller spike soon after is still found.
    """
    median, scale, z = trailing_stats(values, cfg.window, cfg.min_window)
    with np.errstate(invalid="ignore"):
        candidate = z > cfg.threshold
    spiking = np.zeros(len(values), dtype=bool)  # steps inside a spike
    spikes = []
    onset = -1  # index where the current spike started, -1 outside one
    top = math.nan  # the largest value of the window before the current spike (evidence)
    flagged = 0
    for i in range(len(values)):
        if onset >= 0 and values[i] > median[onset]:
            spiking[i] = True
            flagged += int(candidate[i])
            continue
        if onset >= 0:  # back below the level before the spike: it ended at i - 1
            spikes.append(_spike(steps, values, median, scale, z, onset, i - 1, top, flagged, cfg))
            onset = -1
        if not candidate[i]:
            continue
        lo = max(0, i - cfg.window)
        past = values[lo:i][~spiking[lo:i]]
        level = float(past.max()) if len(past) else float(median[i])
        if values[i] - level > cfg.margin * max(level - float(median[i]), 0.0):
            onset, top, flagged = i, level, 1
            spiking[i] = True
    if onset >= 0:
        spikes.append(
            _spike(steps, values, median, scale, z, onset, len(values) - 1, top, flagged, cfg)
        )
    return spikes


def _spike(
    steps: np.ndarray,
    values: np.ndarray,
    median: np.ndarray,
    scale: np.ndarray,
    z: np.ndarray,
    first: int,
    last: int,
    top: float,
    flagged: int,
    cfg: SpikeConfig,
) -> Spike:
    """The :class:`Spike` of indices ``first .. last``."""
    peak = first + int(np.argmax(values[first : last + 1]))
    return Spike(
        first_step=int(steps[first]),
        last_step=int(steps[last]),
        count=flagged,
        value=float(values[first]),
        median=float(median[first]),
        scale=float(scale[first]),
        z=float(z[first]),
        window_max=top,
        trailing=min(first, cfg.window),
        peak_step=int(steps[peak]),
        peak_value=float(values[peak]),
    )


def spike_evidence(spike: Spike, key: str, cfg: SpikeConfig) -> dict[str, Any]:
    """The numbers of a spike for a finding's evidence; ``key`` names the value."""
    return {
        key: spike.value,
        "median": spike.median,
        "robust_std": spike.scale,
        "z_score": spike.z if math.isfinite(spike.z) else None,
        "window_max": spike.window_max,
        "trailing_steps": spike.trailing,
        "threshold": cfg.threshold,
        "margin": cfg.margin,
        "steps_flagged": spike.count,
        "peak_step": spike.peak_step,
        f"peak_{key}": spike.peak_value,
    }


def how_far(spike: Spike) -> str:
    """How far a spike is above its window, for a message.

    ``12.3 robust standard deviations above the median 0.41 of the 50 tracked steps before
    (largest 0.8)``, or ``above the constant 0.41 of ...`` for a window without spread.
    """
    before = f"of the {spike.trailing} tracked steps before (largest {fmt(spike.window_max)})"
    if not math.isfinite(spike.z):
        return f"above the constant {fmt(spike.median)} {before}"
    return (
        f"{fmt(spike.z)} robust standard deviations above the median {fmt(spike.median)} {before}"
    )


def layer_jumps(
    window: Window, key: str, steps: list[int], cfg: SpikeConfig
) -> list[dict[str, Any]]:
    """The parameters whose ``key`` (``per_param``) jumped most at one of ``steps``.

    A parameter's factor at a tracked step is its value over the median of its finite
    values at the ``window`` tracked steps before; of ``steps`` the one with the largest
    factor counts. Returns up to ``cfg.layers`` entries ``{"parameter", "factor", "value",
    "median", "step"}`` (numbers to 4 significant digits), largest factor first, of the
    parameters whose factor is above 1 (a median of 0 gives no factor).
    """
    tracked, per = window.per_param(key)
    if not per.size or not cfg.layers:
        return []
    names = window.param_names
    if len(names) != per.shape[1]:
        names = [f"parameter {k}" for k in range(per.shape[1])]
    best: dict[int, dict[str, Any]] = {}
    for step in steps:
        hits = np.nonzero(tracked == step)[0]
        if not len(hits):
            continue
        j = int(hits[0])
        past = per[max(0, j - cfg.window) : j]
        if not len(past):
            continue
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a column without a finite value
            med = np.nanmedian(np.where(np.isfinite(past), past, np.nan), axis=0)
            factor = per[j] / med
        for k in range(per.shape[1]):
            f = float(factor[k])
            if math.isfinite(f) and med[k] > 0 and f > 1 and f > best.get(k, {}).get("factor", 1):
                best[k] = {
                    "parameter": names[k],
                    "factor": f,
                    "value": float(per[j, k]),
                    "median": float(med[k]),
                    "step": int(step),
                }
    ranked = sorted(best.values(), key=lambda e: -e["factor"])[: cfg.layers]
    return [{**e, **{n: _sig(e[n]) for n in ("factor", "value", "median")}} for e in ranked]


def _sig(value: float) -> float:
    """``value`` to 4 significant digits, as the report shows it."""
    return float(f"{value:.4g}")


def batch_identity(window: Window, step: int) -> dict[str, Any]:
    """``{"batch_id": value}`` of the metric ``batch_id`` (else ``batch``) logged at ``step``.

    The training script logs it with ``cp.log(step, batch_id=...)``; metrics are in the
    log, so ``cockpit diagnose`` sees them (while training they do not reach the
    diagnoses). Empty when none was logged at that step.
    """
    metrics = window.output.get(step, {}).get("metrics")
    if not isinstance(metrics, Mapping):
        return {}
    for name in BATCH_METRICS:
        if metrics.get(name) is not None:
            return {name: metrics[name]}
    return {}


def attribution(window: Window, step: int, cfg: SpikeConfig) -> tuple[dict[str, Any], str]:
    """Evidence and a message clause of what jumped with a spike starting at ``step``.

    Gradient norms at ``step`` (the gradient of the spiking loss); update ratios at
    ``step - 1`` (the update into ``step``: it moved the parameters to where the loss was
    measured) and at ``step`` itself, where tracked. Evidence: ``grad_norm_jumps`` and
    ``update_ratio_jumps`` (lists of :func:`layer_jumps`, each only when its quantity is
    logged) and the batch (:func:`batch_identity`). The clause reads ``; jumped most:
    update ratio of 0.weight 98x; gradient norm of 2.weight 7.1x`` (empty if nothing
    jumped or nothing per parameter is logged).
    """
    evidence: dict[str, Any] = {}
    parts = []
    for key, steps, what in (
        ("update_ratio", [step - 1, step], "update ratio"),
        ("grad_norm", [step], "gradient norm"),
    ):
        if window.has(key):
            jumps = layer_jumps(window, key, steps, cfg)
            evidence[f"{key}_jumps"] = jumps
            if jumps:
                parts.append(f"{what} of {_named(jumps)}")
    evidence.update(batch_identity(window, step))
    return evidence, f"; jumped most: {'; '.join(parts)}" if parts else ""


def at_step(step: int, evidence: Mapping[str, Any]) -> str:
    """``step 61``, or ``step 61 (batch_id 1061)`` when the evidence names the batch."""
    for name in BATCH_METRICS:
        if name in evidence:
            return f"step {step} ({name} {evidence[name]})"
    return f"step {step}"


def _named(jumps: list[dict[str, Any]]) -> str:
    """``2.weight 98x, 0.weight 3.1x``."""
    return ", ".join(f"{j['parameter']} {fmt(j['factor'])}x" for j in jumps)


SPIKE_SUGGESTION = (
    "Look at the batch of that step and the parameters named. A single spike that recovers "
    "may be a bad batch; repeated spikes call for a lower learning rate (of the named "
    "layers' group), a longer warm-up or gradient clipping. PaLM restarts from a checkpoint "
    "about 100 steps before a spike and skips the 200-500 batches around it. Log "
    "cp.log(step, batch_id=...) to see the batch in the finding."
)
"""What the spike rules suggest."""


class SpikeDiagnosis(Diagnosis):
    """A spike rule on one logged series: :func:`find_spikes`, then :func:`attribution`.

    Subclasses name the series (``series``: quantity and field), what it is called in the
    message (``what``) and the findings' ``severity``; everything else is shared.
    """

    series: tuple[str, str | None]
    what: str
    severity: str
    Config = SpikeConfig
    config: SpikeConfig

    def applies(self, window: Window) -> bool:
        """The series is needed; the other quantities only name the parameters."""
        return window.has(self.series[0])

    def check(self, window: Window) -> list[Finding]:
        """Return one finding per spike (consecutive flagged steps)."""
        cfg = self.config
        key, field = self.series
        steps, values = (
            window.finite_series(key) if field is None else window.finite_series(key, field)
        )
        found = []
        for spike in find_spikes(steps, values, cfg):
            who, clause = attribution(window, spike.first_step, cfg)
            found.append(
                self.finding(
                    "",
                    self.severity,
                    spike.first_step,
                    spike.last_step,
                    f"{self.what} at {at_step(spike.first_step, who)} is {fmt(spike.value)}: "
                    f"{how_far(spike)}{clause}",
                    {**spike_evidence(spike, key, cfg), **who},
                    SPIKE_SUGGESTION,
                    LOWER_LR,
                )
            )
        return found
