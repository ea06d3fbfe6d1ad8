"""The cockpit dashboard as a TensorBoard image, refreshed every N steps."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from cockpit_dashboard import render
from cockpit_dashboard.image import figure_rgb

from cockpit_core.log import LogData


class DashboardImages:
    """Keeps a copy of the records and renders the dashboard when it is due.

    An image is due when the newest step of the quantities' values is at least ``every``
    steps past the previous image (the first tracked step counts as the previous image, so
    a dashboard with a single step is never drawn), and at the end of the run if anything
    arrived since the last image. Rendering takes about a second at ``dpi=100``.

    Args:
        every: Steps between images (``>= 1``).
        dpi: Resolution of the image (pixels per inch of the dashboard's figure).

    """

    def __init__(self, every: int, dpi: int = 60):
        if every < 1:
            raise ValueError(f"image_every must be >= 1 here, got {every}.")
        self.every = every
        self.dpi = dpi
        self.data = LogData()
        self._last: int | None = None  # step of the last image (or the first step)
        self._newest: int | None = None
        self._unshown = False

    def add(self, record: Mapping[str, Any]) -> int | None:
        """Take one record; return the step to draw an image for now, or ``None``."""
        self.data.add(record)
        kind = record.get("kind")
        if kind == "metrics":
            self._unshown = True
        elif kind == "values":
            step = int(record["step"])
            self._newest = step if self._newest is None else max(self._newest, step)
            self._unshown = True
            if self._last is None:
                self._last = step
            elif self._newest - self._last >= self.every:
                return self._newest
        return None

    def final_step(self) -> int | None:
        """The step of the closing image, ``None`` if nothing arrived since the last one."""
        if not self._unshown:
            return None
        return self._newest if self._newest is not None else max(self.data.output, default=0)

    def image(self) -> np.ndarray:
        """Render the dashboard of every record so far: ``uint8[height, width, 3]`` (RGB)."""
        self.data.output = dict(sorted(self.data.output.items()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a failing panel is already shown in the picture
            figure = render(self.data, None, dpi=self.dpi)
        self._last = self._newest
        self._unshown = False
        return figure_rgb(figure)
