"""cockpit_core: the small core of cockpit, a visual and statistical debugger for PyTorch.

The core defines the quantity protocol, scheduling, caching and requirement merging;
quantities live in plugins found through the ``cockpit`` entry-point group.

The public names below are imported when first used (PEP 562), so that ``import
cockpit_core`` (and ``cockpit --help``) does not import torch; ``from cockpit_core import
Cockpit`` works as usual. Sub-namespaces hold the rest: :mod:`cockpit_core.errors`,
:mod:`cockpit_core.panel` (dashboard panels), :mod:`cockpit_core.testing` (the plugin kit),
:mod:`cockpit_core.statistics` (providers), :mod:`cockpit_core.log` (logs).
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:  # what type checkers and IDEs see; kept equal to _EXPORTS by a test
    from cockpit_core.cache import Cache
    from cockpit_core.config.files import config_json_schema, load_config_file, resolve_quantities
    from cockpit_core.context import StepContext
    from cockpit_core.distributed.sharded import shard_sum, tracked_params
    from cockpit_core.engine.cockpit import Cockpit
    from cockpit_core.errors import (
        CockpitError,
        CockpitWarning,
        ConfigError,
        DuplicateNameError,
        DuplicateQuantityError,
        LogLockedError,
        MissingInfoError,
        MisuseError,
        RequirementConflictError,
        StateError,
        UnknownInstrumentError,
        UnknownNameError,
        UnknownPresetError,
        UnknownQuantityError,
        UnknownSinkError,
        UnsupportedModelError,
    )
    from cockpit_core.hookspecs import PROTOCOL_VERSION, hookimpl
    from cockpit_core.log import read_log
    from cockpit_core.observe.probe import FunctionCall, Probe
    from cockpit_core.plugin.registry import Registry, default_registry
    from cockpit_core.quantity import (
        Quantity,
        QuantityConfig,
        ResumeContext,
        TwoStepQuantity,
        layered,
    )
    from cockpit_core.requirements import (
        BATCH_DOT,
        BATCH_L2,
        BATCH_PROJECTION,
        DIAG_GGN_EXACT,
        DIAG_HESSIAN,
        GRAD_BATCH,
        SUM_GRAD_SQUARED,
        Requirements,
        diag_ggn_mc,
        per_sample_projection,
        per_sample_transform,
    )
    from cockpit_core.schedules import EveryN, ExplicitSteps, Logarithmic, OnFinding
    from cockpit_core.statistics.conv import ConvGrads
    from cockpit_core.statistics.embedding import EmbeddingGrads
    from cockpit_core.statistics.kinds import StatisticKind
    from cockpit_core.statistics.per_sample import DenseGrads, OuterProductGrads, PerSampleGrads
    from cockpit_core.statistics.pooled import PooledGrads
    from cockpit_core.statistics.provider import Collection, ParamSlot, StatisticProvider
    from cockpit_core.statistics.statistic import Statistic
    from cockpit_core.statistics.tied import TiedGrads

_EXPORTS: dict[str, str] = {  # public name -> the module defining it, grouped by topic
    # tracking a training run
    "Cockpit": "cockpit_core.engine.cockpit",
    "read_log": "cockpit_core.log",
    # configuration
    "config_json_schema": "cockpit_core.config.files",
    "load_config_file": "cockpit_core.config.files",
    "resolve_quantities": "cockpit_core.config.files",
    # writing quantities
    "Quantity": "cockpit_core.quantity",
    "QuantityConfig": "cockpit_core.quantity",
    "TwoStepQuantity": "cockpit_core.quantity",
    "layered": "cockpit_core.quantity",
    "ResumeContext": "cockpit_core.quantity",
    "StepContext": "cockpit_core.context",
    "Cache": "cockpit_core.cache",
    "EveryN": "cockpit_core.schedules",
    "ExplicitSteps": "cockpit_core.schedules",
    "Logarithmic": "cockpit_core.schedules",
    "OnFinding": "cockpit_core.schedules",
    "shard_sum": "cockpit_core.distributed.sharded",
    "tracked_params": "cockpit_core.distributed.sharded",
    # statistics a quantity requires
    "Requirements": "cockpit_core.requirements",
    "Statistic": "cockpit_core.statistics.statistic",
    "BATCH_DOT": "cockpit_core.requirements",
    "BATCH_L2": "cockpit_core.requirements",
    "BATCH_PROJECTION": "cockpit_core.requirements",
    "DIAG_GGN_EXACT": "cockpit_core.requirements",
    "DIAG_HESSIAN": "cockpit_core.requirements",
    "GRAD_BATCH": "cockpit_core.requirements",
    "SUM_GRAD_SQUARED": "cockpit_core.requirements",
    "diag_ggn_mc": "cockpit_core.requirements",
    "per_sample_projection": "cockpit_core.requirements",
    "per_sample_transform": "cockpit_core.requirements",
    # the forward pass a quantity reads
    "Probe": "cockpit_core.observe.probe",
    "FunctionCall": "cockpit_core.observe.probe",
    # statistics providers and kinds
    "StatisticProvider": "cockpit_core.statistics.provider",
    "StatisticKind": "cockpit_core.statistics.kinds",
    "Collection": "cockpit_core.statistics.provider",
    "ParamSlot": "cockpit_core.statistics.provider",
    "PerSampleGrads": "cockpit_core.statistics.per_sample",
    "DenseGrads": "cockpit_core.statistics.per_sample",
    "ConvGrads": "cockpit_core.statistics.conv",
    "EmbeddingGrads": "cockpit_core.statistics.embedding",
    "OuterProductGrads": "cockpit_core.statistics.per_sample",
    "TiedGrads": "cockpit_core.statistics.tied",
    "PooledGrads": "cockpit_core.statistics.pooled",
    # plugins
    "hookimpl": "cockpit_core.hookspecs",
    "PROTOCOL_VERSION": "cockpit_core.hookspecs",
    "Registry": "cockpit_core.plugin.registry",
    "default_registry": "cockpit_core.plugin.registry",
    # errors and warnings
    "CockpitError": "cockpit_core.errors",
    "CockpitWarning": "cockpit_core.errors",
    "ConfigError": "cockpit_core.errors",
    "MissingInfoError": "cockpit_core.errors",
    "MisuseError": "cockpit_core.errors",
    "RequirementConflictError": "cockpit_core.errors",
    "StateError": "cockpit_core.errors",
    "LogLockedError": "cockpit_core.errors",
    "UnsupportedModelError": "cockpit_core.errors",
    "UnknownNameError": "cockpit_core.errors",
    "UnknownQuantityError": "cockpit_core.errors",
    "UnknownPresetError": "cockpit_core.errors",
    "UnknownSinkError": "cockpit_core.errors",
    "UnknownInstrumentError": "cockpit_core.errors",
    "DuplicateNameError": "cockpit_core.errors",
    "DuplicateQuantityError": "cockpit_core.errors",
}

# literal, so that type checkers see the exports (mypy's implicit_reexport=False); kept
# equal to _EXPORTS by tests/core/test_lazy_exports.py
__all__ = [
    "Cockpit",
    "read_log",
    "config_json_schema",
    "load_config_file",
    "resolve_quantities",
    "Quantity",
    "QuantityConfig",
    "TwoStepQuantity",
    "layered",
    "ResumeContext",
    "StepContext",
    "Cache",
    "EveryN",
    "ExplicitSteps",
    "Logarithmic",
    "OnFinding",
    "shard_sum",
    "tracked_params",
    "Requirements",
    "Statistic",
    "BATCH_DOT",
    "BATCH_L2",
    "BATCH_PROJECTION",
    "DIAG_GGN_EXACT",
    "DIAG_HESSIAN",
    "GRAD_BATCH",
    "SUM_GRAD_SQUARED",
    "diag_ggn_mc",
    "per_sample_projection",
    "per_sample_transform",
    "Probe",
    "FunctionCall",
    "StatisticProvider",
    "StatisticKind",
    "Collection",
    "ParamSlot",
    "PerSampleGrads",
    "PooledGrads",
    "DenseGrads",
    "ConvGrads",
    "EmbeddingGrads",
    "OuterProductGrads",
    "TiedGrads",
    "hookimpl",
    "PROTOCOL_VERSION",
    "Registry",
    "default_registry",
    "CockpitError",
    "CockpitWarning",
    "ConfigError",
    "MissingInfoError",
    "MisuseError",
    "RequirementConflictError",
    "StateError",
    "LogLockedError",
    "UnsupportedModelError",
    "UnknownNameError",
    "UnknownQuantityError",
    "UnknownPresetError",
    "UnknownSinkError",
    "UnknownInstrumentError",
    "DuplicateNameError",
    "DuplicateQuantityError",
    "__version__",
]


def __getattr__(name: str) -> _Any:
    """Import a public name on first use; ``__version__``."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(module), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name == "__version__":
        version = _importlib.import_module("cockpit_core.plugin.discovery").core_version()
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'cockpit_core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
