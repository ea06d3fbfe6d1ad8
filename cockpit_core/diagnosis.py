"""The diagnosis protocol: rules that read logged values and say what is wrong, with evidence.

A :class:`Diagnosis` declares the quantities it ``reads`` and its thresholds as a pydantic
:class:`DiagnosisConfig`; :meth:`Diagnosis.check` looks at a :class:`Window` of logged
values (the whole log offline, the latest steps while training) and returns
:class:`Finding` objects: what was found, over which steps, the evidence (values and
thresholds), a suggestion and the paper or rule it comes from. Plugins register diagnosis
classes with the ``register_diagnoses`` hook; :func:`cockpit_core.diagnosing.run.diagnose` runs
them on a log, ``Cockpit(..., diagnoses=[...])`` while training. See ``docs/diagnoses.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from cockpit_core.errors import UnknownNameError
from cockpit_core.plugin.name_table import check_named_class

SEVERITIES: tuple[str, ...] = ("info", "warning", "error")
"""Severities of findings, least severe first."""

RECORD_KINDS: tuple[str, ...] = ("skipped", "cost")
"""Kinds of log records besides values that a diagnosis can read (``reads_records``)."""

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")

DIRECTIONS: tuple[str, ...] = ("up", "down")
"""Directions of advice on a knob (:attr:`Finding.advice`)."""

KNOBS: tuple[str, ...] = ("learning_rate", "batch_size")
"""The knobs the first-party diagnoses advise on; any snake_case name is a knob."""


def severity_rank(severity: str) -> int:
    """Position of ``severity`` in :data:`SEVERITIES` (``info`` 0, ``warning`` 1, ``error`` 2)."""
    return SEVERITIES.index(severity)


@dataclass(frozen=True)
class Finding:
    """One thing a diagnosis found, over a range of steps.

    Attributes:
        id: Stable identity of the finding, e.g. ``"stability@340"``: the same finding
            found again (a longer window) has the same id, so it is reported once.
        diagnosis: Name of the diagnosis that found it.
        severity: ``"info"``, ``"warning"`` or ``"error"``.
        first_step: First step of the evidence.
        last_step: Last step of the evidence.
        message: One line that says what is wrong.
        evidence: The values and thresholds that show it (JSON-compatible).
        suggestion: What to try.
        source: The paper or rule the diagnosis follows.
        advice: The direction the suggestion turns each knob it names, e.g.
            ``{"learning_rate": "down"}`` (knobs: snake_case names such as those of
            :data:`KNOBS`; directions: :data:`DIRECTIONS`). Optional: a finding without it
            advises no knob. ``cockpit diagnose`` resolves opposite advice of one run's
            findings with the :class:`Precedence` rules of the installed diagnoses.

    """

    id: str
    diagnosis: str
    severity: str
    first_step: int
    last_step: int
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    suggestion: str = ""
    source: str = ""
    advice: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(
                f"finding {self.id!r}: severity {self.severity!r} is not one of {SEVERITIES}."
            )
        if not _valid_advice(self.advice):
            raise ValueError(
                f"finding {self.id!r}: advice {self.advice!r} must map snake_case knob names "
                f"to one of {DIRECTIONS}, e.g. {{'learning_rate': 'down'}}."
            )

    def to_record(self) -> dict[str, Any]:
        """The ``finding`` log record (``{"kind": "finding", ...}``, see docs/log_format.md).

        ``advice`` is left out when empty, so that a finding without advice has the record
        it had before the field existed.
        """
        record = {"kind": "finding", **asdict(self)}
        if not self.advice:
            del record["advice"]
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Finding:
        """The finding of a ``finding`` record (the inverse of :meth:`to_record`).

        Unknown fields are ignored, and so is an ``advice`` that is not valid (a record
        written by another tool): the finding then advises no knob.
        """
        names = cls.__dataclass_fields__
        fields = {k: v for k, v in record.items() if k in names}
        if not _valid_advice(fields.get("advice", {})):
            del fields["advice"]
        return cls(**fields)

    @property
    def case(self) -> str:
        """What was found, without the step: ``"step_size/overshoot"`` of its id.

        The id ``"step_size/overshoot@12"`` gives ``"step_size/overshoot"``; an id of
        another form gives the diagnosis name.
        """
        head, at, _ = self.id.rpartition("@")
        return head if at and head.split("/")[0] == self.diagnosis else self.diagnosis

    @property
    def steps(self) -> str:
        """``"step 5"`` or ``"steps 340-360"``: the stretch of the evidence, for people."""
        if self.first_step == self.last_step:
            return f"step {self.first_step}"
        return f"steps {self.first_step}-{self.last_step}"

    def line(self) -> str:
        """``severity [first-last] message`` for a terminal report."""
        return f"{self.severity.upper():7} {self.diagnosis}: {self.message} ({self.steps})"


def _valid_advice(advice: Any) -> bool:
    """Whether ``advice`` maps snake_case knob names to a direction of :data:`DIRECTIONS`."""
    return isinstance(advice, Mapping) and all(
        isinstance(k, str) and NAME_PATTERN.match(k) and v in DIRECTIONS for k, v in advice.items()
    )


@dataclass(frozen=True)
class Precedence:
    """A rule of evidence: whose advice wins when two findings turn a knob opposite ways.

    When two findings of one run whose stretches overlap advise opposite directions on
    ``knob`` (:attr:`Finding.advice`), and one matches ``wins`` and the other ``over``,
    the report keeps the first and lists the second under it as overruled, with
    ``because``. A pattern is a diagnosis name (``"stability"``: all its findings) or a
    case (``"step_size/overshoot"``, :attr:`Finding.case`). Diagnoses declare the rules in
    which they win in :attr:`Diagnosis.precedence`; opposite advice that no rule (or a
    rule each way) decides is reported as a conflict naming both.

    Attributes:
        knob: The knob, e.g. ``"learning_rate"``.
        wins: Patterns of the findings whose advice wins.
        over: Patterns of the findings whose opposite advice yields.
        because: Why, one clause for the report (``"... : a plateau is not a reason to
            raise the learning rate"``).

    """

    knob: str
    wins: tuple[str, ...]
    over: tuple[str, ...]
    because: str

    def __post_init__(self) -> None:
        for name in ("wins", "over"):  # one name given as a string, or a list: a tuple
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))

    def decides(self, winner: Finding, loser: Finding, knob: str) -> bool:
        """Whether this rule makes ``winner``'s advice on ``knob`` outrank ``loser``'s."""
        return knob == self.knob and _matches(winner, self.wins) and _matches(loser, self.over)


def _matches(finding: Finding, patterns: Sequence[str]) -> bool:
    """Whether ``finding``'s diagnosis or case is one of ``patterns``."""
    return finding.diagnosis in patterns or finding.case in patterns


class DiagnosisConfig(BaseModel):
    """Base of a diagnosis's thresholds: unknown options are errors, each field described."""

    model_config = ConfigDict(extra="forbid")


class Window:
    """The logged values a diagnosis looks at: ``{step: {quantity_key: value}}`` and events.

    Args:
        output: Values by step (``read_log``'s structure).
        skipped: ``skipped`` records (steps whose values were not computed).
        header: The run's header (``params`` names the parameters of per-parameter values).
        cost: ``cost`` records (cockpit's own time at tracked steps, see
            :mod:`cockpit_core.engine.cost`), by step.

    """

    def __init__(
        self,
        output: Mapping[int, Mapping[str, Any]],
        skipped: Sequence[Mapping[str, Any]] = (),
        header: Mapping[str, Any] | None = None,
        cost: Sequence[Mapping[str, Any]] = (),
    ):
        self.output = {int(s): v for s, v in sorted(output.items())}
        self.skipped = list(skipped)
        self.header = dict(header or {})
        self.cost = list(cost)
        self._arrays: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}

    @property
    def steps(self) -> list[int]:
        """Steps with values, increasing."""
        return list(self.output)

    @property
    def param_names(self) -> list[str]:
        """Names of the tracked parameters (from the header; empty if it has none)."""
        params = self.header.get("params")
        if not isinstance(params, list):
            return []
        return [
            str(p.get("name", i)) if isinstance(p, dict) else str(p) for i, p in enumerate(params)
        ]

    def records(self, kind: str) -> list[Mapping[str, Any]]:
        """The window's log records of ``kind`` (one of :data:`RECORD_KINDS`; else none)."""
        return {"skipped": self.skipped, "cost": self.cost}.get(kind, [])

    def has(self, key: str) -> bool:
        """Whether any step holds a value of ``key``."""
        return any(key in values for values in self.output.values())

    def values(self, key: str) -> list[tuple[int, Any]]:
        """``(step, value)`` of every step that holds ``key``."""
        return [(s, v[key]) for s, v in self.output.items() if key in v]

    def _memo(self, name: str, compute: Any, *args: str) -> tuple[np.ndarray, np.ndarray]:
        """``compute(*args)``, once per window (rules share keys); each caller gets copies."""
        key = (name, *args)
        if key not in self._arrays:
            self._arrays[key] = compute(*args)
        steps, values = self._arrays[key]
        return steps.copy(), values.copy()

    def series(self, key: str, *path: str) -> tuple[np.ndarray, np.ndarray]:
        """Steps and float64 values of ``key`` (``path`` picks a field, e.g. ``"total"``).

        A value that is missing at the path or not a number reads as NaN.
        """
        return self._memo("series", self._series, key, *path)

    def _series(self, key: str, *path: str) -> tuple[np.ndarray, np.ndarray]:
        steps, out = [], []
        for step, value in self.values(key):
            for part in path:
                value = value.get(part) if isinstance(value, Mapping) else None
            steps.append(step)
            out.append(_as_float(value))
        return np.asarray(steps, dtype=np.int64), np.asarray(out, dtype=np.float64)

    def finite_series(self, key: str, *path: str) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`series` without the steps whose value is missing or not finite."""
        steps, values = self.series(key, *path)
        ok = np.isfinite(values)
        return steps[ok], values[ok]

    def per_param(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Steps and ``[steps, params]`` float64 values of ``key``'s ``per_param`` entry.

        Steps whose array has another length than the first one are left out.
        """
        return self._memo("per_param", self._per_param, key)

    def _per_param(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        steps: list[int] = []
        rows: list[np.ndarray] = []
        for step, value in self.values(key):
            arr = value.get("per_param") if isinstance(value, Mapping) else None
            try:
                row = np.asarray(arr, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                continue
            if arr is None or (rows and len(row) != len(rows[0])):
                continue
            steps.append(step)
            rows.append(row)
        if not rows:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 0))
        return np.asarray(steps, dtype=np.int64), np.stack(rows)


def _as_float(value: Any) -> float:
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


class Diagnosis:
    """Base class of a diagnosis: a rule over logged values that emits :class:`Finding` s.

    Subclasses set ``name`` (snake_case), ``reads`` (the quantity names it needs; it runs
    when the log has at least one of them), optionally ``reads_records`` (kinds of log
    records other than values it reads, e.g. ``("cost",)``: it also runs when the window
    holds such records, see :meth:`Window.records`), ``source`` (paper or rule), optionally
    ``Config`` (a :class:`DiagnosisConfig` subclass with the thresholds), optionally
    ``precedence`` (the :class:`Precedence` rules in which its findings' advice wins over
    another finding's opposite advice), and write :meth:`check`; a finding that suggests
    turning a knob declares it (``self.finding(..., advice={"learning_rate": "down"})``).
    Options are validated on construction: ``StepSize(overshoot=2.0)``.

    Attributes:
        config: The validated options.

    """

    name: ClassVar[str] = ""
    reads: ClassVar[tuple[str, ...]] = ()
    reads_records: ClassVar[tuple[str, ...]] = ()
    source: ClassVar[str] = ""
    Config: ClassVar[type[DiagnosisConfig]] = DiagnosisConfig
    precedence: ClassVar[tuple[Precedence, ...]] = ()

    def __init__(self, **options: Any):
        self.config = self.Config(**options)

    def applies(self, window: Window) -> bool:
        """Whether the window holds anything this diagnosis reads (values or records)."""
        return any(window.has(key) for key in self.reads) or any(
            window.records(kind) for kind in self.reads_records
        )

    def check(self, window: Window) -> list[Finding]:
        """Return what this diagnosis finds in ``window`` (empty if all is well)."""
        raise NotImplementedError(f"{type(self).__name__} must implement check(window)")

    def finding(
        self,
        what: str,
        severity: str,
        first_step: int,
        last_step: int,
        message: str,
        evidence: Mapping[str, Any],
        suggestion: str = "",
        advice: Mapping[str, str] | None = None,
    ) -> Finding:
        """A :class:`Finding` of this diagnosis, with id ``"<name>/<what>@<first_step>"``.

        ``advice`` declares the knobs ``suggestion`` turns and which way (``{"learning_rate":
        "down"}``), see :attr:`Finding.advice`.
        """
        suffix = f"/{what}" if what else ""
        return Finding(
            id=f"{self.name}{suffix}@{int(first_step)}",
            diagnosis=self.name,
            severity=severity,
            first_step=int(first_step),
            last_step=int(last_step),
            message=message,
            evidence={k: _plain(v) for k, v in evidence.items()},
            suggestion=suggestion,
            source=self.source,
            advice=dict(advice or {}),
        )


def _plain(value: Any) -> Any:
    """Evidence as JSON-compatible data: numpy scalars and arrays as numbers and lists."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def check_diagnosis_class(cls: Any) -> None:
    """Raise ``TypeError`` with a fix if ``cls`` does not follow the diagnosis protocol."""
    check_named_class(
        cls, Diagnosis, "cockpit_core.diagnosis.Diagnosis", "diagnosis", NAME_PATTERN, "step_size"
    )
    reads = cls.reads
    if isinstance(reads, str) or not all(isinstance(r, str) for r in reads):
        raise TypeError(
            f"{cls.__name__}.reads = {reads!r}: give a tuple of quantity names, e.g. ('alpha',)."
        )
    kinds = cls.reads_records
    if isinstance(kinds, str) or not all(k in RECORD_KINDS for k in kinds):
        raise TypeError(
            f"{cls.__name__}.reads_records = {kinds!r}: give a tuple of record kinds out of "
            f"{RECORD_KINDS}, e.g. ('cost',)."
        )
    if not (isinstance(cls.Config, type) and issubclass(cls.Config, DiagnosisConfig)):
        raise TypeError(
            f"{cls.__name__}.Config must subclass cockpit_core.diagnosis.DiagnosisConfig."
        )
    rules = cls.precedence
    if not isinstance(rules, tuple) or not all(isinstance(r, Precedence) for r in rules):
        raise TypeError(
            f"{cls.__name__}.precedence = {rules!r}: give a tuple of "
            "cockpit_core.diagnosis.Precedence rules (or leave it empty)."
        )
    if cls.check is Diagnosis.check:
        raise TypeError(f"{cls.__name__} must implement check(window).")


def persistent_spans(
    steps: Sequence[int] | np.ndarray,
    flags: Sequence[bool] | np.ndarray,
    window: int,
    fraction: float = 1.0,
) -> list[tuple[int, int, int]]:
    """Stretches where at least ``fraction`` of ``window`` consecutive entries are flagged.

    Every run of ``window`` consecutive entries (tracked steps) with at least
    ``ceil(fraction * window)`` flags marks its flagged entries; overlapping or adjacent
    marked runs merge. Returns ``(first step, last step, flagged entries)`` of each stretch,
    from its first to its last flagged entry. Fewer than ``window`` entries give none.
    """
    flags = np.asarray(flags, dtype=bool)
    if window < 1 or len(flags) < window:
        return []
    need = max(1, math.ceil(fraction * window - 1e-9))
    counts = np.convolve(flags.astype(np.int64), np.ones(window, dtype=np.int64), "valid")
    groups: list[list[int]] = []  # qualifying windows, merged where they overlap or touch
    for start in np.nonzero(counts >= need)[0].tolist():
        if groups and start <= groups[-1][1] + 1:
            groups[-1][1] = start + window - 1
        else:
            groups.append([start, start + window - 1])
    spans = []
    for lo, hi in groups:  # every flagged entry of a merged range lies in a qualifying window
        idx = np.nonzero(flags[lo : hi + 1])[0] + lo
        spans.append((int(steps[int(idx[0])]), int(steps[int(idx[-1])]), len(idx)))
    return spans


class UnknownDiagnosisError(UnknownNameError):
    """A diagnosis name that no installed plugin registers."""

    kind = "diagnosis"
    listing_hint = "Install cockpit-diagnoses, or see docs/diagnoses.md for the rules."
