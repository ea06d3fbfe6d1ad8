"""Helpers for ``draw`` functions: pull time series out of ``{step: {name: value}}``.

Nothing here imports matplotlib; instruments of plugins use these to stay short.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.engine.metrics import METRICS_KEY
from cockpit_core.instrument import Output


def scalar(value: Any, field: str | None = "total") -> float:
    """A number from a value: the number itself, or ``value[field]`` of a dict value.

    Returns NaN when there is nothing numeric (so gaps show up as gaps).
    """
    if isinstance(value, Mapping):
        if field is None or field not in value:
            return float("nan")
        value = value[field]
    try:
        return float(np.asarray(value, dtype=float).reshape(()))
    except (TypeError, ValueError):
        return float("nan")


def series(output: Output, name: str, field: str | None = "total") -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of a scalar quantity (or of ``field`` of a dict-valued one).

    Steps where ``name`` has no value are left out; NaN and inf are kept.
    """
    steps, values = [], []
    for step in sorted(output):
        if name in output[step] and output[step][name] is not None:
            steps.append(step)
            values.append(scalar(output[step][name], field))
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def metric_series(output: Output, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of a metric logged with ``cp.log(step, name=value)``.

    Metrics live under the output key ``"metrics"`` (``{step: {"metrics": {name:
    value}}}``); an instrument that draws them lists ``"metrics"`` in its quantities.
    Steps without the metric are left out; NaN and inf are kept.
    """
    steps, values = [], []
    for step in sorted(output):
        metrics = output[step].get(METRICS_KEY)
        if isinstance(metrics, Mapping) and metrics.get(name) is not None:
            steps.append(step)
            values.append(scalar(metrics[name], None))
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def per_param_series(
    output: Output, name: str, field: str = "per_param"
) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values[step, param])`` of a per-parameter array (``value[field]``).

    Steps whose array has a different length than the first are skipped.
    """
    steps: list[int] = []
    rows: list[np.ndarray] = []
    for step in sorted(output):
        value = output[step].get(name)
        if isinstance(value, Mapping) and field in value:
            row = np.atleast_1d(np.asarray(value[field], dtype=float))
            if rows and row.shape != rows[0].shape:
                continue
            steps.append(step)
            rows.append(row)
    if not rows:
        return np.zeros(0), np.zeros((0, 0))
    return np.asarray(steps, dtype=float), np.vstack(rows)


def last(output: Output, name: str) -> tuple[int, Any] | tuple[None, None]:
    """``(step, value)`` of the last step where ``name`` has a value, else ``(None, None)``."""
    for step in sorted(output, reverse=True):
        if output[step].get(name) is not None:
            return step, output[step][name]
    return None, None


def values(output: Output, name: str) -> list[tuple[int, Any]]:
    """Every ``(step, value)`` of ``name``, sorted by step."""
    return [(s, output[s][name]) for s in sorted(output) if output[s].get(name) is not None]


def param_names(header: Mapping[str, Any], count: int | None = None) -> list[str]:
    """Parameter names from the log header (``param 0``, ``param 1``, ... when unknown)."""
    names = [str(p.get("name", i)) for i, p in enumerate(header.get("params", []) or [])]
    if count is not None and len(names) != count:
        names = [f"param {i}" for i in range(count)]
    return names


def short_names(names: list[str]) -> list[str]:
    """Module names without the dotted prefix they all share (for legends).

    ``["transformer.h.0.attn", "transformer.h.1.attn"]`` -> ``["0.attn", "1.attn"]``; the
    model itself (``""``) reads ``"(model)"``.
    """
    parts = [n.split(".") for n in names]
    common = 0
    while (
        len(parts) > 1
        and all(len(p) > common + 1 for p in parts)
        and len({p[common] for p in parts}) == 1
    ):
        common += 1
    return [".".join(p[common:]) or "(model)" for p in parts]


def ema(values: np.ndarray, weight: float = 0.2, *, log: bool = False) -> np.ndarray:
    """Exponential moving average ``m_t = (1 - weight) m_{t-1} + weight x_t`` over the points.

    Causal: each point averages the points before it, so it lags a change by about
    ``(1 - weight) / weight`` points. For a panel, :func:`smooth` (centred, no lag) is the
    better moving average.

    Args:
        values: The series' values, one per tracked point (NaN and inf are skipped: the
            average carries on over them).
        weight: Weight of the newest point.
        log: Average in log scale (``exp`` of the average of ``log x``), for a panel with a
            logarithmic y axis; values ``<= 0`` are skipped.

    """
    out = np.empty(len(values))
    m = np.nan
    for i, x in enumerate(np.asarray(values, dtype=float)):
        if log:
            x = np.log(x) if x > 0 else np.nan
        if np.isfinite(x):
            m = x if np.isnan(m) else (1 - weight) * m + weight * x
        out[i] = m
    return np.exp(out) if log else out


SMOOTH_SHARE = 0.05
"""Share of a series' points that :func:`smooth`'s default window spans."""


def smooth_window(count: int) -> int:
    """The default window of :func:`smooth` for ``count`` points: odd, about 5% of them.

    ``1`` (no averaging) below 30 points; 3 for 30-49 points, 15 for 300, 101 for 2,000.
    """
    return max(1, round(count * SMOOTH_SHARE)) // 2 * 2 + 1


def smooth(values: np.ndarray, window: int | None = None, *, log: bool = False) -> np.ndarray:
    """Centred moving average of a series over its points, in the panel's scale.

    Each point becomes the mean of the ``window`` points around it (fewer at the ends),
    counted in tracked points, not in steps: a quantity tracked every 10th step is averaged
    over its own points, and the average follows a change without lag. With ``log`` it is
    the geometric mean (the mean of ``log x``), what a logarithmic y axis shows as the
    middle; an arithmetic mean there is pulled up by single spikes. Either way the average
    stays within the range of the values it averages.

    Args:
        values: The series' values, one per tracked point (as :func:`series` returns them).
        window: Points averaged, an odd number (an even one is made odd by adding one);
            default :func:`smooth_window` of the series' length.
        log: Average in log scale; values ``<= 0`` are left out of the averages.

    Returns:
        The averages, one per point; NaN where the value itself is NaN or infinite (so
        :func:`cockpit_core.panel.style.line` marks it) or where the window holds no
        usable value.

    """
    x = np.asarray(values, dtype=float).reshape(-1)
    n = len(x)
    half = (smooth_window(n) if window is None else max(1, int(window))) // 2
    usable = np.isfinite(x) & (x > 0) if log else np.isfinite(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(usable, np.log(np.where(usable, x, 1.0)) if log else x, 0.0)
    sums = np.concatenate(([0.0], np.cumsum(y)))
    counts = np.concatenate(([0], np.cumsum(usable)))
    low = np.clip(np.arange(n) - half, 0, n)
    high = np.clip(np.arange(n) + half + 1, 0, n)
    count = counts[high] - counts[low]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean: np.ndarray = (sums[high] - sums[low]) / count
    if usable.any():  # rounding of the running sums must not leave the data's range
        mean = np.clip(mean, y[usable].min(), y[usable].max())
    if log:
        mean = np.exp(mean)
    mean[(count == 0) | ~np.isfinite(x)] = np.nan
    return mean
