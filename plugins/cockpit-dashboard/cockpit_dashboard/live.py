"""Live mode: a sink that re-renders the dashboard into a file every N steps.

By default the picture is rendered in the training process, which then waits about a
second per picture. With ``background=True`` a renderer process does the drawing: it is
forked at the first picture with the records so far, and afterwards the training process
only hands it the new records (one pipe write per refresh, read at once by a thread of the
renderer); pictures requested while it is still drawing are merged into one. The renderer
runs at a lower priority (``nice`` 10), so it takes the cores training leaves idle. Forking
is used where it is safe and cheap (Linux); elsewhere the pictures are rendered in the
training process as before.
``benchmarks/live_mode.py`` measures both (``benchmarks/results/live_mode.md``).

:func:`live_plot_sink` builds the sink ``live_plot`` (options :class:`LivePlotConfig`) that
``Cockpit(live_plot=PATH, live_every=N)`` asks for: a background :class:`LivePlot`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cockpit_core.errors import CockpitWarning
from cockpit_core.log import LogData
from cockpit_core.plugin.registry import default_registry
from cockpit_dashboard.layout import check_path, render

CLOSE_TIMEOUT = 300.0
"""Seconds :meth:`LivePlot.close` waits for the renderer process's last picture."""

_Message = tuple[list[dict[str, Any]], bool, bool]
"""What the training process sends the renderer: ``(records, render, stop)``."""


def can_render_in_background() -> bool:
    """Whether ``background=True`` uses a renderer process here (fork on Linux)."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


class LivePlot:
    """A sink (``sink(record)``) that refreshes a dashboard picture while training runs.

    It keeps its own copy of the records (metrics of ``cp.log``, quantities added with
    ``cp.add`` and the diagnoses' findings included) and renders to ``path`` whenever the newest step of the
    quantities' values is ``every`` steps past the last picture, and once more on
    :meth:`close`. The file is
    replaced atomically, so an image viewer that reloads changed files shows the current
    dashboard. Rendering takes a second or so: choose ``every`` accordingly, or pass
    ``background=True``.

    Args:
        path: Picture to refresh (``.png``, ``.svg`` or ``.pdf``).
        every: Steps between refreshes.
        background: Render in a renderer process, so training does not wait for pictures
            (see the module's description); :attr:`renders` then counts the pictures the
            renderer finished, and :meth:`close` waits for the last one.
        **render_options: Passed to :func:`cockpit_dashboard.render` (``registry``,
            ``instruments``, ``rows``, ``dpi`` ...; ``diagnose=False``: each picture shows
            only the recorded findings instead of running the diagnoses over the records).

    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        every: int = 50,
        *,
        background: bool = False,
        **render_options: Any,
    ):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"live plot: every must be an integer >= 1, got {every!r}.")
        check_path(path)
        self.path = Path(path)
        self.every = every
        self.background = bool(background) and can_render_in_background()
        self.render_options = render_options
        self.data = LogData()
        self.renders = 0
        self._last: int | None = None
        self._newest: int | None = None
        self._unshown_metrics = False  # metrics or findings arrived since the last picture
        self._renderer: _Renderer | None = None
        self._unsent: list[dict[str, Any]] = []  # records the renderer has not seen yet

    def __call__(self, record: dict[str, Any]) -> None:
        """Take one record; re-render when enough new steps arrived."""
        due = self._take(record)
        if self._renderer is not None:
            self._unsent.append(record)
            self._collect()
        if due:
            self._request()

    def _take(self, record: dict[str, Any]) -> bool:
        """Add ``record`` to :attr:`data`; ``True`` if a picture is due."""
        self.data.add(record)
        kind = record.get("kind")
        if kind in ("metrics", "finding"):  # drawn by the next picture, on close() at the latest
            self._unshown_metrics = True
        elif kind == "values":
            step = int(record["step"])
            self._newest = step if self._newest is None else max(self._newest, step)
            return self._last is None or self._newest - self._last >= self.every
        return False

    def _request(self) -> None:
        """A picture is due: draw it here, or hand it to the renderer process."""
        if not self.background:
            self.refresh()
            return
        if self._renderer is None:
            try:
                self._renderer = _Renderer(self)  # forked with the records so far
            except OSError as err:  # no process to be had (memory, limits): draw here
                warnings.warn(
                    f"live plot: no renderer process ({err}); drawing in this process",
                    CockpitWarning,
                    stacklevel=3,
                )
                self.background = False
                self.refresh()
                return
        else:
            self._renderer.send(self._unsent, render=True)
        self._unsent = []
        self._last = self._newest
        self._unshown_metrics = False

    def _collect(self, wait: bool = False) -> None:
        """Count the pictures the renderer finished; warn about the ones that failed."""
        if self._renderer is None:
            return
        renders, failures = self._renderer.collect(wait)
        self.renders = max(self.renders, renders)
        for message in failures:
            warnings.warn(
                f"live plot: rendering {self.path} failed: {message}", CockpitWarning, stacklevel=3
            )

    def refresh(self) -> Path:
        """Render the dashboard now, in this process."""
        self.data.output = dict(sorted(self.data.output.items()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a failing panel is already shown in the picture
            render(self.data, self.path, **self.render_options)
        self._last = self._newest
        self._unshown_metrics = False
        self.renders += 1
        return self.path

    def close(self) -> None:
        """Render the final picture (if anything arrived since the last one).

        In background mode this waits until the renderer process has drawn it and ended.
        """
        if (self._newest is not None and self._newest != self._last) or self._unshown_metrics:
            self._request()
        if self._renderer is not None:
            self._renderer.send(self._unsent, stop=True)
            self._unsent = []
            self._collect(wait=True)
            self._renderer = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_renderer": None, "_unsent": []}

    def __repr__(self) -> str:
        return f"LivePlot({str(self.path)!r}, every={self.every})"


class LivePlotConfig(BaseModel):
    """Options of the ``live_plot`` sink."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="Picture to refresh (.png, .svg or .pdf).")
    every: int = Field(50, ge=1, description="Steps between refreshes.")


def live_plot_sink(path: str, every: int = 50) -> LivePlot:
    """The ``live_plot`` sink: a :class:`LivePlot` drawing in a renderer process.

    Its panels and diagnoses are those of every installed plugin
    (:func:`~cockpit_core.plugin.registry.default_registry`).

    Args:
        path: Picture to refresh (``.png``, ``.svg`` or ``.pdf``).
        every: Steps between refreshes.

    Raises:
        ValueError: ``path`` has another suffix, or ``every`` is below 1.

    """
    return LivePlot(path, every=every, registry=default_registry(), background=True)


class _Renderer:
    """The renderer process of a background :class:`LivePlot` and the pipes to it."""

    def __init__(self, live: LivePlot):
        context = multiprocessing.get_context("fork")
        self._inbox, self._outbox = context.Pipe(duplex=False)  # training -> renderer
        self._replies, reply_end = context.Pipe(duplex=False)  # renderer -> training
        self.renders = 0
        self.process = context.Process(
            target=_render_loop,
            args=(live, self._inbox, reply_end),
            name="cockpit-live-plot",
            daemon=True,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
            self.process.start()
        reply_end.close()
        self._inbox.close()

    def send(self, records: list[dict[str, Any]], render: bool = False, stop: bool = False) -> None:
        """Hand over new records; ask for a picture and/or for the process to end."""
        try:
            self._outbox.send((records, render, stop))
        except (BrokenPipeError, OSError):  # the renderer died: collect() reports it
            pass

    def collect(self, wait: bool = False) -> tuple[int, list[str]]:
        """Pictures finished so far and failure messages; with ``wait`` until it ended."""
        failures: list[str] = []
        deadline = time.monotonic() + CLOSE_TIMEOUT
        self._read_replies(failures)
        while wait and self.process.is_alive():  # reading on, so its replies never block it
            if time.monotonic() > deadline:
                self.process.terminate()
                failures.append(f"no picture within {CLOSE_TIMEOUT:.0f} s; renderer stopped")
                break
            self.process.join(0.05)
            self._read_replies(failures)
        if wait:
            self.process.join()
            self._read_replies(failures)
            if self.process.exitcode not in (0, None) and not failures:
                failures.append(f"the renderer process exited with {self.process.exitcode}")
            self._outbox.close()
            self._replies.close()
        return self.renders, failures

    def _read_replies(self, failures: list[str]) -> None:
        try:
            while self._replies.poll():
                renders, failure = self._replies.recv()
                self.renders = max(self.renders, renders)
                if failure:
                    failures.append(failure)
        except (EOFError, OSError):  # the renderer ended
            pass


def _drain(inbox: Any, pending: queue.Queue[_Message | None]) -> None:
    """Renderer thread: read the pipe at once, so the training process never waits on it."""
    try:
        while True:
            message = inbox.recv()
            pending.put(message)
            if message[2]:  # stop
                return
    except (EOFError, OSError):  # the training process ended without close()
        pending.put(None)


def _render_loop(live: LivePlot, inbox: Any, replies: Any) -> None:
    """The renderer process: draw the first picture, then take records until told to stop."""
    live.background = False
    live._renderer = None
    with contextlib.suppress(OSError, AttributeError):  # training first: it keeps its cores
        os.nice(10)
    pending: queue.Queue[_Message | None] = queue.Queue()  # None: the training process ended
    threading.Thread(target=_drain, args=(inbox, pending), daemon=True).start()
    render, stop = True, False
    while True:
        if render:
            try:
                live.refresh()
                replies.send((live.renders, None))
            except Exception as err:  # reported to the training process as a warning
                replies.send((live.renders, f"{err} ({type(err).__name__})"))
        if stop:
            return
        message = pending.get()
        records: list[dict[str, Any]] = []
        render = False
        while message is not None:  # requests that queued up: one picture for all
            records += message[0]
            render, stop = render or message[1], message[2]
            if stop or pending.empty():
                break
            message = pending.get()
        if message is None:
            return
        for record in records:
            live._take(record)
