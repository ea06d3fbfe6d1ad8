"""The runs a web view shows: from the paths given on the command line to the page's data.

:func:`find_logs` turns ``RUN_DIR`` and log arguments into ``(path, label)`` pairs;
:class:`Feed` follows each log (:class:`~cockpit_web.follow.LogFollower`) and gives the
page's data (:meth:`Feed.payload`): the panels' plotly figures, a status per run and the
runs' findings (:mod:`cockpit_web.findings`).

The findings are those of ``cockpit diagnose``: the installed diagnoses run over what each
follower keeps for them (fed record by record as the log grows, like the online
:class:`~cockpit_core.diagnosing.runner.DiagnosisRunner`: the quantities they read, of the
latest :data:`~cockpit_web.follow.DIAGNOSE_STEPS` steps; the log is never read again)
and the findings it recorded while training, each once. While a log grows they run
again, but after a run that took ``t`` seconds not before ``t / DIAGNOSE_SHARE`` seconds
have passed, so they take at most a tenth of the server's time; in between the page shows
the previous findings.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cockpit_core.errors import CockpitError
from cockpit_web import findings as web_findings
from cockpit_web.arrays import HEATMAP_COLUMNS
from cockpit_web.follow import LogFollower
from cockpit_web.panel import Layout
from cockpit_web.panels import figures

DIAGNOSE_SHARE = 0.1
"""Share of the time the diagnoses of a growing log may take (see the module's description)."""

LOG_NAMES = ("log.jsonl", "output.json")
"""Files looked for in a run folder, in this order; else its only ``*.jsonl`` file."""


class RunNotFoundError(CockpitError, FileNotFoundError):
    """A path given as a run is neither a log nor a folder holding one."""


def _log_in(folder: Path) -> list[Path]:
    for name in LOG_NAMES:
        if (folder / name).is_file():
            return [folder / name]
    return sorted(folder.glob("*.jsonl"))


def find_logs(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[Path, str]]:
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
            :class:`~cockpit_web.arrays.HistogramTrack`).
        labels: The runs' names in legends, one per log found (default: see
            :func:`find_logs`).
        diagnose: Run the installed diagnoses over each log, again when it grew (at most
            :data:`DIAGNOSE_SHARE` of the time; see the module's description), as
            ``cockpit diagnose`` does; ``False``: show only the findings the logs recorded
            while training.
        registry: Where the panels' instruments come from
            (:class:`~cockpit_web.panel.Layout`; default: every installed plugin's).

    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        title: str | None = None,
        max_points: int = 2000,
        labels: Sequence[str] | None = None,
        diagnose: bool = True,
        heatmap_columns: int = HEATMAP_COLUMNS,
        registry: Any = None,
    ):
        logs = find_logs(paths)
        if not logs:
            raise RunNotFoundError("no run given.")
        if labels is not None:
            if len(labels) != len(logs):
                raise ValueError(f"{len(labels)} labels for {len(logs)} logs.")
            logs = [(log, str(label)) for (log, _), label in zip(logs, labels)]
        self.layout = Layout.of(registry)
        self.runs = [
            LogFollower(path, label, heatmap_columns, max_points, diagnose, self.layout)
            for path, label in logs
        ]
        self.title = title or "cockpit: " + ", ".join(run.label for run in self.runs)
        self.max_points = max_points
        self.diagnose = diagnose
        self.version = 0
        self._lock = threading.Lock()
        self._payload: dict[str, Any] | None = None
        self._diagnosed: dict[int, _Diagnosed] = {}  # by index of the run
        self._stale: set[int] = set(range(len(self.runs)))  # logs grown since diagnosed

    def poll(self) -> bool:
        """Read what every log appended; ``True`` if anything new arrived.

        The page's data is also made anew when the findings of a log that grew are due to
        be brought up to date (see :data:`DIAGNOSE_SHARE`).
        """
        with self._lock:
            changed = [run.poll() for run in self.runs]
            self._stale.update(i for i, grew in enumerate(changed) if grew)
            if any(changed) or self._payload is None or self._diagnoses_due():
                self.version += 1
                self._payload = None
            return any(changed)

    def _diagnoses_due(self) -> bool:
        """Whether a log grew since its diagnoses ran and they may run again now."""
        if not self.diagnose:
            return False
        now = time.monotonic()
        return any(i in self._diagnosed and now >= self._diagnosed[i].due for i in self._stale)

    def payload(self) -> dict[str, Any]:
        """The page's data after a :meth:`poll`: panels, runs and a version number.

        ``{"version", "title", "updated", "points", "topics", "runs": [{"label", "path",
        "records", "last_step", "error", "skipped", "problems"}], "panels": [...], "findings": [...]}`` with the
        panels of :func:`cockpit_web.panels.figures` (each finding's steps shaded on
        the panels of the quantities its diagnosis reads) and the findings of
        :func:`cockpit_web.findings.entries`; ``points`` counts every value shown.
        """
        self.poll()
        with self._lock:
            if self._payload is None:
                panels = figures(self.runs, self.max_points, self.layout)
                diagnosed = [self._findings(i) for i in range(len(self.runs))]
                found = web_findings.entries(
                    [(run.label, d.found) for run, d in zip(self.runs, diagnosed)],
                    panels,
                    web_findings.diagnosis_reads(),
                )
                web_findings.mark(panels, found)
                self._payload = {
                    "version": self.version,
                    "title": self.title,
                    "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "points": sum(panel["points"] for panel in panels),
                    "topics": list(self.layout.topics),
                    "runs": [
                        {
                            "label": run.label,
                            "path": str(run.path),
                            "records": run.records,
                            "last_step": run.last_step,
                            "error": run.error,
                            "skipped": run.skipped,
                            "problems": d.problems,
                        }
                        for run, d in zip(self.runs, diagnosed)
                    ],
                    "panels": panels,
                    "findings": found,
                    "finding_groups": web_findings.groups(found),
                }
            return self._payload

    def _findings(self, index: int) -> _Diagnosed:
        """The findings of run ``index``: its log's, and with ``diagnose`` those found in it.

        The diagnoses run again when the log grew and they are due (see
        :data:`DIAGNOSE_SHARE`); until then the findings of their last run are kept.
        """
        run = self.runs[index]
        logged = [{k: v for k, v in f.items() if k != "kind"} for f in run.findings.values()]
        if not self.diagnose:
            return _Diagnosed(logged)
        last = self._diagnosed.get(index)
        if last is not None and (index not in self._stale or time.monotonic() < last.due):
            return last
        import warnings

        from cockpit_core.diagnosing.findings import as_findings, merge
        from cockpit_core.errors import CockpitWarning

        start = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = run.diagnosed()  # over the follower's window: nothing read again
        problems = [
            str(w.message).removeprefix("cockpit: ")
            for w in caught
            if issubclass(w.category, CockpitWarning)
        ]
        if last is not None:  # a diagnosis that failed once is skipped from then on
            problems = list(dict.fromkeys([*last.problems, *problems]))
        recorded = list({f.id: f for f in as_findings(run.findings.values())}.values())
        now = time.monotonic()
        self._stale.discard(index)
        self._diagnosed[index] = _Diagnosed(
            [f.to_record() for f in merge(found, recorded)],
            problems,
            now + (now - start) / DIAGNOSE_SHARE,
        )
        return self._diagnosed[index]


class _Diagnosed:
    """A run's findings (``finding`` records), the diagnoses that failed, when to rerun."""

    def __init__(self, found: list[dict[str, Any]], problems: Sequence[str] = (), due: float = 0):
        self.found = found
        self.problems = list(problems)
        self.due = due
