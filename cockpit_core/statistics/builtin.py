"""The core's own plugin: the ``torch.func`` provider and the built-in statistic kinds.

Registered like any other plugin's (``Registry`` adds it first), so built-ins and third
parties' kinds and providers reach the registry through the same hooks.
"""

from cockpit_core.hookspecs import (
    RegisterStatisticKind,
    RegisterStatisticProvider,
    hookimpl,
)
from cockpit_core.statistics.func import FuncProvider
from cockpit_core.statistics.kinds import BUILTIN_KINDS


@hookimpl
def register_statistic_providers(register: RegisterStatisticProvider) -> None:
    """Register the ``func`` provider (per-sample statistics of any model)."""
    register(FuncProvider)


@hookimpl
def register_statistic_kinds(register: RegisterStatisticKind) -> None:
    """Register the built-in kinds (``batch_l2``, ``sum_grad_squared``, ``diag_hessian``, ...)."""
    for kind in BUILTIN_KINDS.values():
        register(kind)
