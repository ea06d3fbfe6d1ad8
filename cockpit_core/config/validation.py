"""The one validation path of a whole config: :func:`validate_config_data`.

It checks everything a file can get wrong (top-level options, quantity entries and their
options, output-key collisions, sink names and options, provider names) and reports all
problems at once. ``cockpit validate``, ``parse_settings(data, source, registry)`` and
``Cockpit.from_config`` go through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cockpit_core.config.quantities import resolve_quantities
from cockpit_core.config.settings import CockpitSettings
from cockpit_core.diagnosing.build import build_diagnoses
from cockpit_core.diagnosing.triggers import running_names
from cockpit_core.errors import ConfigError, DuplicateNameError, UnknownNameError
from cockpit_core.log import check_log_path
from cockpit_core.plugin.registry import Registry
from cockpit_core.quantity import Quantity, validate_config
from cockpit_core.statistics.router import order


@dataclass(frozen=True)
class ValidatedSink:
    """A sink entry of a config that names an installed sink with valid options.

    Attributes:
        path: Where the entry is in the config (``sinks.0``).
        name: The registered sink name.
        options: The validated options (defaults filled in).

    """

    path: str
    name: str
    options: dict[str, Any]


@dataclass(frozen=True)
class ValidatedConfig:
    """A config that passed every check of :func:`validate_config_data`.

    Attributes:
        settings: The top-level options.
        quantities: The quantities the config declares, presets expanded.
        sinks: The sinks the config declares (not built yet: building may open files).

    """

    settings: CockpitSettings
    quantities: list[Quantity]
    sinks: list[ValidatedSink]


def validate_config_data(
    data: Any, registry: Registry, source: str | None = None
) -> ValidatedConfig:
    """Run every check a config can fail and report all problems at once.

    This is the one validation path of cockpit: ``cockpit validate``,
    ``parse_settings(..., registry=...)`` and ``Cockpit.from_config`` use it. It checks the
    top-level options (strict types), every quantity entry and its options against the
    installed plugins (an ``on_finding`` schedule must name a diagnosis of ``diagnoses``),
    that no two quantities write the same output key, every sink name and
    its options, every diagnosis name and its options, the provider names of ``backend``,
    and that the log writer can open ``log`` (an existing file must be a cockpit log).
    Nothing is built, created or opened for writing.

    Args:
        data: The options, e.g. from :func:`load_config_file`.
        registry: The plugins that provide quantities, sinks and providers.
        source: The file the options come from (named in the error message).

    Raises:
        ConfigError: One ``(field path, message)`` pair per problem, in the order of the
            options in ``data``.

    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            [("", f"expected a mapping of options, got {type(data).__name__}")], source
        )
    data = dict(data)
    errors: list[tuple[str, str]] = []
    settings: CockpitSettings | None = None
    try:
        settings = validate_config(CockpitSettings, data)
    except ConfigError as err:
        errors.extend(err.errors)
    bad = {path.split(".")[0] for path, _ in errors}  # fields whose shape is already wrong

    quantities: list[Quantity] = []
    raw_diagnoses = data.get("diagnoses")
    running = None  # the diagnoses' shape is wrong (reported): on_finding names not checked
    if "diagnoses" not in bad:
        running = running_names(raw_diagnoses if isinstance(raw_diagnoses, list) else ())
    if "quantities" not in bad:
        try:
            quantities = resolve_quantities(
                data.get("quantities", "economy"), registry, diagnoses=running
            )
        except ConfigError as err:
            errors.extend(err.errors)

    sinks: list[ValidatedSink] = []
    raw_sinks = data.get("sinks", [])
    if isinstance(raw_sinks, list):
        for i, entry in enumerate(raw_sinks):
            if any(p == f"sinks.{i}" or p.startswith(f"sinks.{i}.") for p, _ in errors):
                continue  # the entry's shape was reported above
            try:
                sinks.append(_validate_sink(entry, registry, f"sinks.{i}"))
            except ConfigError as err:
                errors.extend(err.errors)

    if "diagnoses" not in bad and isinstance(raw_diagnoses, list):
        errors.extend(_diagnosis_errors(raw_diagnoses, registry))

    if "backend" not in bad:
        try:
            order(
                {name: entry.cls for name, entry in registry.providers.items()},
                data.get("backend", "auto"),
            )
        except ConfigError as err:
            errors.extend(err.errors)

    log = data.get("log")
    if "log" not in bad and isinstance(log, str):
        try:
            check_log_path(log)  # what the log writer checks, creating and changing nothing
        except (OSError, ValueError) as err:
            errors.append(("log", f"cannot open the log file {log!r}: {err}"))

    if errors or settings is None:
        errors.sort(key=lambda e: _position(e[0], data))  # stable: ties keep check order
        raise ConfigError(errors, source)
    return ValidatedConfig(settings, quantities, sinks)


def _position(path: str, data: Any) -> tuple[int, ...]:
    """Where ``path`` (``quantities.2.bins``) is in ``data``, to sort errors in file order."""
    out = []
    node = data
    for part in path.split(".") if path else ():
        if isinstance(node, dict):
            keys = [str(k) for k in node]
            index = keys.index(part) if part in keys else len(keys)
            node = node.get(part)
        elif isinstance(node, (list, tuple)) and part.isdigit():
            index = int(part)
            node = node[index] if index < len(node) else None
        else:
            break
        out.append(index)
    return tuple(out)


def _diagnosis_errors(entries: list[Any], registry: Registry) -> list[tuple[str, str]]:
    """The problems of the ``diagnoses`` entries: unknown names and invalid options.

    Each entry is built as ``Cockpit(diagnoses=...)`` and ``cockpit diagnose --config``
    build it (:func:`cockpit_core.diagnosing.build.build_diagnoses`), one at a time so that
    every problem is reported.
    """
    errors: list[tuple[str, str]] = []
    for i, entry in enumerate(entries):
        try:
            build_diagnoses([entry], registry)
        except ConfigError as err:
            for path, message in err.errors:  # diagnoses.<name or 0>.option -> the index
                parts = path.split(".")
                errors.append((".".join(["diagnoses", str(i), *parts[2:]]), message))
        except UnknownNameError as err:
            errors.append((f"diagnoses.{i}", str(err)))
    return errors


def _validate_sink(entry: Any, registry: Registry, path: str) -> ValidatedSink:
    name = entry if isinstance(entry, str) else entry["name"]
    name_path = path if isinstance(entry, str) else f"{path}.name"
    try:
        sink = registry.sink_entry(name)
    except (UnknownNameError, DuplicateNameError) as err:
        raise ConfigError([(name_path, str(err))]) from None
    options = {} if isinstance(entry, str) else {k: v for k, v in entry.items() if k != "name"}
    return ValidatedSink(path, name, sink.validate(options, prefix=path))
