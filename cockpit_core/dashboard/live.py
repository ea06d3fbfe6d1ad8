"""Live mode: a sink that re-renders the dashboard into a file every N steps."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from cockpit_core.log import LogData
from cockpit_core.metrics import METRICS_KEY


class LivePlot:
    """A sink (``sink(record)``) that refreshes a dashboard picture while training runs.

    It keeps its own copy of the records (metrics of ``cp.log`` and quantities added with
    ``cp.add`` included) and renders to ``path`` whenever the newest step of the
    quantities' values is ``every`` steps past the last picture, and once more on
    :meth:`close`. The file is
    replaced atomically, so an image viewer that reloads changed files shows the current
    dashboard. Rendering takes a second or so: choose ``every`` accordingly.

    Args:
        path: Picture to refresh (``.png``, ``.svg`` or ``.pdf``).
        every: Steps between refreshes.
        **render_options: Passed to :func:`cockpit_core.dashboard.render` (``registry``,
            ``instruments``, ``rows``, ``dpi`` ...).

    """

    def __init__(self, path: str | os.PathLike, every: int = 50, **render_options: Any):
        from cockpit_core.dashboard.layout import _check_path

        if not isinstance(every, int) or every < 1:
            raise ValueError(f"live plot: every must be an integer >= 1, got {every!r}.")
        _check_path(path)
        self.path = Path(path)
        self.every = every
        self.render_options = render_options
        self.data = LogData()
        self.renders = 0
        self._last: int | None = None
        self._newest: int | None = None
        self._unshown_metrics = False  # metrics arrived since the last picture

    def __call__(self, record: dict[str, Any]) -> None:
        """Take one record; re-render when enough new steps arrived."""
        kind = record.get("kind")
        if kind == "header":
            self.data.header = {k: v for k, v in record.items() if k != "kind"}
        elif kind == "error":
            self.data.errors.append(dict(record))
        elif kind == "skipped":
            self.data.skipped.append(dict(record))
        elif kind == "metrics":
            row = self.data.output.setdefault(int(record["step"]), {})
            row[METRICS_KEY] = {**row.get(METRICS_KEY, {}), **record["metrics"]}
            self._unshown_metrics = True
        elif kind == "quantity_added":
            quantities = list(self.data.header.get("quantities") or [])
            quantities.append({**record["quantity"], "added_at": record["step"]})
            self.data.header = {**self.data.header, "quantities": quantities}
        elif kind == "values":
            step = int(record["step"])
            self.data.output.setdefault(step, {}).update(record["values"])
            self._newest = step if self._newest is None else max(self._newest, step)
            if self._last is None or self._newest - self._last >= self.every:
                self.refresh()

    def refresh(self) -> Path:
        """Render the dashboard now."""
        from cockpit_core.dashboard.layout import render

        self.data.output = dict(sorted(self.data.output.items()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a failing panel is already shown in the picture
            render(self.data, self.path, **self.render_options)
        self._last = self._newest
        self._unshown_metrics = False
        self.renders += 1
        return self.path

    def close(self) -> None:
        """Render the final picture (if anything arrived since the last one)."""
        if (self._newest is not None and self._newest != self._last) or self._unshown_metrics:
            self.refresh()

    def __repr__(self) -> str:
        return f"LivePlot({str(self.path)!r}, every={self.every})"
