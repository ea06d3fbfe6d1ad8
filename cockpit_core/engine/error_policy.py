"""What happens when a quantity raises or a step cannot be used: training goes on.

Everything a quantity plugin runs at step time (its schedule, ``requirements()``,
``compute``/``compute_start``/``compute_end``) is isolated: any exception, including
``SystemExit`` and every other ``BaseException``, is recorded and the run continues; only
``KeyboardInterrupt`` and ``GeneratorExit`` pass through. ``on_error="raise"`` re-raises.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

import torch

from cockpit_core.cache import Cache
from cockpit_core.engine import loop_checks
from cockpit_core.engine.planner import Planner, Task
from cockpit_core.errors import CockpitWarning
from cockpit_core.log import unserializable_notes
from cockpit_core.quantity import Quantity

Record = dict[str, Any]


class ErrorPolicy:
    """Records failures and skipped steps, warns once per kind, and applies ``on_error``.

    Args:
        on_error: ``"warn"`` (record, warn, keep tracking), ``"disable"`` (record, warn,
            stop tracking the quantity) or ``"raise"``.
        emit: Sends a record to the log and the sinks.
        planner: Disables quantities and forgets unusable two-step starts.
        cache: The quantities' cross-step cache.

    Attributes:
        errors: ``"error"`` records: step, quantity, phase, message, traceback summary.
        skipped: ``"skipped"`` records of steps that were not used: a non-finite loss or
            gradient (also when a ``GradScaler`` found inf/NaN), or no ``backward()``.

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

    def quantity_failed(self, q: Quantity, step: int, phase: str, err: BaseException) -> None:
        """Record that ``q`` raised ``err`` at ``step`` (or re-raise with ``"raise"``).

        ``phase``: ``"single"``, ``"start"``, ``"end"``, ``"schedule"`` or ``"requirements"``.
        """
        if self.on_error == "raise" or isinstance(err, (KeyboardInterrupt, GeneratorExit)):
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
            self._planner.disable(q.key)
            self._cache.remove_owner(q.key)
            action = "it is disabled for the rest of the run"
        where = {"schedule": "its schedule ", "requirements": "its requirements() "}.get(phase, "")
        self._warn_once(
            (q.key, type(err).__name__),
            f"quantity '{q.key}' failed at step {step} ({where}raised {type(err).__name__}: "
            f"{err}); training continues and {action}. Errors are in cp.errors and the log."
            if where
            else f"quantity '{q.key}' failed at step {step} ({type(err).__name__}: {err}); "
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
        scaler_scale: float | None = None,
    ) -> bool:
        """Skip the step's quantities (recording why) if the loss or gradients are not finite.

        With ``scaler_scale`` (a ``GradScaler`` scales the loss), non-finite gradients are
        reported as the scaler's overflow, which it handles by skipping the optimizer step.
        """
        reason = loop_checks.nonfinite_reason(info, params, names)
        if reason is None:
            return False
        if scaler_scale is not None and not reason.startswith("the loss"):
            self.skip_scaler_overflow(step, tasks, scaler_scale)
            return True
        self.skip(
            step,
            tasks,
            f"non-finite values: {reason}",
            ("", "nonfinite"),
            f"step {step} skipped because {reason}; training continues. Skipped steps are "
            "in cp.skipped and the log. Lower the learning rate or check the data if this "
            "repeats.",
        )
        return True

    def skip_scaler_overflow(self, step: int, tasks: Sequence[Task], scale: float) -> None:
        """Skip a step whose ``GradScaler`` found inf/NaN gradients."""
        reason = loop_checks.scaler_skipped(scale)
        self.skip(
            step,
            tasks,
            f"non-finite values: {reason}",
            ("", "grad_scaler"),
            f"step {step} skipped because {reason}; training continues. Skipped steps are "
            "in cp.skipped and the log.",
        )

    def skip(
        self,
        step: int,
        tasks: Sequence[Task],
        reason: str,
        kind: tuple[str, str],
        message: str,
        stacklevel: int = 6,
    ) -> None:
        """Record step ``step`` as skipped for ``reason``; warn ``message`` once per ``kind``."""
        self._planner.drop([t.quantity.key for t in tasks if t.phase == "end"])
        record = {
            "kind": "skipped",
            "step": step,
            "quantities": sorted({t.quantity.key for t in tasks}),
            "reason": reason,
        }
        self.skipped.append(record)
        self._emit(record)
        self._warn_once(kind, message, stacklevel=stacklevel)

    def check_serializable(self, step: int, values: Mapping[str, Any]) -> None:
        """Record an error (phase ``serialize``) for each value the log cannot write as it is."""
        for key, value in values.items():
            notes = unserializable_notes(value)
            if not notes:
                continue
            more = f"; and {len(notes) - 3} more" if len(notes) > 3 else ""
            shown = "; ".join(notes[:3]) + more
            record = {
                "kind": "error",
                "step": step,
                "quantity": key,
                "phase": "serialize",
                "error": f"UnserializableValue: {shown}",
                "traceback": [],
            }
            self.errors.append(record)
            self._emit(record)
            self.warn_once(
                (key, "unserializable"),
                f"the value of quantity '{key}' at step {step} cannot be logged as it is "
                f"({shown}); training continues. The error (phase 'serialize') is in "
                "cp.errors and the log; see docs/log_format.md for what can be logged.",
            )

    def state_dict(self) -> dict[str, Any]:
        """The errors, skipped steps and warned-once kinds so far (plain data, for a checkpoint)."""
        return {
            "errors": [dict(r) for r in self.errors],
            "skipped": [dict(r) for r in self.skipped],
            "warned": sorted([a, b] for a, b in self._warned),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: earlier records kept, warnings not repeated."""
        self.errors[:0] = [dict(r) for r in state.get("errors", ())]
        self.skipped[:0] = [dict(r) for r in state.get("skipped", ())]
        self._warned |= {(str(a), str(b)) for a, b in state.get("warned", ())}

    def warn_once(self, kind: tuple[str, str], message: str, stacklevel: int = 5) -> None:
        """Warn ``message`` the first time a problem of ``kind`` occurs in this run.

        The warning points at the first caller outside cockpit (the user's ``with``
        block); ``stacklevel`` is kept for callers that pass it and is not used.
        """
        self._warn_once(kind, f"{message[0].upper()}{message[1:]}", stacklevel)

    def _warn_once(self, kind: tuple[str, str], message: str, stacklevel: int = 0) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(f"cockpit: {message}", CockpitWarning, stacklevel=_outside_cockpit())


_INTERNAL = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.abspath(contextlib.__file__),
)


def _outside_cockpit() -> int:
    """The ``stacklevel`` of the first frame outside cockpit_core (and ``contextlib``)."""
    frame: FrameType | None = sys._getframe(2)  # the caller of _warn_once's caller's warn
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level
