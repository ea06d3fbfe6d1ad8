"""What cockpit costs: the time of each step's block, of cockpit's own code, and of a plain step.

A :class:`CostMeter` (``tracker.cost``) is fed by every ``with cp(step, ...)`` block: the
clock at the start and end of ``__enter__`` and of ``__exit__``, and the compute time of each
quantity. A step is *tracked* when cockpit computes something at it (quantity phases or
statistics), else *untracked*. The meter keeps the medians of the last ``keep`` untracked
steps' block time (start of ``__enter__`` to end of ``__exit__``) and iteration time (start
of ``__enter__`` to the start of the next step's ``__enter__``): what a step costs with
cockpit doing (almost) nothing.

For each tracked step it emits one ``cost`` record, when the next step enters (then the
step's iteration time is known) or at :meth:`CostMeter.close` (iteration unknown, ``None``).
The fields are described in ``docs/log_format.md``. Measuring costs a few clock reads per
step, so it is always on.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Record = dict[str, Any]

KEEP_PLAIN = 64
"""How many untracked steps the medians of a plain step's times are taken over."""


@dataclass
class _Step:
    """One finished block, waiting for the next step's entry to know its iteration time."""

    step: int
    started: float
    tracked: bool
    block_s: float = 0.0
    cockpit_s: float = 0.0
    untracked_before: int = 0
    quantities_s: dict[str, float] = field(default_factory=dict)


class CostMeter:
    """Measures each step's block, cockpit's own time in it, and a plain (untracked) step.

    Args:
        emit: Where each ``cost`` record goes (the tracker's ``emit``).
        clock: Seconds as a float, increasing (default :func:`time.perf_counter`).
        keep: How many of the latest untracked steps the plain medians use.

    """

    def __init__(
        self,
        emit: Callable[[Record], None],
        clock: Callable[[], float] = time.perf_counter,
        keep: int = KEEP_PLAIN,
    ):
        self.emit = emit
        self.clock = clock
        self._blocks: deque[float] = deque(maxlen=keep)
        self._iterations: deque[float] = deque(maxlen=keep)
        self._active: _Step | None = None
        self._entered_at = 0.0  # end of the active step's __enter__
        self._finished: _Step | None = None  # the last finished block
        self._untracked = 0  # untracked blocks since the last tracked one

    @property
    def plain_block_s(self) -> float | None:
        """Median block time of the latest untracked steps (``None`` before the first)."""
        return statistics.median(self._blocks) if self._blocks else None

    @property
    def plain_iteration_s(self) -> float | None:
        """Median iteration time of the latest untracked steps (``None`` before one is known)."""
        return statistics.median(self._iterations) if self._iterations else None

    def entered(self, step: int, started: float, tracked: bool) -> None:
        """The block of ``step`` was entered at ``started`` (a :attr:`clock` reading).

        Ends the previous step's iteration at ``started`` (emitting its ``cost`` record if it
        was tracked), then reads the clock: the end of ``__enter__``.
        """
        previous, self._finished = self._finished, None
        if previous is not None:
            iteration = started - previous.started
            if previous.tracked:
                self.emit(self._record(previous, iteration))
            else:
                self._iterations.append(iteration)
        self._active = _Step(int(step), started, bool(tracked))
        self._entered_at = self.clock()

    def quantity(self, key: str, seconds: float) -> None:
        """Add ``seconds`` of compute time of quantity ``key`` to the active step."""
        if self._active is not None:
            spent = self._active.quantities_s
            spent[key] = spent.get(key, 0.0) + float(seconds)

    def exited(self, exit_started: float) -> None:
        """The active block's ``__exit__`` began at ``exit_started`` and ends now (a clock read)."""
        step, self._active = self._active, None
        if step is None:
            return
        ended = self.clock()
        step.block_s = ended - step.started
        step.cockpit_s = (self._entered_at - step.started) + (ended - exit_started)
        if step.tracked:
            step.untracked_before, self._untracked = self._untracked, 0
        else:
            self._blocks.append(step.block_s)
            self._untracked += 1
        self._finished = step

    def discard(self) -> None:
        """Forget the active step (its block raised): it is neither tracked nor plain."""
        self._active = None

    def close(self) -> None:
        """Emit the record of the last step if it was tracked (its iteration unknown)."""
        last, self._finished = self._finished, None
        if last is not None and last.tracked:
            self.emit(self._record(last, None))

    def _record(self, step: _Step, iteration: float | None) -> Record:
        return {
            "kind": "cost",
            "step": step.step,
            "block_s": step.block_s,
            "cockpit_s": step.cockpit_s,
            "iteration_s": iteration,
            "plain_block_s": self.plain_block_s,
            "plain_iteration_s": self.plain_iteration_s,
            "untracked_before": step.untracked_before,
            "quantities_s": dict(step.quantities_s),
        }
