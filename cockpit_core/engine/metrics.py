"""Epoch-level metrics logged with ``cp.log(step, **metrics)``: what is accepted, and where.

Quantities describe a training step from inside the backward pass; metrics are what the
training script measures itself, typically once per epoch: losses and accuracies on the
train, validation and test sets, the epoch number, the learning rate. Cockpit 1.0.2 took
them as ``cockpit.log(global_step, epoch_count, train_loss, valid_loss, test_loss,
train_accuracy, valid_accuracy, test_accuracy, learning_rate)``; here any named scalar is
accepted, and those names are the ones the dashboard's *Performance* panel draws.

A step's metrics live under the reserved output key :data:`METRICS_KEY`
(``cp.get_output()[step]["metrics"] == {name: value}``) and travel to the log and sinks as
``{"kind": "metrics", "step": s, "metrics": {name: value}}`` records
(``docs/log_format.md``). No quantity may write that key.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from cockpit_core.errors import MisuseError

METRICS_KEY = "metrics"
"""Output key of a step's metrics; reserved: no quantity may use it as its key."""

REFERENCE_METRICS: tuple[str, ...] = (
    "epoch_count",
    "train_loss",
    "valid_loss",
    "test_loss",
    "train_accuracy",
    "valid_accuracy",
    "test_accuracy",
    "learning_rate",
)
"""The metric names of Cockpit 1.0.2's ``log``; the Performance panel draws the losses and
accuracies, and marks epochs with ``epoch_count``."""

_ACCEPTED = "an int, a float, a numpy number, a 0-d tensor or None (not measured)"


def check_step(step: Any) -> int:
    """``step`` as an ``int``; :class:`MisuseError` unless it is an integer (not a bool)."""
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise MisuseError(
            f"cp.log(step, ...): step must be an integer (the global step the metrics belong "
            f"to), got {step!r}."
        )
    return int(step)


def clean_metric(name: str, value: Any) -> int | float | None:
    """One metric value as a Python number (``None`` stays ``None``).

    Integers (Python or numpy) stay integers; floats, numpy floats and 0-d tensors (of any
    real dtype, detached and moved to the CPU) become ``float``; NaN and inf are kept.

    Raises:
        TypeError: ``value`` is a bool, a complex number, a string, a tensor or array with
            more than zero dimensions, or anything else that is not a real number; the
            message names the metric and says what is accepted.

    """
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise TypeError(
                f"cp.log: metric '{name}' is a tensor of shape {list(value.shape)}; pass "
                f"{_ACCEPTED} (e.g. {name}=t.mean() or {name}=t.item())."
            )
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(
                f"cp.log: metric '{name}' is a 0-d tensor of dtype {value.dtype}; pass a real "
                f"number: {_ACCEPTED}."
            )
        return float(value.detach().cpu().item())
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise TypeError(
                f"cp.log: metric '{name}' is an array of shape {list(value.shape)}; pass "
                f"{_ACCEPTED}."
            )
        value = value[()]
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"cp.log: metric '{name}' is the bool {bool(value)}; pass {_ACCEPTED} "
            f"(write {name}=int(flag) to log a flag as 0 or 1)."
        )
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(
        f"cp.log: metric '{name}' is a {type(value).__name__} ({value!r:.60}); pass {_ACCEPTED}."
    )


def clean_metrics(step: Any, metrics: Mapping[str, Any]) -> tuple[int, dict[str, int | float]]:
    """Check a ``cp.log(step, **metrics)`` call; return the step and the measured metrics.

    ``None`` values (not measured) are left out, so they never replace a value logged
    earlier at the same step.

    Raises:
        MisuseError: ``step`` is not an integer, or no metric was given.
        TypeError: A value is not a real number, a 0-d tensor or ``None``
            (:func:`clean_metric`); nothing is logged then.

    """
    step = check_step(step)
    if not metrics:
        raise MisuseError(
            f"cp.log({step}) got no metrics: pass them by name, e.g. cp.log(step, "
            "epoch_count=3, train_loss=0.31, valid_accuracy=0.87)."
        )
    cleaned: dict[str, int | float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name or name.startswith("__"):
            raise TypeError(
                f"cp.log: metric names must be non-empty strings that do not start with "
                f"'__', got {name!r}."
            )
        number = clean_metric(name, value)
        if number is not None:
            cleaned[name] = number
    return step, cleaned


def metrics_of(output: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """``{step: {name: value}}`` of the steps of ``output`` that hold metrics."""
    return {
        step: dict(values[METRICS_KEY])
        for step, values in output.items()
        if isinstance(values.get(METRICS_KEY), Mapping)
    }
