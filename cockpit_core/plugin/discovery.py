"""Plugin discovery over ``importlib.metadata`` entry points, one plugin at a time.

pluggy's own ``load_setuptools_entrypoints`` stops at the first plugin that fails to
import; here each entry point is loaded in isolation, so a broken plugin is reported
(``cockpit plugins``) and skipped while the others still load. Isolation covers every
``BaseException`` but ``KeyboardInterrupt``: a plugin that calls ``sys.exit()`` at import or
in a hook is skipped like one that raises ``ImportError``.

Local plugins need no distribution: every ``*.py`` module in the folders of the environment
variable ``COCKPIT_PLUGINS_DIR`` (several separated by ``os.pathsep``) is imported and
registered as a plugin named after its file, with the same isolation (files whose name starts
with ``_`` are skipped).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import Any

import pluggy

from cockpit_core import hookspecs

PLUGINS_DIR_VARIABLE = "COCKPIT_PLUGINS_DIR"
"""Environment variable: folders (``os.pathsep``-separated) whose ``*.py`` files are plugins."""

CORE_DISTRIBUTION = "cockpit-core"
"""The core's distribution name (its version: :func:`core_version`)."""

LOCAL_DISTRIBUTION = "<local>"
"""``PluginInfo.version`` of a local plugin; its ``distribution`` is the file's path."""


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution``.

    ``"0+unknown"`` when it runs from a source tree that is not installed.
    """
    try:
        return version(distribution)
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"


def core_version() -> str:
    """The installed cockpit-core's version (``cockpit_core.__version__``)."""
    return installed_version(CORE_DISTRIBUTION)


@dataclass
class PluginInfo:
    """What cockpit knows about one plugin.

    Attributes:
        name: Entry-point name, or a local plugin's file name without ``.py`` (also the
            pluggy plugin name).
        distribution: Name of the distribution that declares the entry point; a local
            plugin's file path.
        version: Version of that distribution; ``<local>`` for a local plugin.
        module: Import path of the plugin object; a local plugin's file path.
        error: Why the plugin was skipped, or ``None`` if it loaded.
        hooks: Names of the cockpit hooks it implements, in documentation order.
        registered: Names of what it registered, by sort (``"quantities"``, ``"sinks"``,
            ...: the keys of :data:`cockpit_core.plugin.sorts.SORTS`); each sort is also an
            attribute (``info.quantities``), empty for sorts it did not register.

    """

    name: str
    distribution: str = "?"
    version: str = "?"
    module: str = ""
    error: str | None = None
    hooks: list[str] = field(default_factory=list)
    registered: dict[str, list[str]] = field(default_factory=dict)

    def __getattr__(self, sort: str) -> list[str]:
        """``info.quantities`` and the like: the names registered of that sort."""
        if sort.startswith("_") or sort in ("name", "registered"):
            raise AttributeError(sort)
        registered: dict[str, list[str]] = self.__dict__.get("registered", {})
        return registered.get(sort, [])

    @property
    def ok(self) -> bool:
        """Whether the plugin loaded and its hooks ran."""
        return self.error is None


def new_plugin_manager() -> pluggy.PluginManager:
    """A plugin manager that knows cockpit's hook specs and no plugins."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def hook_names(pm: pluggy.PluginManager, plugin: Any) -> list[str]:
    """Names of the hooks ``plugin`` implements: its attributes marked with cockpit's ``hookimpl``.

    A ``hookimpl(specname=...)`` counts under its ``specname``. Implementations marked
    ``optionalhook=True`` are left out unless their hook exists: pluggy tolerates them.

    Returns:
        The names, without duplicates, in the order of ``dir(plugin)``.

    """
    names: list[str] = []
    for attr in dir(plugin):
        try:
            opts = pm.parse_hookimpl_opts(plugin, attr)
        except Exception:  # an attribute pluggy cannot inspect is no hook
            opts = None
        if opts is None:
            continue
        name = opts.get("specname") or attr
        if opts.get("optionalhook") and name not in hookspecs.HOOK_NAMES:
            continue
        if name not in names:
            names.append(name)
    return names


def unknown_hooks_message(names: list[str]) -> str | None:
    """Explain the names in ``names`` that are no cockpit hook, or ``None`` if all are.

    Example: ``unknown hook 'register_quantity' (did you mean 'register_quantities'?);
    cockpit's hooks are register_quantities, register_presets, ...``.
    """
    unknown = [name for name in names if name not in hookspecs.HOOK_NAMES]
    if not unknown:
        return None
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, hookspecs.HOOK_NAMES, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        parts.append(f"'{name}'{hint}")
    noun = "hook" if len(unknown) == 1 else "hooks"
    return (
        f"unknown {noun} {', '.join(parts)}; cockpit's hooks are {', '.join(hookspecs.HOOK_NAMES)}"
    )


def load_plugin(pm: pluggy.PluginManager, plugin: Any, info: PluginInfo) -> bool:
    """Check ``plugin``'s protocol version and hooks, and register it with ``pm``.

    A function marked with cockpit's ``hookimpl`` whose name is no hook spec (a misspelled
    hook, which would otherwise register nothing) makes the plugin fail to load, with a
    did-you-mean naming the valid hooks.

    Args:
        pm: The plugin manager to register with.
        plugin: The plugin object (usually a module).
        info: Filled in: ``hooks`` always, ``error`` when the plugin is skipped.

    Returns:
        Whether the plugin was registered.

    """
    version = getattr(plugin, "COCKPIT_PROTOCOL_VERSION", hookspecs.PROTOCOL_VERSION)
    if version != hookspecs.PROTOCOL_VERSION:
        info.error = (
            f"declares plugin protocol version {version!r}, but this cockpit-core speaks "
            f"version {hookspecs.PROTOCOL_VERSION}; upgrade the plugin or cockpit-core"
        )
        return False
    names = hook_names(pm, plugin)
    info.hooks = [name for name in hookspecs.HOOK_NAMES if name in names]
    unknown = unknown_hooks_message(names)
    if unknown is not None:
        info.error = f"invalid hook implementation: {unknown}"
        return False
    try:
        pm.register(plugin, name=info.name)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # pluggy validates hook names and signatures here
        info.error = f"invalid hook implementation: {describe_error(err, exception_name=False)}"
        return False
    return True


def discover(
    group: str = hookspecs.PROJECT_NAME, plugins_dirs: Sequence[str | Path] | None = None
) -> tuple[pluggy.PluginManager, list[PluginInfo]]:
    """Load every plugin of the entry-point ``group`` and the local plugins, isolating failures.

    Args:
        group: The entry-point group.
        plugins_dirs: Folders of local plugin modules (default: :func:`plugins_dirs_from_env`).

    Returns:
        The plugin manager with every plugin that loaded, and one :class:`PluginInfo` per
        entry point, then per local module (failed ones have ``error`` set).

    """
    pm = new_plugin_manager()
    infos: list[PluginInfo] = []
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        info = _info_for(ep)
        infos.append(info)
        try:
            plugin = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # SystemExit at import must not end the program
            info.error = f"import failed: {_summary(err)}"
            continue
        load_plugin(pm, plugin, info)
    dirs = plugins_dirs_from_env() if plugins_dirs is None else list(plugins_dirs)
    infos.extend(load_local_plugins(pm, dirs, taken={info.name for info in infos}))
    return pm, infos


def plugins_dirs_from_env() -> list[str]:
    """The folders named by ``COCKPIT_PLUGINS_DIR`` (empty entries ignored)."""
    value = os.environ.get(PLUGINS_DIR_VARIABLE, "")
    return [entry for entry in value.split(os.pathsep) if entry.strip()]


def load_local_plugins(
    pm: pluggy.PluginManager, dirs: Sequence[str | Path], taken: set[str] | None = None
) -> list[PluginInfo]:
    """Import every ``*.py`` file of ``dirs`` (sorted, ``_*`` skipped) and register it with ``pm``.

    Each module is a plugin named after its file (``my_panels.py``: ``my_panels``), its
    ``distribution`` the file's path and its ``version`` :data:`LOCAL_DISTRIBUTION`. A module
    that fails to import, a name already taken by another plugin, or a folder that does not
    exist gives a :class:`PluginInfo` with ``error`` set; the other modules still load.

    Args:
        pm: The plugin manager to register with.
        dirs: The folders, in order.
        taken: Names of the plugins loaded already (updated).

    Returns:
        One :class:`PluginInfo` per module (and per missing folder).

    """
    taken = set() if taken is None else taken
    infos: list[PluginInfo] = []
    for folder in map(Path, dirs):
        if not folder.is_dir():
            infos.append(
                PluginInfo(
                    name=str(folder),
                    distribution=PLUGINS_DIR_VARIABLE,
                    version=LOCAL_DISTRIBUTION,
                    error=f"{PLUGINS_DIR_VARIABLE} names {str(folder)!r}, which is no folder",
                )
            )
            continue
        for path in sorted(folder.glob("*.py")):
            if path.name.startswith("_"):
                continue
            path = path.resolve()
            info = PluginInfo(
                name=path.stem,
                distribution=str(path),
                version=LOCAL_DISTRIBUTION,
                module=str(path),
            )
            infos.append(info)
            if info.name in taken:
                info.error = (
                    f"another plugin is named '{info.name}' already; rename the file {path.name}"
                )
                continue
            taken.add(info.name)
            try:
                module = _import_file(path)
            except KeyboardInterrupt:
                raise
            except BaseException as err:  # SystemExit at import must not end the program
                info.error = f"import failed: {_summary(err)}"
                continue
            load_plugin(pm, module, info)
    return infos


def _import_file(path: Path) -> Any:
    """Import the module at ``path`` once per process (later calls return the same module)."""
    name = "cockpit_local_plugin_" + re.sub(r"\W", "_", path.stem)
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickle look classes up by module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def describe_error(err: BaseException, exception_name: bool = True) -> str:
    """``Type: message`` of an exception a plugin raised, readable also for ``sys.exit()``."""
    message = str(err)
    if isinstance(err, SystemExit):
        message = f"{message or 'None'} (the plugin called sys.exit() or raised SystemExit)"
    if not exception_name:
        return message
    return f"{type(err).__name__}: {message}" if message else type(err).__name__


def _info_for(ep: EntryPoint) -> PluginInfo:
    dist = getattr(ep, "dist", None)
    try:
        name = dist.metadata["Name"] if dist is not None else "?"
        version = dist.version if dist is not None else "?"
    except Exception:  # broken metadata: still list the entry point
        name, version = "?", "?"
    return PluginInfo(name=ep.name, distribution=name or "?", version=version, module=ep.value)


def _summary(err: BaseException) -> str:
    last = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
    return f"{describe_error(err)}{where}"
