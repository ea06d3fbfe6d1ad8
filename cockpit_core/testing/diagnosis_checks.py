"""Checks of a diagnosis class: :func:`check_diagnosis` (run by ``check_plugin``).

A diagnosis (``docs/diagnoses.md``) must follow the protocol, describe and validate its
options, and never raise in ``check``: it runs inside training (``Cockpit(diagnoses=...)``)
and in ``cockpit diagnose``, on windows with missing, NaN and short series.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any, cast

from pydantic import ValidationError

from cockpit_core.diagnosis import Diagnosis, Finding, Window, check_diagnosis_class
from cockpit_core.plugin.registry import Registry
from cockpit_core.testing.conformance import ConformanceError
from cockpit_core.testing.problems import tiny_mlp
from cockpit_core.testing.runner import run_cockpit


def check_diagnosis(
    cls: type,
    options: Mapping[str, Any] | None = None,
    registry: Registry | None = None,
    steps: int = 4,
) -> None:
    """Check a diagnosis class: protocol, options, and ``check`` on short windows.

    Args:
        cls: The :class:`~cockpit_core.diagnosis.Diagnosis` subclass.
        options: Options to build it with (default: its defaults).
        registry: Where the quantities it reads are looked up (default: the installed ones).
        steps: Steps of the run whose window ``check`` gets.

    Raises:
        ConformanceError: Every problem found, in one message.

    """
    try:
        check_diagnosis_class(cls)
    except TypeError as err:
        raise ConformanceError(str(err)) from err
    diagnosis_cls = cast(type[Diagnosis], cls)  # what check_diagnosis_class() verified
    fields = diagnosis_cls.Config.model_fields
    undescribed = [n for n, f in fields.items() if not f.description]
    if undescribed:
        raise ConformanceError(
            f"options {undescribed} of {diagnosis_cls.Config.__name__} have no description: "
            "write Field(default, description=...) (cockpit lists them to users)."
        )
    try:
        diagnosis = diagnosis_cls(**dict(options or {}))
    except ValidationError as err:
        raise ConformanceError(
            f"options {dict(options or {})} do not validate: {err}; give every option a "
            "valid default, or pass check_plugin(arguments={name: {'options': {...}}})"
        ) from err
    try:
        diagnosis_cls(**dict(options or {}), cockpit_check_unknown_option=1)
    except ValidationError:
        pass
    else:
        raise ConformanceError(
            f"{diagnosis_cls.Config.__name__} accepts an unknown option: keep DiagnosisConfig's "
            "extra='forbid', so that a misspelt threshold is an error."
        )
    registry = registry if registry is not None else Registry.from_entry_points()
    installed = [q for q in diagnosis_cls.reads if q in registry.quantities]
    if not installed and diagnosis_cls.reads_records and "loss" in registry.quantities:
        installed = ["loss"]  # a run that writes the records it reads (skipped, cost)
    windows = {"an empty window": Window({})}
    if installed:
        records: list[dict[str, Any]] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = run_cockpit(
                tiny_mlp(), installed, steps=steps, registry=registry, sinks=[records.append]
            )
            result.cockpit.close()
        windows[f"the window of a {steps}-step run of {installed}"] = Window(
            result.cockpit.get_output(),
            [r for r in records if r.get("kind") == "skipped"],
            _header(result.cockpit),
            [r for r in records if r.get("kind") == "cost"],
        )
    for what, window in windows.items():
        if not diagnosis.applies(window):
            continue
        try:
            found = diagnosis.check(window)
        except Exception as err:
            raise ConformanceError(
                f"check() raised {type(err).__name__}: {err} on {what} (a diagnosis must "
                "cope with missing, NaN and short series: return [] instead)."
            ) from err
        _check_findings(diagnosis_cls.name, found, what)


def _header(cp: Any) -> dict[str, Any]:
    """The run's header record (``params`` names the parameters), if the Cockpit has one."""
    header = getattr(cp, "header", None)
    header = header() if callable(header) else header
    return dict(header) if isinstance(header, Mapping) else {}


def _check_findings(name: str, found: Any, what: str) -> None:
    if not isinstance(found, list) or not all(isinstance(f, Finding) for f in found):
        raise ConformanceError(
            f"check() returned {found!r} on {what}: return a list of Finding (self.finding)."
        )
    for f in found:
        if f.diagnosis != name:
            raise ConformanceError(f"a finding on {what} names diagnosis {f.diagnosis!r}.")
        if f.first_step > f.last_step:
            raise ConformanceError(f"finding {f.id!r} ends before it starts.")
        try:
            json.dumps(f.to_record(), allow_nan=True)
        except (TypeError, ValueError) as err:
            raise ConformanceError(
                f"finding {f.id!r} is not JSON-compatible ({err}): findings are log records."
            ) from err
