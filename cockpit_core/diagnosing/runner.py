"""Diagnoses while training: a :class:`DiagnosisRunner` follows the records a run emits.

The runner keeps a bounded window of what its diagnoses read (the latest ``max_steps``
tracked steps of the quantities in their ``reads``, the ``skipped`` records, and the
``cost`` records if a diagnosis reads them) and runs the diagnoses over it. Each check looks
at the whole window, so checking at every step would cost ``O(window)`` per step; the runner
checks once every ``len(window) // CHECKS_PER_WINDOW`` new steps (every step while the
window is short, every 25th at the full 500), so rules cost a bounded amount per step
(``benchmarks/results/diagnoses_online.md``), and always once more at
:meth:`DiagnosisRunner.finish`.

Diagnoses that an ``on_finding`` schedule follows (capture on trigger,
:mod:`cockpit_core.diagnosing.triggers`) are checked at every new step instead
(:meth:`DiagnosisRunner.check_every_step`): their findings turn quantities on for the next
steps, so they must arrive at the step that shows them. Only they run then; the others keep
their pace.

Each finding is reported once, by id. A finding seen again later (a longer stretch of the
same condition) updates the stored one; so does one of the same diagnosis and kind whose
stretch overlaps a reported one after the window slid past its first step (its id would
name the window's start). :meth:`DiagnosisRunner.finish` returns the reported findings that
changed since they were reported, so that the log ends with their whole stretch.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cockpit_core.diagnosing.run import run_checks
from cockpit_core.diagnosis import Diagnosis, Finding, Window

CHECKS_PER_WINDOW = 20
"""A full check runs after ``len(window) // CHECKS_PER_WINDOW`` new steps (at least 1)."""


class DiagnosisRunner:
    """Runs diagnoses while training, on the records a run emits.

    A diagnosis that raises is warned about once and not run again.

    Args:
        diagnoses: The diagnoses to run.
        max_steps: How many of the latest tracked steps the window keeps (values and
            ``cost`` records each).
        every_step: Check at every new step instead of every ``len(window) //
            CHECKS_PER_WINDOW`` steps (for tests and tiny windows).
        check_online: Check while records come in; ``False`` only keeps the window (the
            web view checks it when a page asks: ``run_checks`` over :meth:`window`).

    Attributes:
        reported: Every finding reported so far, by id, as last seen.
        eager: Names of the diagnoses checked at every new step whatever the window's
            length (:meth:`check_every_step`).

    """

    def __init__(
        self,
        diagnoses: Sequence[Diagnosis],
        max_steps: int = 500,
        every_step: bool = False,
        check_online: bool = True,
    ):
        self.diagnoses = list(diagnoses)
        self.max_steps = max_steps
        self.every_step = every_step
        self.check_online = check_online
        self._steps: list[int] = []  # a heap of the window's steps (dropped ones skipped lazily)
        self.reads = {key for d in self.diagnoses for key in d.reads}
        self.reads_cost = any("cost" in d.reads_records for d in self.diagnoses)
        self.output: dict[int, dict[str, Any]] = {}
        self.skipped: list[dict[str, Any]] = []
        self.cost: list[dict[str, Any]] = []
        self.header: dict[str, Any] = {}
        self.reported: dict[str, Finding] = {}
        self.failed: set[str] = set()
        self._emitted: dict[str, Finding] = {}  # each finding as it was reported
        self._new_steps: set[int] = set()  # steps with news since the last check
        self.eager: frozenset[str] = frozenset()

    def check_every_step(self, names: Iterable[str]) -> None:
        """Check the diagnoses ``names`` at every new step (those that triggers follow).

        Each such check looks at the whole window, so it costs ``O(window)`` per step for
        those diagnoses; the others are still checked every ``len(window) //
        CHECKS_PER_WINDOW`` steps.
        """
        self.eager |= frozenset(names)

    def observe(self, record: Mapping[str, Any]) -> list[Finding]:
        """Take one record; return the findings not reported before (each id once)."""
        kind = record.get("kind")
        if kind == "header":
            self.header = {k: v for k, v in record.items() if k != "kind"}
            return []
        if kind == "skipped":
            self.skipped.append(dict(record))
        elif kind == "values":
            kept = {k: v for k, v in record["values"].items() if k in self.reads}
            if not kept:
                return []
            step = int(record["step"])
            if step not in self.output:
                heapq.heappush(self._steps, step)
            self.output.setdefault(step, {}).update(kept)
            while len(self.output) > self.max_steps and self._steps:
                self.output.pop(heapq.heappop(self._steps), None)  # the oldest step
        elif kind == "cost" and self.reads_cost:
            self.cost.append(dict(record))
            del self.cost[: -self.max_steps]
        else:
            return []
        self._new_steps.add(int(record.get("step", -1)))
        if not self.check_online:
            return []
        due = max(1, len(self.output) // CHECKS_PER_WINDOW)
        if self.every_step or len(self._new_steps) >= due:
            return self._check()
        if self.eager:
            return self._check(self.eager)
        return []

    def finish(self) -> tuple[list[Finding], list[Finding]]:
        """Check what came since the last check; return ``(new, changed)`` findings.

        ``changed`` are the findings reported before whose stretch or evidence grew since;
        call it once, when the run ends.
        """
        new = self._check() if self._new_steps else []
        changed = [f for i, f in self.reported.items() if f != self._emitted[i]]
        self._emitted.update((f.id, f) for f in changed)
        return new, changed

    def state_dict(self) -> dict[str, Any]:
        """The window and the findings reported so far (for a checkpoint; may hold numpy)."""
        return {
            "output": {step: dict(values) for step, values in self.output.items()},
            "skipped": [dict(r) for r in self.skipped],
            "cost": [dict(r) for r in self.cost],
            "reported": [f.to_record() for f in self.reported.values()],
            "emitted": [f.to_record() for f in self._emitted.values()],
            "failed": sorted(self.failed),
            "new_steps": sorted(self._new_steps),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: findings already reported are not reported again."""
        self.output = {int(s): dict(v) for s, v in sorted(state.get("output", {}).items())}
        self._steps = sorted(self.output)  # a sorted list is a heap
        self.skipped = [dict(r) for r in state.get("skipped", ())]
        self.cost = [dict(r) for r in state.get("cost", ())]
        reported = [Finding.from_record(r) for r in state.get("reported", ())]
        self.reported = {f.id: f for f in reported}
        self._emitted = {f.id: f for f in map(Finding.from_record, state.get("emitted", ()))}
        self.failed = {str(name) for name in state.get("failed", ())}
        self._new_steps = {int(s) for s in state.get("new_steps", ())}

    def forget(self, step: int) -> None:
        """Drop what the window holds of ``step`` (a resumed run records it anew)."""
        self.output.pop(step, None)  # its heap entry is skipped when it comes up
        if self.skipped:
            self.skipped = [r for r in self.skipped if r.get("step") != step]
        if self.cost:
            self.cost = [r for r in self.cost if r.get("step") != step]

    def window(self) -> Window:
        """What the diagnoses see now: the kept steps, skipped and cost records, the header."""
        return Window(self.output, self.skipped, self.header, self.cost)

    def _check(self, only: frozenset[str] | None = None) -> list[Finding]:
        """Run the diagnoses (``only``: those of these names) over the window; the new findings.

        A check of all of them clears the news; one of ``only`` some leaves it for the rest.
        """
        diagnoses = self.diagnoses
        if only is None:
            self._new_steps.clear()
        else:
            diagnoses = [d for d in diagnoses if d.name in only]
        window = self.window()
        new = []
        for finding in run_checks(diagnoses, window, self.failed):
            if finding.id in self.reported:
                self.reported[finding.id] = finding
                continue
            earlier = self._continued(finding)
            if earlier is not None:  # the window slid past its first step: one finding
                last = max(earlier.last_step, finding.last_step)
                self.reported[earlier.id] = dataclasses.replace(earlier, last_step=last)
                continue
            self.reported[finding.id] = self._emitted[finding.id] = finding
            new.append(finding)
        return new

    def _continued(self, finding: Finding) -> Finding | None:
        """The reported finding of the same kind whose stretch ``finding`` overlaps, if any."""
        kind = finding.id.rsplit("@", 1)[0]
        for earlier in self.reported.values():
            if (
                earlier.id.rsplit("@", 1)[0] == kind
                and earlier.first_step < finding.first_step <= earlier.last_step
            ):
                return earlier
        return None
