"""What a training checkpoint keeps of a Cockpit: ``cp.state_dict()`` and ``cp.load_state_dict``.

A resumed run continues every quantity as if it had never stopped when the checkpoint holds,
besides the model and the optimizer, the Cockpit's state:

- where the run is: the last step, the planner's stride (which step comes next), the
  one-off checks done, the steps of ``cp.add``;
- per quantity (keyed by its output key, with its options and its class's
  ``STATE_VERSION``): its own ``state_dict()`` (e.g. an adapted histogram range), its
  entries in the core cache (``distance``'s origin, the Lanczos vectors of a warm start)
  and, for a two-step quantity between its start and end step, its start state
  (``start_state_dict``), and whether ``on_error="disable"`` disabled it;
- the error policy's records and warned-once kinds, the diagnoses' windows and the
  findings already reported (so none is reported twice), the step of each diagnosis's
  latest finding that ``on_finding`` schedules follow (so a capture window open when the
  checkpoint was saved stays open), the log's run number.

The state holds only tensors, numbers, strings, booleans, ``None``, lists, tuples and dicts
(numpy arrays as ``{"__ndarray__": tensor}``), so ``torch.save`` of ``{"model": ...,
"optimizer": ..., "cockpit": cp.state_dict()}`` loads with ``torch.load(weights_only=True)``.
See ``docs/quickstart.md`` (resuming a run) and ``docs/writing_quantities.md`` (the
protocol for quantity authors).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cockpit_core.config.quantities import quantity_entry
from cockpit_core.diagnosing.runner import DiagnosisRunner
from cockpit_core.diagnosis import Finding
from cockpit_core.engine.tracker import Tracker
from cockpit_core.errors import CockpitWarning, MisuseError, StateError
from cockpit_core.quantity import Quantity, ResumeContext

STATE_FORMAT = "cockpit_state"
"""The ``format`` entry of a Cockpit state."""

STATE_VERSION = 1
"""Version of the layout of a Cockpit state; a state of a newer layout is refused."""

_NDARRAY = "__ndarray__"


@dataclass
class LoadReport:
    """What ``cp.load_state_dict(state, strict=False)`` could not continue.

    Attributes:
        missing: Keys of quantities tracked now that the state does not hold: they start
            afresh at the resumed run's first step (``distance`` from there).
        unexpected: Keys of quantities in the state that are not tracked now: ignored.
        mismatched: ``key: why`` of quantities tracked with other options, of another
            ``STATE_VERSION``, or whose state could not be saved or loaded: they start
            afresh.

    """

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether every quantity continues from the state."""
        return not (self.missing or self.unexpected or self.mismatched)


# -- plain data ---------------------------------------------------------------------------


def to_plain(value: Any, where: str) -> Any:
    """``value`` as data ``torch.load(weights_only=True)`` reads back.

    Tensors are detached; numpy arrays become ``{"__ndarray__": tensor}`` and numpy
    scalars Python numbers (:func:`from_plain` reverses both).

    Raises:
        TypeError: Something else (an object of a class), naming where it is.

    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return {_NDARRAY: torch.from_numpy(np.ascontiguousarray(value).copy())}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        items = [to_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"{where} has the key {k!r}: keys must be strings or integers")
            out[k] = to_plain(v, f"{where}[{k!r}]")
        return out
    raise TypeError(
        f"{where} is a {type(value).__name__}: a checkpoint holds only tensors, numbers, "
        "strings, None and lists, tuples and dicts of them"
    )


def from_plain(value: Any) -> Any:
    """The value :func:`to_plain` was given (numpy arrays back from their tensors)."""
    if isinstance(value, dict):
        if set(value) == {_NDARRAY} and isinstance(value[_NDARRAY], torch.Tensor):
            return value[_NDARRAY].numpy()
        return {k: from_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(from_plain(v) for v in value)
    return value


# -- saving -------------------------------------------------------------------------------


def save_state(tracker: Tracker, log_run: int | None) -> dict[str, Any]:
    """The state of ``tracker``'s run (see the module docstring).

    A quantity whose state cannot be saved (a hook raises, or returns an object) is saved
    without it, with the reason under ``"error"``: the resumed run starts it afresh and
    says so. Training never stops because of it; a :class:`CockpitWarning` tells.

    Raises:
        MisuseError: Called inside a ``with cp(step, ...)`` block.

    """
    if tracker.in_step:
        raise MisuseError(
            f"cp.state_dict() called inside the `with cp({tracker.active_step}, ...)` block: "
            "save the checkpoint between steps (after the block)."
        )
    runner = tracker.diagnoses
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "step": tracker.last_step,
        "schedule": tracker.planner.schedule_state(),
        "done_once": tracker.done_once,
        "quantities": [_quantity_state(tracker, q) for q in tracker.quantities],
        "policy": to_plain(tracker.policy.state_dict(), "errors"),
        "diagnoses": None if runner is None else _runner_state(runner),
        "findings": [to_plain(f.to_record(), "finding") for f in tracker.findings],
        "triggers": tracker.triggers.state_dict(),
        "log_run": log_run,
    }


def _quantity_state(tracker: Tracker, q: Quantity) -> dict[str, Any]:
    """One quantity's entry: identity, options, version, and what it keeps."""
    planner = tracker.planner
    entry: dict[str, Any] = {
        "key": q.key,
        "quantity": quantity_entry(q),
        "version": int(type(q).STATE_VERSION),
        "added_at": tracker.added_at.get(q.key),
        "disabled": planner.is_disabled(q.key),
    }
    try:
        entry["state"] = to_plain(q.state_dict(), f"{q.key}: state_dict()")
        entry["cache"] = {
            key: {"value": to_plain(value, f"{q.key}: ctx.cache[{key!r}]"), "expires": expires}
            for key, (value, expires) in tracker.cache.entries(q.key).items()
        }
        pending = planner.pending(q.key)
        entry["start"] = None
        if pending is not None:
            data = q.start_state_dict(pending[1])  # type: ignore[attr-defined]
            where = f"{q.key}: start_state_dict(...)"
            entry["start"] = {"step": pending[0], "state": to_plain(data, where)}
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as err:  # plugin code: saving a checkpoint must not stop training
        for name in ("state", "cache", "start"):
            entry.pop(name, None)
        entry["error"] = f"{type(err).__name__}: {err}"
        tracker.policy.warn_once(
            (q.key, "state"),
            f"the state of quantity '{q.key}' cannot be saved ({entry['error']}); a run "
            "resumed from this checkpoint starts it afresh",
        )
    return entry


def _runner_state(runner: DiagnosisRunner) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = to_plain(runner.state_dict(), "diagnoses")  # of a dict: a dict
        return state
    except TypeError as err:  # an odd value in the window: the resumed run starts it afresh
        warnings.warn(f"cockpit: the diagnoses' window is not saved: {err}.", CockpitWarning, 3)
        return None


# -- loading ------------------------------------------------------------------------------


def load_state(tracker: Tracker, state: Any, ctx: ResumeContext, strict: bool = True) -> LoadReport:
    """Continue ``tracker``'s run from ``state`` (:func:`save_state`), before its first step.

    Everything is checked before anything changes: with ``strict`` a state that does not
    fit raises and leaves the Cockpit as it was.

    Raises:
        MisuseError: The Cockpit tracked a step already, or is inside a step block.
        StateError: ``state`` is not a Cockpit state, of a newer layout, or (``strict``)
            holds other quantities or options than those tracked now.

    """
    if tracker.in_step or tracker.last_step is not None:
        raise MisuseError(
            "cp.load_state_dict(state) must come before the resumed run's first step: "
            "build the Cockpit, load its state, then train."
        )
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise StateError(
            "cp.load_state_dict(state): this is not a Cockpit state; pass what "
            "cp.state_dict() returned (e.g. torch.load(path, weights_only=True)['cockpit'])."
        )
    version = state.get("version")
    if not isinstance(version, int) or version > STATE_VERSION:
        raise StateError(
            f"cp.load_state_dict(state): the state has layout version {version!r}, this "
            f"cockpit-core reads up to {STATE_VERSION}: resume with the cockpit-core that "
            "saved it, or a newer one."
        )
    report, matched = _match(tracker, state.get("quantities") or [])
    if strict and not report.complete:
        raise StateError(_mismatch_message(report))
    for q, saved in matched:
        try:
            _load_quantity(tracker, q, saved, ctx)
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as err:  # plugin code
            tracker.cache.remove_owner(q.key)
            tracker.planner.drop([q.key])
            if strict:
                raise StateError(
                    f"cp.load_state_dict(state): quantity '{q.key}' cannot load its state "
                    f"({type(err).__name__}: {err}); pass strict=False to start it afresh."
                ) from err
            report.mismatched[q.key] = f"loading failed: {type(err).__name__}: {err}"
    _load_run(tracker, state)
    return report


def _match(
    tracker: Tracker, saved: list[Any]
) -> tuple[LoadReport, list[tuple[Quantity, Mapping[str, Any]]]]:
    """Pair the tracked quantities with their saved entries; report what does not fit."""
    report = LoadReport()
    by_key = {e["key"]: e for e in saved if isinstance(e, Mapping) and "key" in e}
    matched = []
    for q in tracker.quantities:
        entry = by_key.pop(q.key, None)
        if entry is None:
            report.missing.append(q.key)
            continue
        now, then = quantity_entry(q), entry.get("quantity")
        if now != then:
            report.mismatched[q.key] = f"saved with {then}, tracked now with {now}"
        elif entry.get("version") != type(q).STATE_VERSION:
            report.mismatched[q.key] = (
                f"its state has version {entry.get('version')}, {type(q).__name__} now "
                f"{type(q).STATE_VERSION} (another version of its plugin)"
            )
        elif "error" in entry:
            report.mismatched[q.key] = f"its state was not saved: {entry['error']}"
        else:
            matched.append((q, entry))
    report.unexpected = list(by_key)
    return report, matched


def _mismatch_message(report: LoadReport) -> str:
    lines = ["cp.load_state_dict(state): the state does not fit this Cockpit:"]
    if report.unexpected:
        lines.append(f"  saved but not tracked now: {report.unexpected}")
    if report.missing:
        lines.append(f"  tracked now but not saved: {report.missing}")
    lines += [f"  '{key}': {why}" for key, why in report.mismatched.items()]
    lines.append(
        "Build the Cockpit with the quantities and options of the saved run, or pass "
        "strict=False: those quantities then start afresh (the report says which)."
    )
    return "\n".join(lines)


def _load_quantity(
    tracker: Tracker, q: Quantity, saved: Mapping[str, Any], ctx: ResumeContext
) -> None:
    q.load_state_dict(from_plain(saved.get("state") or {}), ctx)
    for key, item in (saved.get("cache") or {}).items():
        tracker.cache.put(q.key, key, from_plain(item["value"]), item.get("expires"))
    start = saved.get("start")
    if start is not None and q.two_step:
        data = q.load_start_state(from_plain(start["state"]), ctx)  # type: ignore[attr-defined]
        tracker.planner.started(q.key, int(start["step"]), data)
    if saved.get("added_at") is not None:  # how its missing info is handled (not the header)
        tracker.added_at[q.key] = int(saved["added_at"])
    if saved.get("disabled"):
        tracker.planner.disable(q.key)


def _load_run(tracker: Tracker, state: Mapping[str, Any]) -> None:
    """Where the run is: last step, schedule, error policy, diagnoses, findings, triggers."""
    step = state.get("step")
    tracker.resume(None if step is None else int(step), state.get("done_once") or ())
    schedule = state.get("schedule") or {}
    # before the planner arms the providers for the next step: an open capture window counts
    tracker.triggers.load_state_dict(state.get("triggers") or {})  # older states: none
    tracker.planner.resume(
        schedule.get("last"), int(schedule.get("stride", 1)), bool(schedule.get("follow", True))
    )
    tracker.policy.load_state_dict(state.get("policy") or {})
    runner = tracker.diagnoses
    if runner is not None and state.get("diagnoses") is not None:
        runner.load_state_dict(from_plain(state["diagnoses"]))
    findings = [Finding.from_record(from_plain(r)) for r in state.get("findings") or ()]
    tracker.findings[:0] = findings
