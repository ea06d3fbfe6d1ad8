"""Entry point of cockpit-hooks: registers the ``hooks`` statistics provider."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterStatisticProvider
from cockpit_hooks.provider import HooksProvider

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_statistic_providers(register: RegisterStatisticProvider) -> None:
    """Register :class:`HooksProvider` (``backend="hooks"``)."""
    register(HooksProvider)
