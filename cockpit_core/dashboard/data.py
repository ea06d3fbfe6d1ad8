"""Helpers for ``draw`` functions: pull time series out of ``{step: {name: value}}``.

Nothing here imports matplotlib; instruments of plugins use these to stay short.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.instrument import Output
from cockpit_core.metrics import METRICS_KEY


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
    steps, rows = [], []
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


def ema(values: np.ndarray, weight: float = 0.2) -> np.ndarray:
    """Exponential moving average ``m_t = (1 - weight) m_{t-1} + weight x_t`` (NaN skipped)."""
    out = np.empty(len(values))
    m = np.nan
    for i, x in enumerate(np.asarray(values, dtype=float)):
        if np.isfinite(x):
            m = x if np.isnan(m) else (1 - weight) * m + weight * x
        out[i] = m
    return out
