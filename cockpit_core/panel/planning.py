"""Which panels a dashboard shows: match registered instruments to what was tracked.

:func:`plan` resolves quantity labels through the log header, checks each instrument's
required quantities, ``min_steps`` and ``available`` condition, and records what it skips so
the dashboard can say what was not tracked. No matplotlib here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cockpit_core.engine.metrics import METRICS_KEY
from cockpit_core.instrument import TOPICS, Instrument
from cockpit_core.log import LogData, read_run


@dataclass
class Panel:
    """An instrument placed on the dashboard, with the output keys it reads."""

    instrument: Instrument
    keys: dict[str, str]  # quantity name -> output key
    title: str


@dataclass
class Plan:
    """What the dashboard will show: panels per topic and what it skips."""

    topics: dict[str, list[Panel]] = field(default_factory=dict)
    skipped: list[tuple[Instrument, list[str]]] = field(default_factory=list)
    unavailable: list[Instrument] = field(default_factory=list)
    without_panel: list[str] = field(default_factory=list)

    @property
    def panels(self) -> list[Panel]:
        """Every panel, topic by topic."""
        return [p for panels in self.topics.values() for p in panels]


def load(source: Any) -> LogData:
    """Header, output and errors of a Cockpit, a log path, a :class:`LogData` or an output dict."""
    if isinstance(source, LogData):
        return source
    if isinstance(source, (str, os.PathLike)):
        return read_run(Path(source))
    log = getattr(source, "_log", None)
    if not getattr(source, "keep_in_memory", True) and log is not None:
        return read_run(log.path)  # values were only streamed: every record is in the log
    if hasattr(source, "get_output") and hasattr(source, "header"):
        data = LogData(
            dict(source.header()),
            source.get_output(),
            list(source.errors),
            list(getattr(source, "skipped", [])),
        )
        data.findings.extend(f.to_record() for f in getattr(source, "findings", []))
        return data
    if isinstance(source, Mapping):
        return LogData({}, {int(k): dict(v) for k, v in source.items()}, [])
    raise TypeError(
        "plot a Cockpit, a log path (.jsonl or .json), a LogData or {step: {name: value}}; "
        f"got {type(source).__name__}."
    )


def _tracked_keys(data: LogData) -> dict[str, list[str]]:
    """Quantity name -> output keys that hold at least one value (labels resolved)."""
    present: set[str] = set()
    for values in data.output.values():
        present.update(k for k, v in values.items() if v is not None)
    keys: dict[str, list[str]] = {}
    declared = data.header.get("quantities") or []
    for q in declared:
        if isinstance(q, Mapping) and q.get("key", q.get("name")) in present:
            keys.setdefault(str(q.get("name")), []).append(str(q.get("key", q.get("name"))))
    covered = {k for ks in keys.values() for k in ks}
    for key in sorted(present - covered):  # no header, or values of unknown origin
        keys.setdefault(key, []).append(key)
    return keys


def _count(data: LogData, key: str) -> int:
    return sum(1 for values in data.output.values() if values.get(key) is not None)


def plan(data: LogData, instruments: Iterable[Instrument]) -> Plan:
    """Decide which panels to draw and which to skip (and why)."""
    tracked = _tracked_keys(data)
    result = Plan()
    used: set[str] = set()
    for inst in sorted(instruments, key=lambda i: (i.order, i.name)):
        missing = [
            q
            for q in inst.quantities
            if q not in tracked or _count(data, tracked[q][0]) < inst.min_steps
        ]
        available = [q for q in inst.all_quantities if q in tracked]
        if missing or not available:
            result.skipped.append((inst, missing or list(inst.optional)))
            continue
        used.update(available)
        multi = max(available, key=lambda q: len(tracked[q]))
        for key in tracked[multi]:
            keys = {q: tracked[q][0] for q in available}
            keys[multi] = key
            title = inst.title if key == multi else f"{inst.title} [{key}]"
            panel = Panel(inst, keys, title)
            if inst.available is not None and not _is_available(inst, data, panel):
                if inst not in result.unavailable:
                    result.unavailable.append(inst)
                continue
            result.topics.setdefault(inst.topic, []).append(panel)
    result.without_panel = sorted(set(tracked) - used)
    order = {t: i for i, t in enumerate(TOPICS)}
    result.topics = dict(
        sorted(result.topics.items(), key=lambda kv: (order.get(kv[0], len(TOPICS)), kv[0]))
    )
    return result


def _is_available(inst: Instrument, data: LogData, panel: Panel) -> bool:
    try:
        return bool(inst.available(panel_output(data, panel)))  # type: ignore[misc]
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException:  # a broken check (even SystemExit) hides the panel, not the dashboard
        return False


def panel_output(data: LogData, panel: Panel) -> dict[int, dict[str, Any]]:
    """``{step: {quantity_name: value}}`` restricted to the keys of ``panel``."""
    out: dict[int, dict[str, Any]] = {}
    for step, values in data.output.items():
        row = {q: values[k] for q, k in panel.keys.items() if values.get(k) is not None}
        if row:
            out[step] = row
    return out


def skip_note(plan_: Plan, data: LogData) -> list[str]:
    """The lines that say which panels were skipped and why (shown under the dashboard)."""
    lines = []
    unlogged = [inst for inst, missing in plan_.skipped if missing == [METRICS_KEY]]
    skipped = [(inst, missing) for inst, missing in plan_.skipped if inst not in unlogged]
    if skipped:
        parts = [
            f"{inst.title} ({', '.join(missing)})" if missing else inst.title
            for inst, missing in skipped
        ]
        lines.append(
            "Not tracked, so not shown: "
            + "; ".join(parts)
            + ". Add these quantities to the Cockpit to see them."
        )
    if unlogged:
        lines.append(
            "No metrics logged, so not shown: "
            + "; ".join(inst.title for inst in unlogged)
            + ". Log them with cp.log(step, train_loss=..., valid_accuracy=...)."
        )
    if plan_.unavailable:
        lines.append(
            "Not shown for lack of data: "
            + "; ".join(
                f"{i.title} ({i.description or 'see its plugin docs'})" for i in plan_.unavailable
            )
            + "."
        )
    if plan_.without_panel:
        lines.append(
            "Tracked without a panel (no installed plugin draws them): "
            + ", ".join(plan_.without_panel)
            + "."
        )
    if data.errors:
        by_q: dict[str, int] = {}
        for e in data.errors:
            by_q[str(e.get("quantity"))] = by_q.get(str(e.get("quantity")), 0) + 1
        lines.append(
            "Errors: "
            + ", ".join(f"{q} failed {n}x" for q, n in sorted(by_q.items()))
            + " (see the error records of the log)."
        )
    if data.skipped:
        first = min(int(r.get("step", 0)) for r in data.skipped)
        lines.append(
            f"Skipped steps: {len(data.skipped)} (first at step {first}): "
            + str(data.skipped[0].get("reason", "see the log"))
            + "."
        )
    return lines


def registry_of(source: Any, registry: Any) -> Any:
    """``registry``, else the Cockpit's, else every installed plugin's."""
    if registry is None:
        registry = getattr(source, "registry", None)
    if registry is None:
        from cockpit_core.plugin.registry import default_registry

        registry = default_registry()
    return registry


def default_instruments(source: Any, registry: Any) -> list[Instrument]:
    """Every panel of ``registry`` (see :func:`registry_of`), in registration order."""
    return list(registry_of(source, registry).instruments.values())
