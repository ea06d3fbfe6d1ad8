"""Plugin discovery over ``importlib.metadata`` entry points, one plugin at a time.

pluggy's own ``load_setuptools_entrypoints`` stops at the first plugin that fails to
import; here each entry point is loaded in isolation, so a broken plugin is reported
(``cockpit plugins``) and skipped while the others still load. Isolation covers every
``BaseException`` but ``KeyboardInterrupt``: a plugin that calls ``sys.exit()`` at import or
in a hook is skipped like one that raises ``ImportError``.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pluggy

from cockpit_core import hookspecs


@dataclass
class PluginInfo:
    """What cockpit knows about one plugin.

    Attributes:
        name: Entry-point name (also the pluggy plugin name).
        distribution: Name of the distribution that declares the entry point.
        version: Version of that distribution.
        module: Import path of the plugin object.
        error: Why the plugin was skipped, or ``None`` if it loaded.
        quantities: Names of the quantities it registered.
        presets: Names of the presets it registered.
        providers: Names of the statistics providers it registered.
        sinks: Names of the sinks it registered.

    """

    name: str
    distribution: str = "?"
    version: str = "?"
    module: str = ""
    error: str | None = None
    quantities: list[str] = field(default_factory=list)
    presets: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    sinks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the plugin loaded and its hooks ran."""
        return self.error is None


def new_plugin_manager() -> pluggy.PluginManager:
    """A plugin manager that knows cockpit's hook specs and no plugins."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def load_plugin(pm: pluggy.PluginManager, plugin: Any, info: PluginInfo) -> bool:
    """Check ``plugin``'s protocol version and register it with ``pm``; record errors in ``info``."""
    version = getattr(plugin, "COCKPIT_PROTOCOL_VERSION", hookspecs.PROTOCOL_VERSION)
    if version != hookspecs.PROTOCOL_VERSION:
        info.error = (
            f"declares plugin protocol version {version!r}, but this cockpit-core speaks "
            f"version {hookspecs.PROTOCOL_VERSION}; upgrade the plugin or cockpit-core"
        )
        return False
    try:
        pm.register(plugin, name=info.name)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # pluggy validates hook names and signatures here
        info.error = f"invalid hook implementation: {describe_error(err, exception_name=False)}"
        return False
    return True


def discover(group: str = hookspecs.PROJECT_NAME) -> tuple[pluggy.PluginManager, list[PluginInfo]]:
    """Load every plugin of the entry-point ``group``, isolating failures.

    Returns:
        The plugin manager with every plugin that loaded, and one :class:`PluginInfo` per
        entry point (failed ones have ``error`` set).

    """
    pm = new_plugin_manager()
    infos = []
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
    return pm, infos


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
