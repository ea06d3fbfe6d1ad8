"""The sorts of things plugins register: one declaration per hook.

A :class:`Sort` says which hook registers it, how one ``register(...)`` call is checked and
turned into an entry, which table of the :class:`~cockpit_core.plugin.registry.Registry`
keeps it, and which sorts are skipped together when one of their hooks raises. The registry
runs every sort the same way, so adding a hook to cockpit is its spec in
:mod:`cockpit_core.hookspecs` and one :class:`Sort` in :data:`SORTS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cockpit_core.cli import CORE_COMMANDS
from cockpit_core.diagnosis import check_diagnosis_class
from cockpit_core.instrument import Instrument
from cockpit_core.plugin.discovery import PluginInfo
from cockpit_core.plugin.entries import (
    ClassEntry,
    CommandEntry,
    Preset,
    RendererEntry,
    SinkEntry,
    check_provider_class,
)
from cockpit_core.plugin.name_table import NameTable
from cockpit_core.quantity import NAME_PATTERN, check_quantity_class
from cockpit_core.statistics.kinds import StatisticKind

ESSENTIAL = "essential"
"""The group of the sorts a plugin exists for: if one of their hooks raises, the plugin is
skipped as a whole. A hook of another group that raises costs only that group's entries."""


@dataclass(frozen=True)
class Sort:
    """One sort of registered thing.

    Attributes:
        key: Its name in :attr:`PluginInfo.registered` and in ``cockpit plugins --json``.
        hook: The hook whose ``register`` callback adds it.
        table: The registry table that keeps it (quantities and presets share ``catalog``).
        accept: ``accept(info, *args, **kwargs)``: one ``register(...)`` call of plugin
            ``info`` checked and made an entry with a ``name``; raises ``TypeError`` with
            the fix.
        noun: What the entries are called in messages, plural.
        group: Sorts skipped together when one of their hooks raises (see :data:`ESSENTIAL`).
        listed_when_clashing: Listed under the plugin even when another distribution took
            the name (``cockpit plugins`` then shows both); otherwise only if it was added.

    """

    key: str
    hook: str
    table: str
    accept: Callable[..., Any]
    noun: str
    group: str
    listed_when_clashing: bool = False


def _quantity(info: PluginInfo, cls: type) -> ClassEntry[Any]:
    check_quantity_class(cls)
    return ClassEntry(cls, info.distribution, info.version)


def _preset(
    info: PluginInfo, name: str, quantities: Iterable[Any], description: str = ""
) -> Preset:
    return Preset(name, tuple(quantities), description, info.distribution)


def _provider(info: PluginInfo, cls: type) -> ClassEntry[Any]:
    check_provider_class(cls)
    return ClassEntry(cls, info.distribution, info.version)


def _kind(info: PluginInfo, kind: StatisticKind) -> StatisticKind:
    if not isinstance(kind, StatisticKind):
        raise TypeError(f"register_statistic_kinds: {kind!r} is not a cockpit_core.StatisticKind.")
    if not NAME_PATTERN.match(kind.name):
        raise TypeError(f"statistic kind name {kind.name!r} is not snake_case.")
    return kind


def _instrument(info: PluginInfo, instrument: Instrument) -> Instrument:
    if not isinstance(instrument, Instrument):
        raise TypeError(
            f"register_instruments: {instrument!r} is not a cockpit_core.instrument.Instrument."
        )
    return instrument


def _sink(
    info: PluginInfo, name: str, factory: Any, config: Any = None, description: str = ""
) -> SinkEntry:
    if not callable(factory):
        raise TypeError(f"register_sinks: the factory of sink '{name}' is not callable.")
    return SinkEntry(name, factory, config, description, info.distribution)


def _diagnosis(info: PluginInfo, cls: type) -> ClassEntry[Any]:
    check_diagnosis_class(cls)
    return ClassEntry(cls, info.distribution, info.version)


def _renderer(
    info: PluginInfo, suffix: str, render: Callable[..., Any], description: str = ""
) -> RendererEntry:
    if not isinstance(suffix, str) or not suffix.startswith(".") or not suffix[1:].isalnum():
        raise TypeError(
            f"register_renderers: the suffix must be a dot and letters or digits, such as "
            f"'.png'; got {suffix!r}."
        )
    if not callable(render):
        raise TypeError(f"register_renderers: the renderer of {suffix!r} is not callable.")
    return RendererEntry(suffix.lower(), render, description, info.distribution)


def _command(
    info: PluginInfo,
    name: str,
    configure: Callable[..., None],
    run: Callable[..., Any],
    help: str = "",
) -> CommandEntry:
    if not isinstance(name, str) or not NAME_PATTERN.match(name.replace("-", "_")):
        raise TypeError(
            f"register_commands: a command name is lowercase words joined by '-' or '_'; "
            f"got {name!r}."
        )
    if name in CORE_COMMANDS:
        raise TypeError(
            f"register_commands: 'cockpit {name}' is a command of the core; pick another name."
        )
    if not callable(configure) or not callable(run):
        raise TypeError(
            f"register_commands: configure and run of command '{name}' must be callable."
        )
    return CommandEntry(name, configure, run, help, info.distribution)


SORTS: tuple[Sort, ...] = (
    Sort("quantities", "register_quantities", "catalog", _quantity, "quantities", ESSENTIAL),
    Sort("presets", "register_presets", "catalog", _preset, "presets", ESSENTIAL),
    Sort(
        "instruments", "register_instruments", "instruments", _instrument, "panels", "views", True
    ),
    Sort("sinks", "register_sinks", "sinks", _sink, "sinks", "views", True),
    Sort(
        "providers", "register_statistic_providers", "providers", _provider, "providers", ESSENTIAL
    ),
    Sort("kinds", "register_statistic_kinds", "kinds", _kind, "kinds", ESSENTIAL),
    Sort(
        "diagnoses", "register_diagnoses", "diagnoses", _diagnosis, "diagnoses", "diagnoses", True
    ),
    Sort("renderers", "register_renderers", "renderers", _renderer, "renderers", "renderers", True),
    Sort("commands", "register_commands", "commands", _command, "commands", "commands", True),
)
"""Every sort, in the order ``cockpit plugins`` lists them. The registry runs the hooks of the
essential group first, then each other group in this order."""


TABLES: dict[str, Callable[[], NameTable[Any]]] = {
    "catalog": lambda: NameTable("name", "quantity or preset", strict=True),
    "providers": lambda: NameTable("statistics provider name", "provider", strict=False),
    "kinds": lambda: NameTable("statistic kind", "kind", strict=False),
    "instruments": lambda: NameTable("instrument name", "instrument", strict=False),
    "sinks": lambda: NameTable("sink name", "sink", strict=True),
    "diagnoses": lambda: NameTable("diagnosis name", "diagnosis", strict=True),
    "renderers": lambda: NameTable("file suffix", "renderer", strict=True),
    "commands": lambda: NameTable("command name", "command", strict=True),
}
"""Each table of the registry and how it treats a name two distributions register:
``strict`` tables refuse to pick one, the others keep the first and report the clash."""
