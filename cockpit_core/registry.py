"""Name -> quantity class (and preset) lookup, built from the installed plugins."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from cockpit_core import plugins as _plugins
from cockpit_core.errors import DuplicateQuantityError, UnknownQuantityError
from cockpit_core.plugins import PluginInfo
from cockpit_core.quantity import Quantity, check_quantity_class


@dataclass(frozen=True)
class QuantityEntry:
    """A registered quantity class and where it comes from."""

    cls: type[Quantity]
    plugin: str
    distribution: str
    version: str

    @property
    def name(self) -> str:
        """The quantity name."""
        return self.cls.name


@dataclass(frozen=True)
class Preset:
    """A named list of quantity specs (names or config dicts)."""

    name: str
    quantities: tuple[Any, ...]
    description: str
    distribution: str


@dataclass
class Registry:
    """Quantities and presets offered by a set of plugins.

    Build it with :meth:`from_entry_points` (what :class:`~cockpit_core.Cockpit` does) or
    empty, adding plugins with :meth:`add_plugin` (useful in tests).
    """

    quantities: dict[str, QuantityEntry] = field(default_factory=dict)
    presets: dict[str, Preset] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    conflicts: dict[str, DuplicateQuantityError] = field(default_factory=dict)
    plugins: list[PluginInfo] = field(default_factory=list)
    plugin_manager: pluggy.PluginManager = field(default_factory=_plugins.new_plugin_manager)

    @classmethod
    def from_entry_points(cls, group: str = _plugins.hookspecs.PROJECT_NAME) -> Registry:
        """Discover and load every installed plugin of the entry-point ``group``."""
        pm, infos = _plugins.discover(group)
        registry = cls(plugin_manager=pm)
        for info in infos:
            registry.plugins.append(info)
            if info.ok:
                registry._collect(info)
        return registry

    def add_plugin(
        self,
        plugin: Any,
        name: str | None = None,
        distribution: str = "<local>",
        version: str = "0",
    ) -> PluginInfo:
        """Register a plugin object (e.g. a module with hook implementations) directly."""
        info = PluginInfo(
            name=name or getattr(plugin, "__name__", repr(plugin)),
            distribution=distribution,
            version=version,
            module=getattr(plugin, "__name__", ""),
        )
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

        try:
            self._call(info.name, "register_quantities", register=register_quantity)
            self._call(info.name, "register_presets", register=register_preset)
        except Exception as err:
            info.error = f"hook raised {type(err).__name__}: {err}"
            self.plugin_manager.unregister(name=info.name)
            return
        for entry in new_q:
            if self._claim(entry.name, entry.distribution):
                self.quantities[entry.name] = entry
                self.aliases.setdefault(entry.cls.__name__, entry.name)
                info.quantities.append(entry.name)
        for preset in new_p:
            if self._claim(preset.name, preset.distribution):
                self.presets[preset.name] = preset
                info.presets.append(preset.name)

    def _call(self, plugin_name: str, hook: str, **kwargs: Any) -> None:
        plugin = self.plugin_manager.get_plugin(plugin_name)
        for impl in getattr(self.plugin_manager.hook, hook).get_hookimpls():
            if impl.plugin is plugin:
                impl.function(**{k: v for k, v in kwargs.items() if k in impl.argnames})

    def _claim(self, name: str, distribution: str) -> bool:
        """Return whether ``name`` is free; otherwise remember the collision and skip it."""
        owner = None
        if name in self.quantities:
            owner = self.quantities[name].distribution
        elif name in self.presets:
            owner = self.presets[name].distribution
        if owner is None:
            return True
        self.conflicts[name] = DuplicateQuantityError(
            f"The name '{name}' is registered by both '{owner}' and '{distribution}'. "
            "Uninstall one of the two distributions (pip uninstall ...), or ask one author "
            "to rename the quantity."
        )
        return False

    # -- lookup ---------------------------------------------------------------------------

    def get(self, name: str) -> type[Quantity]:
        """Return the quantity class registered as ``name`` (or its class-name alias).

        Raises:
            DuplicateQuantityError: Two installed distributions register ``name``.
            UnknownQuantityError: With the closest installed name and the full list, and a
                note on plugins that failed to load.

        """
        canonical = self.aliases.get(name, name)
        if canonical in self.conflicts:
            raise self.conflicts[canonical]
        if canonical in self.quantities:
            return self.quantities[canonical].cls
        err = UnknownQuantityError(name, self.quantities)
        failed = [p for p in self.plugins if not p.ok]
        if failed:
            notes = "; ".join(f"'{p.name}' ({p.distribution}): {p.error}" for p in failed)
            err.message += f" Note: these plugins failed to load and may provide it: {notes}."
        raise err

    def preset(self, name: str) -> Preset:
        """Return the preset ``name``."""
        if name in self.conflicts:
            raise self.conflicts[name]
        if name not in self.presets:
            raise UnknownQuantityError(name, self.presets, kind="preset")
        return self.presets[name]

    def is_known(self, name: str) -> bool:
        """Whether ``name`` is a quantity, an alias or a preset."""
        return name in self.quantities or name in self.aliases or name in self.presets

    def names(self) -> list[str]:
        """Sorted quantity names."""
        return sorted(self.quantities)


_DEFAULT: Registry | None = None
_LOCK = threading.Lock()


def default_registry(refresh: bool = False) -> Registry:
    """The registry of all installed plugins, discovered once per process."""
    global _DEFAULT
    with _LOCK:
        if _DEFAULT is None or refresh:
            _DEFAULT = Registry.from_entry_points()
        return _DEFAULT
