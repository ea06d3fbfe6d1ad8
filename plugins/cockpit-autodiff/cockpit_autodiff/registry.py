"""A registry whose ``autodiff`` provider has other options, for one Cockpit.

The options and their validation are in :mod:`cockpit_autodiff.options`; the configured
subclass of the provider comes from :meth:`AutodiffProvider.configured
<cockpit_autodiff.provider.AutodiffProvider.configured>`.
"""

from __future__ import annotations

from typing import Any, cast

from cockpit_autodiff.provider import AutodiffProvider
from cockpit_core.plugin.registry import ProviderEntry, Registry


def autodiff_registry(registry: Registry | None = None, **options: Any) -> Registry:
    """A registry whose ``autodiff`` provider has ``options``, for ``Cockpit(registry=...)``.

    Example::

        from cockpit_autodiff import autodiff_registry

        cp = Cockpit(model, ["hess_trace"], registry=autodiff_registry(max_hvps=200_000))

    Args:
        registry: The registry to change (default: a new one of the installed plugins).
        options: Keys of :class:`~cockpit_autodiff.options.AutodiffOptions`.

    Returns:
        ``registry`` with its ``autodiff`` entry replaced by a configured subclass
        (:meth:`AutodiffProvider.configured`); other Cockpits are not affected.

    Raises:
        ConfigError: An unknown option or an invalid value.

    """
    registry = registry if registry is not None else Registry.from_entry_points()
    entry = registry.providers.get(AutodiffProvider.name)
    # the 'autodiff' entry is this plugin's provider (or a subclass configured before)
    base = AutodiffProvider if entry is None else cast(type[AutodiffProvider], entry.cls)
    registry.providers[AutodiffProvider.name] = ProviderEntry(
        base.configured(**options),
        "cockpit-autodiff" if entry is None else entry.distribution,
        "0" if entry is None else entry.version,
    )
    return registry
