"""Entry point of cockpit-autodiff: registers the ``autodiff`` statistics provider."""

from cockpit_autodiff.provider import AutodiffProvider
from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterStatisticProvider

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_statistic_providers(register: RegisterStatisticProvider) -> None:
    """Register :class:`AutodiffProvider` (``backend="autodiff"``)."""
    register(AutodiffProvider)
