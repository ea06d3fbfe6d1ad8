"""The :class:`Registry`: everything the installed plugins register, by name.

Its tables are :class:`~cockpit_core.name_table.NameTable` of the entries in
:mod:`cockpit_core.registry_entries` (re-exported here).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import torch

from cockpit_core import plugins as _plugins
from cockpit_core.diagnosis import check_diagnosis_class
from cockpit_core.errors import (
    CockpitWarning,
    DuplicateNameError,
    UnknownPresetError,
    UnknownQuantityError,
    UnknownSinkError,
)
from cockpit_core.instrument import Instrument
from cockpit_core.name_table import NameTable
from cockpit_core.plugins import PluginInfo
from cockpit_core.quantity import (
    NAME_PATTERN,
    Quantity,
    check_quantity_class,
)
from cockpit_core.registry_entries import (
    DiagnosisEntry,
    Preset,
    ProviderEntry,
    QuantityEntry,
    SinkEntry,
    check_provider_class,
)
from cockpit_core.statistics.kinds import StatisticKind

__all__ = [
    "DiagnosisEntry",
    "Preset",
    "ProviderEntry",
    "QuantityEntry",
    "Registry",
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

    catalog: NameTable[QuantityEntry | Preset] = field(
        default_factory=lambda: NameTable("name", "quantity or preset", strict=True)
    )
    aliases: dict[str, str] = field(default_factory=dict)
    instruments: NameTable[Instrument] = field(
        default_factory=lambda: NameTable("instrument name", "instrument", strict=False)
    )
    sinks: NameTable[SinkEntry] = field(
        default_factory=lambda: NameTable("sink name", "sink", strict=True)
    )
    providers: NameTable[ProviderEntry] = field(
        default_factory=lambda: NameTable("statistics provider name", "provider", strict=False)
    )
    kinds: NameTable[StatisticKind] = field(
        default_factory=lambda: NameTable("statistic kind", "kind", strict=False)
    )
    diagnoses: NameTable[DiagnosisEntry] = field(
        default_factory=lambda: NameTable("diagnosis name", "diagnosis", strict=True)
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
    def from_entry_points(cls, group: str = _plugins.hookspecs.PROJECT_NAME) -> Registry:
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
        """Run one plugin's hooks; commit its registrations only if all of them succeed."""
        new_q: list[QuantityEntry] = []
        new_p: list[Preset] = []

        def register_quantity(qcls: type) -> None:
            check_quantity_class(qcls)
            new_q.append(QuantityEntry(qcls, info.name, info.distribution, info.version))

        def register_preset(name: str, quantities: Iterable[Any], description: str = "") -> None:
            new_p.append(Preset(name, tuple(quantities), description, info.distribution))

        new_i: list[Instrument] = []
        new_s: list[SinkEntry] = []
        new_prov: list[ProviderEntry] = []
        new_k: list[StatisticKind] = []

        def register_provider(pcls: type) -> None:
            check_provider_class(pcls)
            new_prov.append(ProviderEntry(pcls, info.distribution, info.version))

        def register_kind(kind: StatisticKind) -> None:
            if not isinstance(kind, StatisticKind):
                raise TypeError(
                    f"register_statistic_kinds: {kind!r} is not a cockpit_core.StatisticKind."
                )
            if not NAME_PATTERN.match(kind.name):
                raise TypeError(f"statistic kind name {kind.name!r} is not snake_case.")
            new_k.append(kind)

        def register_instrument(instrument: Instrument) -> None:
            if not isinstance(instrument, Instrument):
                raise TypeError(
                    f"register_instruments: {instrument!r} is not a "
                    "cockpit_core.dashboard.Instrument."
                )
            new_i.append(instrument)

        new_d: list[DiagnosisEntry] = []

        def register_diagnosis(dcls: type) -> None:
            check_diagnosis_class(dcls)
            new_d.append(DiagnosisEntry(dcls, info.distribution, info.version))

        def register_sink(
            name: str, factory: Any, config: Any = None, description: str = ""
        ) -> None:
            if not callable(factory):
                raise TypeError(f"register_sinks: the factory of sink '{name}' is not callable.")
            new_s.append(SinkEntry(name, factory, config, description, info.distribution))

        try:
            self._call(info.name, "register_quantities", register=register_quantity)
            self._call(info.name, "register_presets", register=register_preset)
            self._call(info.name, "register_statistic_providers", register=register_provider)
            self._call(info.name, "register_statistic_kinds", register=register_kind)
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # SystemExit from a plugin must not end the program
            info.error = f"hook raised {_plugins.describe_error(err)}"
            self.plugin_manager.unregister(name=info.name)
            return
        try:  # a broken panel or sink must not cost the user the plugin's quantities
            self._call(info.name, "register_instruments", register=register_instrument)
            self._call(info.name, "register_sinks", register=register_sink)
        except KeyboardInterrupt:
            raise
        except BaseException as err:
            new_i.clear()
            new_s.clear()
            self.extension_errors[info.name] = (
                f"'{info.name}' ({info.distribution}): register_instruments/register_sinks "
                f"raised {_plugins.describe_error(err)}; its panels and sinks are skipped, its "
                "quantities still work."
            )
            warnings.warn(f"cockpit: plugin {self.extension_errors[info.name]}", stacklevel=2)
        try:  # nor a broken diagnosis
            self._call(info.name, "register_diagnoses", register=register_diagnosis)
        except KeyboardInterrupt:
            raise
        except BaseException as err:
            new_d.clear()
            self.extension_errors[info.name] = (
                f"'{info.name}' ({info.distribution}): register_diagnoses raised "
                f"{_plugins.describe_error(err)}; its diagnoses are skipped, its quantities "
                "still work."
            )
            warnings.warn(f"cockpit: plugin {self.extension_errors[info.name]}", stacklevel=2)
        for entry in new_q:
            if self.catalog.add(entry.name, entry, entry.distribution):
                self.aliases.setdefault(entry.cls.__name__, entry.name)
                info.quantities.append(entry.name)
        for preset in new_p:
            if self.catalog.add(preset.name, preset, preset.distribution):
                info.presets.append(preset.name)
        for provider in new_prov:
            if self.providers.add(provider.name, provider, provider.distribution):
                info.providers.append(provider.name)
        for kind in new_k:
            if self.kinds.add(kind.name, kind, info.distribution):
                info.kinds.append(kind.name)
        for instrument in new_i:  # listed also when it clashes: `cockpit plugins` shows both
            info.instruments.append(instrument.name)
            self.instruments.add(instrument.name, instrument, info.distribution)
        for sink in new_s:
            info.sinks.append(sink.name)
            self.sinks.add(sink.name, sink, info.distribution)
        for diagnosis in new_d:
            info.diagnoses.append(diagnosis.name)
            self.diagnoses.add(diagnosis.name, diagnosis, info.distribution)

    @property
    def quantities(self) -> dict[str, QuantityEntry]:
        """Quantity name -> entry (the quantities of :attr:`catalog`)."""
        return {n: e for n, e in self.catalog.items() if isinstance(e, QuantityEntry)}

    @property
    def presets(self) -> dict[str, Preset]:
        """Preset name -> preset (the presets of :attr:`catalog`)."""
        return {n: e for n, e in self.catalog.items() if isinstance(e, Preset)}

    @property
    def conflicts(self) -> dict[str, DuplicateNameError]:
        """Every name two distributions registered, with the error that describes it.

        Keys: the name for quantities and presets; ``"provider:"``, ``"kind:"``,
        ``"instrument:"``, ``"sink:"`` or ``"diagnosis:"`` and the name otherwise.
        """
        found: dict[str, DuplicateNameError] = dict(self.catalog.clashes())
        for prefix, table in (
            ("provider", self.providers),
            ("kind", self.kinds),
            ("instrument", self.instruments),
            ("sink", self.sinks),
            ("diagnosis", self.diagnoses),
        ):
            found.update({f"{prefix}:{n}": err for n, err in table.clashes().items()})
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

    def get(self, name: str) -> type[Quantity]:
        """Return the quantity class registered as ``name`` (or its class-name alias).

        Raises:
            DuplicateNameError: Two installed distributions register ``name``.
            UnknownQuantityError: With the closest installed name and the full list, and a
                note on plugins that failed to load.

        """
        canonical = self.aliases.get(name, name)
        entry = self.catalog.lookup(canonical)
        if isinstance(entry, QuantityEntry):
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
