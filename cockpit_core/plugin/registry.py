"""The :class:`Registry`: everything the installed plugins register, by name.

Its tables are :class:`~cockpit_core.plugin.name_table.NameTable` of the entries in
:mod:`cockpit_core.plugin.entries` (re-exported here).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import torch

from cockpit_core import hookspecs
from cockpit_core.errors import (
    CockpitWarning,
    DuplicateNameError,
    UnknownPresetError,
    UnknownQuantityError,
    UnknownRendererError,
    UnknownSinkError,
)
from cockpit_core.instrument import Instrument
from cockpit_core.plugin import discovery as _plugins
from cockpit_core.plugin.discovery import PluginInfo
from cockpit_core.plugin.entries import (
    ClassEntry,
    CommandEntry,
    DiagnosisEntry,
    Preset,
    ProviderEntry,
    QuantityEntry,
    RendererEntry,
    SinkEntry,
    check_provider_class,
)
from cockpit_core.plugin.name_table import NameTable
from cockpit_core.plugin.sorts import ESSENTIAL, SORTS, TABLES
from cockpit_core.quantity import Quantity
from cockpit_core.statistics.kinds import StatisticKind

__all__ = [
    "ClassEntry",
    "CommandEntry",
    "DiagnosisEntry",
    "Preset",
    "ProviderEntry",
    "QuantityEntry",
    "Registry",
    "RendererEntry",
    "SinkEntry",
    "check_provider_class",
    "default_registry",
]


@dataclass
class Registry:
    """Everything a set of plugins offers, by name: one :class:`NameTable` per sort.

    Quantities and presets share one namespace (``catalog``: a config entry may be either);
    ``quantities`` and ``presets`` are views of it. Build it with :meth:`from_entry_points`
    (what :class:`~cockpit_core.Cockpit` does) or empty, adding plugins with
    :meth:`add_plugin` (useful in tests).
    """

    tables: dict[str, NameTable[Any]] = field(
        default_factory=lambda: {name: make() for name, make in TABLES.items()}
    )
    extension_errors: dict[str, str] = field(default_factory=dict)
    plugins: list[PluginInfo] = field(default_factory=list)
    plugin_manager: pluggy.PluginManager = field(default_factory=_plugins.new_plugin_manager)
    builtin: bool = field(default=True, repr=False)

    def __post_init__(self) -> None:
        if self.builtin:  # the core's own plugin: the torch.func provider, the built-in kinds
            from cockpit_core.statistics import builtin

            self.add_plugin(
                builtin, name="core", distribution="cockpit-core", version=_plugins.core_version()
            )

    @classmethod
    def from_entry_points(cls, group: str = hookspecs.PROJECT_NAME) -> Registry:
        """Discover and load every installed plugin of the entry-point ``group``."""
        pm, infos = _plugins.discover(group)
        registry = cls(plugin_manager=pm)
        registry.add_loaded(infos)
        return registry

    def add_loaded(self, infos: Iterable[PluginInfo]) -> None:
        """Collect what plugins already loaded into :attr:`plugin_manager` register."""
        for info in infos:
            self.plugins.append(info)
            if info.ok:
                self._collect(info)

    def add_plugin(
        self,
        plugin: Any,
        name: str | None = None,
        distribution: str = "<local>",
        version: str = "0",
    ) -> PluginInfo:
        """Register a plugin object (e.g. a module with hook implementations) directly."""
        info = PluginInfo(
            name=name or str(getattr(plugin, "__name__", repr(plugin))),
            distribution=distribution,
            version=version,
            module=getattr(plugin, "__name__", ""),
        )
        try:
            hash(plugin)
        except TypeError:  # e.g. a SimpleNamespace: pluggy keeps plugins in sets
            plugin = _hashable_copy(plugin)
        self.plugins.append(info)
        if _plugins.load_plugin(self.plugin_manager, plugin, info):
            self._collect(info)
        return info

    # -- collecting -----------------------------------------------------------------------

    def _collect(self, info: PluginInfo) -> None:
        """Run one plugin's hooks, sort by sort (:data:`~cockpit_core.plugin.sorts.SORTS`).

        If a hook of the essential sorts raises, the plugin is skipped as a whole; if
        another hook raises, only the entries of its group are, with a warning. Entries are
        added to the tables only once every hook ran.
        """
        new: dict[str, list[Any]] = {sort.key: [] for sort in SORTS}
        for group in dict.fromkeys([ESSENTIAL, *(sort.group for sort in SORTS)]):
            sorts = [sort for sort in SORTS if sort.group == group]
            try:
                for sort in sorts:
                    register = _collector(new[sort.key], sort.accept, info)
                    self._call(info.name, sort.hook, register=register)
            except KeyboardInterrupt:
                raise
            except BaseException as err:  # SystemExit from a plugin must not end the program
                if group == ESSENTIAL:
                    info.error = f"hook raised {_plugins.describe_error(err)}"
                    self.plugin_manager.unregister(name=info.name)
                    return
                for sort in sorts:
                    new[sort.key].clear()
                self.extension_errors[info.name] = (
                    f"'{info.name}' ({info.distribution}): "
                    f"{'/'.join(sort.hook for sort in sorts)} raised "
                    f"{_plugins.describe_error(err)}; its "
                    f"{' and '.join(sort.noun for sort in sorts)} are skipped, its quantities "
                    "still work."
                )
                warnings.warn(f"cockpit: plugin {self.extension_errors[info.name]}", stacklevel=2)
        for sort in SORTS:
            listed = info.registered.setdefault(sort.key, [])
            for entry in new[sort.key]:
                added = self.tables[sort.table].add(entry.name, entry, info.distribution)
                if added or sort.listed_when_clashing:
                    listed.append(entry.name)

    # -- the tables -----------------------------------------------------------------------

    @property
    def catalog(self) -> NameTable[QuantityEntry | Preset]:
        """Quantities and presets: one namespace, since a config entry may be either."""
        return self.tables["catalog"]

    @property
    def providers(self) -> NameTable[ProviderEntry]:
        """Statistics providers by name (``backend=...``)."""
        return self.tables["providers"]

    @property
    def kinds(self) -> NameTable[StatisticKind]:
        """Statistic kinds by name."""
        return self.tables["kinds"]

    @property
    def instruments(self) -> NameTable[Instrument]:
        """Dashboard panels by name."""
        return self.tables["instruments"]

    @property
    def sinks(self) -> NameTable[SinkEntry]:
        """Sinks by name."""
        return self.tables["sinks"]

    @property
    def diagnoses(self) -> NameTable[DiagnosisEntry]:
        """Diagnoses by name."""
        return self.tables["diagnoses"]

    @property
    def renderers(self) -> NameTable[RendererEntry]:
        """Renderers by file suffix (``".png"``)."""
        return self.tables["renderers"]

    @property
    def commands(self) -> NameTable[CommandEntry]:
        """Plugin sub-commands of ``cockpit`` by name."""
        return self.tables["commands"]

    @property
    def sort_keys(self) -> tuple[str, ...]:
        """The sorts of things plugins register, in hook order (``"quantities"``, ...)."""
        return tuple(sort.key for sort in SORTS)

    @property
    def aliases(self) -> dict[str, str]:
        """Quantity class name -> quantity name (the first registered, for each class name)."""
        found: dict[str, str] = {}
        for name, entry in self.quantities.items():
            found.setdefault(entry.cls.__name__, name)
        return found

    @property
    def quantities(self) -> dict[str, QuantityEntry]:
        """Quantity name -> entry (the quantities of :attr:`catalog`)."""
        return {n: e for n, e in self.catalog.items() if isinstance(e, ClassEntry)}

    @property
    def presets(self) -> dict[str, Preset]:
        """Preset name -> preset (the presets of :attr:`catalog`)."""
        return {n: e for n, e in self.catalog.items() if isinstance(e, Preset)}

    @property
    def conflicts(self) -> dict[str, DuplicateNameError]:
        """Every name two distributions registered, with the error that describes it.

        Keys: the name for quantities and presets; the table's sort (``"provider:"``,
        ``"kind:"``, ``"instrument:"``, ``"sink:"``, ``"diagnosis:"``, ``"renderer:"``,
        ``"command:"``) and the name otherwise.
        """
        found: dict[str, DuplicateNameError] = dict(self.catalog.clashes())
        for table, prefix in _CONFLICT_PREFIX.items():
            clashes = self.tables[table].clashes()
            found.update({f"{prefix}:{n}": err for n, err in clashes.items()})
        return found

    def prepare_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` after every installed provider's :meth:`StatisticProvider.prepare`.

        For modules cockpit builds for a run itself (``cockpit check``'s loss module, the
        testing kit's problems); a user's model is prepared by the user (e.g.
        ``cockpit_backpack.extend``) or needs nothing (module hooks, ``torch.func``). A
        provider whose ``prepare`` raises is skipped with a :class:`CockpitWarning` naming
        it; the others still prepare the module.
        """
        for entry in self.providers.values():
            try:
                module = entry.cls.prepare(module)
            except Exception as err:  # a plugin's failure must not stop the others
                warnings.warn(
                    f"statistics provider {entry.name!r} ({entry.distribution}) could not "
                    f"prepare {type(module).__name__}: {type(err).__name__}: {err}. Its "
                    "statistics of this module may be missing.",
                    CockpitWarning,
                    stacklevel=2,
                )
        return module

    def _call(self, plugin_name: str, hook: str, **kwargs: Any) -> None:
        """Call one plugin's implementation of ``hook`` through pluggy (so tracing sees it)."""
        pm = self.plugin_manager
        plugin = pm.get_plugin(plugin_name)
        others = [p for p in pm.get_plugins() if p is not plugin]
        pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)

    def sink_entry(self, name: str) -> SinkEntry:
        """Return the sink registered as ``name``.

        Raises:
            DuplicateNameError: Several installed distributions register ``name``.
            UnknownSinkError: With the closest installed sink name.

        """
        entry = self.sinks.lookup(name)
        if entry is None:
            raise UnknownSinkError(name, self.sinks)
        return entry

    def make_sink(self, spec: Any, path: str | None = None) -> Any:
        """Build a sink from a registered name, ``{"name": ..., **options}`` or a callable.

        Args:
            spec: The sink.
            path: Field path of the entry for messages (default ``sinks.<name>``).

        Raises:
            UnknownSinkError: No installed plugin registers a sink of that name.
            DuplicateNameError: Several installed distributions register that name.
            ConfigError: The options are invalid (the message names each field).

        """
        if callable(spec) and not isinstance(spec, (str, dict)):
            return spec
        if isinstance(spec, str):
            name, options = spec, {}
        elif isinstance(spec, dict) and isinstance(spec.get("name"), str):
            options = {k: v for k, v in spec.items() if k != "name"}
            name = spec["name"]
        else:
            raise TypeError(
                f"a sink is a registered name, a dict {{'name': ..., **options}} or a callable "
                f"sink(record); got {spec!r}."
            )
        return self.sink_entry(name).make(options, prefix=path)

    # -- lookup ---------------------------------------------------------------------------

    def renderer(self, path: str | os.PathLike[str] | None) -> RendererEntry:
        """The renderer of ``path``'s suffix (``.png`` when ``path`` is ``None``).

        Raises:
            UnknownRendererError: No installed plugin renders that suffix (with those that
                are installed).
            DuplicateNameError: Several installed distributions render it.

        """
        suffix = ".png" if path is None else Path(path).suffix.lower()
        entry = self.renderers.lookup(suffix)
        if entry is None:
            raise UnknownRendererError(suffix or str(path), self.renderers)
        return entry

    def get(self, name: str) -> type[Quantity]:
        """Return the quantity class registered as ``name`` (or its class-name alias).

        Raises:
            DuplicateNameError: Two installed distributions register ``name``.
            UnknownQuantityError: With the closest installed name and the full list, and a
                note on plugins that failed to load.

        """
        canonical = self.aliases.get(name, name)
        entry = self.catalog.lookup(canonical)
        if isinstance(entry, ClassEntry):
            return entry.cls
        err = UnknownQuantityError(name, self.quantities)
        failed = [p for p in self.plugins if not p.ok]
        if failed:
            notes = "; ".join(f"'{p.name}' ({p.distribution}): {p.error}" for p in failed)
            err.message += f" Note: these plugins failed to load and may provide it: {notes}."
        raise err

    def preset(self, name: str) -> Preset:
        """Return the preset ``name``.

        Raises:
            DuplicateNameError: Several installed distributions register ``name``.
            UnknownPresetError: With the closest installed preset name.

        """
        entry = self.catalog.lookup(name)
        if not isinstance(entry, Preset):
            raise UnknownPresetError(name, self.presets)
        return entry

    def is_known(self, name: str) -> bool:
        """Whether ``name`` is a quantity, an alias or a preset."""
        return name in self.catalog or name in self.aliases

    def names(self) -> list[str]:
        """Sorted quantity names."""
        return sorted(self.quantities)


def _collector(
    found: list[Any], accept: Callable[..., Any], info: PluginInfo
) -> Callable[..., None]:
    """The ``register`` callback of one hook: each call checked, then kept in ``found``."""

    def register(*args: Any, **kwargs: Any) -> None:
        found.append(accept(info, *args, **kwargs))

    return register


_CONFLICT_PREFIX = {table: table.removesuffix("s") for table in TABLES if table != "catalog"}
_CONFLICT_PREFIX["diagnoses"] = "diagnosis"


def _hashable_copy(plugin: Any) -> Any:
    """An object with ``plugin``'s attributes that pluggy can keep in a set."""
    copy = type(type(plugin).__name__, (), {})()
    for key, value in vars(plugin).items():
        setattr(copy, key, value)
    return copy


_DEFAULT: Registry | None = None
_LOCK = threading.Lock()


def default_registry(refresh: bool = False) -> Registry:
    """The registry of all installed plugins, discovered once per process."""
    global _DEFAULT
    with _LOCK:
        if _DEFAULT is None or refresh:
            _DEFAULT = Registry.from_entry_points()
        return _DEFAULT
