"""Entry point of cockpit-backpack: registers the ``backpack`` statistics provider."""

from cockpit_backpack.provider import BackpackProvider
from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterStatisticProvider

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_statistic_providers(register: RegisterStatisticProvider) -> None:
    """Register :class:`BackpackProvider` (``backend="backpack"``)."""
    register(BackpackProvider)
