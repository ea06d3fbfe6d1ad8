"""Capture on trigger: findings that turn quantities with an ``on_finding`` schedule on.

A quantity configured with ``schedule = {kind = "on_finding", diagnosis = "loss_spike",
steps = 5}`` (:class:`~cockpit_core.schedules.OnFinding`) is tracked at the ``steps`` steps
after each finding of that diagnosis, so expensive evidence (a gradient histogram, the top
Hessian eigenvalue, per-parameter values) is recorded where something happened.

The schedule model is data; the run's state is not. Each Cockpit's tracker owns one
:class:`Triggers`: per diagnosis and severity, the step at which its latest finding
arrived. When the Cockpit is built (and at ``cp.add``) the tracker replaces each
quantity's ``OnFinding`` model with a :class:`TriggeredSchedule`, the model bound to that
table, so two Cockpits never share triggers and the planner asks the schedule as it asks any
other (``quantity.is_active(step)``).

The trigger's diagnosis must run while training (``Cockpit(..., diagnoses=[...])``):
:func:`trigger_errors` says what is wrong with a quantity's ``on_finding`` schedule (a
diagnosis that is not installed, or installed but not running), with the field path.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from cockpit_core.diagnosis import SEVERITIES, Finding, UnknownDiagnosisError, severity_rank
from cockpit_core.errors import ConfigError, MisuseError
from cockpit_core.quantity import Quantity
from cockpit_core.schedules import OnFinding


class Triggers:
    """The findings of one run that ``on_finding`` schedules follow.

    A finding of diagnosis ``d`` and severity ``v`` that arrives while step ``s`` runs (or
    right after it, before the next step) records ``s`` as the latest step of ``(d, v)``.
    A schedule ``OnFinding(diagnosis=d, severity=m, steps=n)`` is then on at steps
    ``s + 1 .. s + n``, where ``s`` is the latest such step of ``d`` at a severity of at
    least ``m``: a later finding restarts the window, and overlapping windows merge.

    Attributes:
        closed: The run ended (``cp.close()``); its quantities may be bound anew.

    """

    def __init__(self) -> None:
        self._last: dict[str, dict[str, int]] = {}  # diagnosis -> severity -> step
        self.closed = False

    def fired(self, finding: Finding, step: int) -> None:
        """Note that ``finding`` arrived at ``step`` (the step that ran when it was reported)."""
        by_severity = self._last.setdefault(finding.diagnosis, {})
        by_severity[finding.severity] = max(step, by_severity.get(finding.severity, step))

    def last_step(self, schedule: OnFinding) -> int | None:
        """The step of the latest finding ``schedule`` follows (``None``: none yet)."""
        least = severity_rank(schedule.severity)
        steps = [
            step
            for name in schedule.diagnoses
            for severity, step in self._last.get(name, {}).items()
            if severity_rank(severity) >= least
        ]
        return max(steps) if steps else None

    def active(self, schedule: OnFinding, step: int) -> bool:
        """Whether ``schedule`` tracks ``step``: within a window after a finding, or ``also``."""
        if schedule.also is not None and schedule.also(step):
            return True
        last = self.last_step(schedule)
        return last is not None and last < step <= last + schedule.steps

    def bind(self, schedule: OnFinding) -> TriggeredSchedule:
        """``schedule`` as a callable ``step -> bool`` that reads this table."""
        return TriggeredSchedule(schedule, self)

    def state_dict(self) -> dict[str, dict[str, int]]:
        """The table, for a checkpoint: ``{diagnosis: {severity: step}}``."""
        return {name: dict(steps) for name, steps in self._last.items()}

    def load_state_dict(self, state: Any) -> None:
        """Continue from :meth:`state_dict` (an open capture window stays open)."""
        if not isinstance(state, Mapping):
            return
        self._last = {
            str(name): {str(v): int(s) for v, s in steps.items() if v in SEVERITIES}
            for name, steps in state.items()
            if isinstance(steps, Mapping)
        }


class TriggeredSchedule:
    """An :class:`~cockpit_core.schedules.OnFinding` schedule bound to one run's triggers.

    Args:
        schedule: The schedule as configured (data).
        triggers: The table of the Cockpit that tracks the quantity.

    """

    __slots__ = ("schedule", "triggers")

    def __init__(self, schedule: OnFinding, triggers: Triggers):
        self.schedule = schedule
        self.triggers = triggers

    def __call__(self, step: int) -> bool:
        """Whether the quantity is tracked at ``step``."""
        return self.triggers.active(self.schedule, step)

    def __repr__(self) -> str:
        return f"TriggeredSchedule({self.schedule!r})"


def on_finding_schedule(quantity: Quantity) -> OnFinding | None:
    """The ``on_finding`` schedule ``quantity`` runs on, bound or not (``None``: another)."""
    schedule = quantity.schedule
    if isinstance(schedule, TriggeredSchedule):
        return schedule.schedule
    return schedule if isinstance(schedule, OnFinding) else None


def trigger_errors(
    quantity: Quantity,
    path: str,
    installed: Collection[str] | None = None,
    running: Collection[str] | None = None,
) -> list[tuple[str, str]]:
    """The problems of the diagnoses ``quantity``'s ``on_finding`` schedule names.

    One ``(field path, message)`` per name that is not installed or (given ``running``) does
    not run while training.

    Args:
        quantity: The quantity (no problems unless it runs on an ``on_finding`` schedule).
        path: Where the quantity is in the config (``quantities.2``).
        installed: The installed diagnoses (``None``: not checked).
        running: The diagnoses that run while training (``None``: not checked).

    """
    schedule = on_finding_schedule(quantity)
    if schedule is None:
        return []
    where = f"{path}.schedule.diagnosis"
    errors = []
    for name in schedule.diagnoses:
        if installed is not None and name not in installed:
            errors.append((where, str(UnknownDiagnosisError(name, installed))))
        elif running is not None and name not in running:
            errors.append(
                (
                    where,
                    f"quantity '{quantity.key}' is tracked after findings of '{name}', but "
                    f"'{name}' does not run while training (running: "
                    f"{', '.join(sorted(running)) or 'none'}): add it to the diagnoses, "
                    f'Cockpit(..., diagnoses=["{name}"]) or diagnoses = ["{name}"] in a '
                    "config file",
                )
            )
    return errors


def running_names(specs: Iterable[str | Mapping[str, Any]] | None) -> list[str]:
    """The names of the diagnoses of ``Cockpit(diagnoses=...)`` (entries without one: none)."""
    names = []
    for spec in specs or ():
        name = spec.get("name") if isinstance(spec, Mapping) else spec
        if isinstance(name, str):
            names.append(name)
    return names


def bind_triggers(
    quantities: Collection[Quantity],
    triggers: Triggers,
    running: Collection[str],
    distributed: bool = False,
    path: str = "quantities",
    source: str | None = None,
) -> set[str]:
    """Bind the ``on_finding`` schedules of ``quantities`` to ``triggers``; return their names.

    Everything is checked before anything is bound.

    Args:
        quantities: The quantities (those on another schedule are left alone).
        triggers: The table of the Cockpit that tracks them.
        running: The diagnoses that run while training in that Cockpit.
        distributed: The Cockpit runs under ``torch.distributed`` with several processes.
        path: Where the quantities are (``quantities``: their index follows; else the
            path of the one quantity, e.g. ``quantity`` for ``cp.add``).
        source: Named in a :class:`ConfigError` (``cp.add(...)``).

    Returns:
        The names of the diagnoses the schedules follow.

    Raises:
        MisuseError: Under ``torch.distributed`` (each process would decide alone which
            quantities run, and they must run the same ones), or a quantity instance that
            another Cockpit, not closed yet, tracks on its own triggers.
        ConfigError: A schedule names a diagnosis that does not run in this Cockpit.

    """
    bound = [(q, s) for q in quantities if (s := on_finding_schedule(q)) is not None]
    if bound and distributed:
        raise MisuseError(
            "an 'on_finding' schedule is not supported under torch.distributed with several "
            f"processes (quantity '{bound[0][0].key}'): the processes must track the same "
            "quantities at every step, and only one process runs the diagnoses. Use a plain "
            "schedule there, e.g. {'kind': 'every', 'every': 100}."
        )
    errors: list[tuple[str, str]] = []
    for i, q in enumerate(quantities):
        where = f"{path}.{i}" if path == "quantities" else path
        errors.extend(trigger_errors(q, where, running=running))
    if errors:
        raise ConfigError(errors, source)
    for q, _ in bound:
        current = q.schedule
        if (
            isinstance(current, TriggeredSchedule)
            and current.triggers is not triggers
            and not current.triggers.closed
        ):
            raise MisuseError(
                f"quantity '{q.key}' (an 'on_finding' schedule) is tracked by another Cockpit "
                "that is not closed: give each Cockpit its own quantity instance (a name or "
                "an option dict), or close the other one first (cp.close())."
            )
    for q, schedule in bound:
        q.schedule = triggers.bind(schedule)
    return {name for _, schedule in bound for name in schedule.diagnoses}
