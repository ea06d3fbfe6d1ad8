"""The runs a web view shows: from the paths given on the command line to the page's data.

:func:`find_logs` turns ``RUN_DIR`` and log arguments into ``(path, label)`` pairs;
:class:`Feed` follows each log (:class:`~cockpit_core.web.follow.LogFollower`) and gives the
page's data (:meth:`Feed.payload`): the panels' plotly figures, a status per run and the
runs' findings (:mod:`cockpit_core.web.findings`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cockpit_core.errors import CockpitError
from cockpit_core.web import findings as web_findings
from cockpit_core.web.arrays import HEATMAP_COLUMNS
from cockpit_core.web.follow import LogFollower
from cockpit_core.web.panels import TOPICS, figures

LOG_NAMES = ("log.jsonl", "output.json")
"""Files looked for in a run folder, in this order; else its only ``*.jsonl`` file."""


class RunNotFoundError(CockpitError, FileNotFoundError):
    """A path given as a run is neither a log nor a folder holding one."""


def _log_in(folder: Path) -> list[Path]:
    for name in LOG_NAMES:
        if (folder / name).is_file():
            return [folder / name]
    return sorted(folder.glob("*.jsonl"))


def find_logs(paths: Sequence[str | os.PathLike]) -> list[tuple[Path, str]]:
    """``(log, label)`` of each run: a log file, or a run folder holding one.

    A folder gives its ``log.jsonl``, else its ``output.json``, else each of its ``*.jsonl``
    files. A ``.jsonl`` path that does not exist yet is followed from when it appears (start
    the view before training). Labels are the folder names (the file names of loose logs),
    made unique.

    Raises:
        RunNotFoundError: A path is neither.

    """
    found: list[tuple[Path, str]] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            logs = _log_in(path)
            if not logs:
                raise RunNotFoundError(
                    f"{path} holds no cockpit log (looked for {', '.join(LOG_NAMES)} and *.jsonl)."
                )
            for log in logs:
                label = path.resolve().name if len(logs) == 1 else f"{path.name}/{log.stem}"
                found.append((log, label))
        elif path.is_file() or (path.suffix == ".jsonl" and path.parent.is_dir()):
            label = path.parent.resolve().name if path.stem in ("log", "output") else path.stem
            found.append((path, label or path.stem))
        else:
            raise RunNotFoundError(f"{path} is neither a cockpit log nor a run folder.")
    labels = [label for _, label in found]
    return [(log, label if labels.count(label) == 1 else str(log)) for log, label in found]


class Feed:
    """Several runs followed together; :meth:`payload` is what the page shows.

    Safe to call from several threads (the server's): one poll at a time.

    Args:
        paths: Logs or run folders (see :func:`find_logs`).
        title: Page title (default: the runs' labels).
        max_points: Points per series at most.
        heatmap_columns: Steps of a gradient histogram heat map at most (see
            :class:`~cockpit_core.web.arrays.HistogramTrack`).
        labels: The runs' names in legends, one per log found (default: see
            :func:`find_logs`).
        diagnose: Also run the installed diagnoses over each log when the data changes
            (:func:`cockpit_core.diagnose.diagnose`); else show only the findings the logs
            recorded while training.

    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        title: str | None = None,
        max_points: int = 2000,
        labels: Sequence[str] | None = None,
        diagnose: bool = False,
        heatmap_columns: int = HEATMAP_COLUMNS,
    ):
        logs = find_logs(paths)
        if not logs:
            raise RunNotFoundError("no run given.")
        if labels is not None:
            if len(labels) != len(logs):
                raise ValueError(f"{len(labels)} labels for {len(logs)} logs.")
            logs = [(log, str(label)) for (log, _), label in zip(logs, labels)]
        self.runs = [LogFollower(path, label, heatmap_columns) for path, label in logs]
        self.title = title or "cockpit: " + ", ".join(run.label for run in self.runs)
        self.max_points = max_points
        self.diagnose = diagnose
        self.version = 0
        self._lock = threading.Lock()
        self._payload: dict[str, Any] | None = None

    def poll(self) -> bool:
        """Read what every log appended; ``True`` if anything new arrived."""
        with self._lock:
            changed = [run.poll() for run in self.runs]
            if any(changed) or self._payload is None:
                self.version += 1
                self._payload = None
            return any(changed)

    def payload(self) -> dict[str, Any]:
        """The page's data after a :meth:`poll`: panels, runs and a version number.

        ``{"version", "title", "updated", "points", "topics", "runs": [{"label", "path",
        "records", "last_step", "error"}], "panels": [...], "findings": [...]}`` with the
        panels of :func:`cockpit_core.web.panels.figures` (each finding's steps shaded on
        the panels of the quantities its diagnosis reads) and the findings of
        :func:`cockpit_core.web.findings.entries`; ``points`` counts every value shown.
        """
        self.poll()
        with self._lock:
            if self._payload is None:
                panels = figures(self.runs, self.max_points)
                found = web_findings.entries(
                    [(run.label, self._findings(run)) for run in self.runs],
                    panels,
                    web_findings.diagnosis_reads(),
                )
                web_findings.mark(panels, found)
                self._payload = {
                    "version": self.version,
                    "title": self.title,
                    "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "points": sum(panel["points"] for panel in panels),
                    "topics": list(TOPICS),
                    "runs": [
                        {
                            "label": run.label,
                            "path": str(run.path),
                            "records": run.records,
                            "last_step": run.last_step,
                            "error": run.error,
                        }
                        for run in self.runs
                    ],
                    "panels": panels,
                    "findings": found,
                }
            return self._payload

    def _findings(self, run: LogFollower) -> list[dict[str, Any]]:
        """The run's logged findings, and with ``diagnose`` those found in its log now."""
        if not self.diagnose:
            return list(run.findings.values())
        from cockpit_core.diagnose import diagnose
        from cockpit_core.log import LogFormatError

        try:  # the logged ones are included (each id once)
            return [f.to_record() for f in diagnose(run.path)]
        except (OSError, LogFormatError) as err:  # not there yet, or being written
            run.error = run.error or f"diagnoses not run: {err}"
            return list(run.findings.values())
