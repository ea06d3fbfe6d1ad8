"""What happens when a quantity raises or a step's values are not finite: training goes on."""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from cockpit_core import checks
from cockpit_core.cache import Cache
from cockpit_core.errors import CockpitWarning
from cockpit_core.planner import Planner
from cockpit_core.quantity import Quantity
from cockpit_core.step import START_STATE, Task

Record = dict[str, Any]


class ErrorPolicy:
    """Records failures and skipped steps, warns once per kind, and applies ``on_error``.

    Args:
        on_error: ``"warn"`` (record, warn, keep tracking), ``"disable"`` (record, warn,
            stop tracking the quantity) or ``"raise"``.
        emit: Sends a record to the log and the sinks.
        planner: Holds the pending and disabled quantities.
        cache: The quantities' cross-step cache.

    Attributes:
        errors: ``"error"`` records: step, quantity, phase, message, traceback summary.
        skipped: ``"skipped"`` records of steps with a non-finite loss or gradient.

    """

    def __init__(
        self, on_error: str, emit: Callable[[Record], None], planner: Planner, cache: Cache
    ):
        self.on_error = on_error
        self._emit = emit
        self._planner = planner
        self._cache = cache
        self.errors: list[Record] = []
        self.skipped: list[Record] = []
        self._warned: set[tuple[str, str]] = set()

    def quantity_failed(self, q: Quantity, step: int, phase: str, err: Exception) -> None:
        """Record that ``q`` raised ``err`` at ``step`` (or re-raise with ``"raise"``)."""
        if self.on_error == "raise":
            raise err
        tb = traceback.extract_tb(err.__traceback__)[-3:]
        record = {
            "kind": "error",
            "step": step,
            "quantity": q.key,
            "phase": phase,
            "error": f"{type(err).__name__}: {err}",
            "traceback": [f"{f.filename}:{f.lineno} in {f.name}" for f in tb],
        }
        self.errors.append(record)
        self._emit(record)
        action = "it keeps being tracked"
        if self.on_error == "disable":
            self._planner.disabled.add(q.key)
            self._planner.pending.pop(q.key, None)
            self._cache.remove_owner(q.key)
            action = "it is disabled for the rest of the run"
        self._warn_once(
            (q.key, type(err).__name__),
            f"quantity '{q.key}' failed at step {step} ({type(err).__name__}: {err}); "
            f"training continues and {action}. Errors are in cp.errors and the log.",
            stacklevel=6,  # user's with block > StepRun.__exit__ > run_tasks > here
        )

    def skip_nonfinite(
        self,
        step: int,
        tasks: Sequence[Task],
        info: Mapping[str, Any],
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
    ) -> bool:
        """Skip the step's quantities (recording why) if the loss or gradients are not finite."""
        reason = checks.nonfinite_reason(info, params, names)
        if reason is None:
            return False
        for task in tasks:
            if task.phase == "end":  # the end point is not usable: drop the pending start
                self._planner.pending.pop(task.quantity.key, None)
                self._cache.pop(task.quantity.key, START_STATE)
        record = {
            "kind": "skipped",
            "step": step,
            "quantities": sorted({t.quantity.key for t in tasks}),
            "reason": f"non-finite values: {reason}",
        }
        self.skipped.append(record)
        self._emit(record)
        self._warn_once(
            ("", "nonfinite"),
            f"step {step} skipped because {reason}; training continues. Skipped steps are "
            "in cp.skipped and the log. Lower the learning rate or check the data if this "
            "repeats.",
            stacklevel=5,  # user's with block > StepRun.__exit__ > here
        )
        return True

    def _warn_once(self, kind: tuple[str, str], message: str, stacklevel: int) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(f"cockpit: {message}", CockpitWarning, stacklevel=stacklevel)
