"""The core's own plugin: the ``torch.func`` provider, registered like any other plugin's."""

from cockpit_core.hookspecs import hookimpl
from cockpit_core.statistics.func import FuncProvider


@hookimpl
def register_statistic_providers(register):
    """Register the ``func`` provider (per-sample statistics of any model)."""
    register(FuncProvider)
