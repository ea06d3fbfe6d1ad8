"""Wall-clock time of each tracked step."""

import time

from cockpit_core import Quantity, StepContext


class Time(Quantity):
    """Wall-clock time (``time.time()``, seconds since the epoch) when the step's backward ended."""

    name = "time"

    def compute(self, ctx: StepContext) -> float:
        """Return the current time."""
        return time.time()
