"""cockpit_core: the small core of cockpit, a visual and statistical debugger for PyTorch.

The core defines the quantity protocol, scheduling, caching and requirement merging;
quantities live in plugins found through the ``cockpit`` entry-point group.
"""

from importlib import metadata as _metadata
from typing import Any as _Any

from cockpit_core.cache import Cache
from cockpit_core.cockpit import Cockpit
from cockpit_core.config import config_json_schema, load_config_file, resolve_quantities
from cockpit_core.context import StepContext
from cockpit_core.errors import (
    CockpitError,
    CockpitWarning,
    ConfigError,
    DuplicateQuantityError,
    MissingInfoError,
    MisuseError,
    RequirementConflictError,
    UnknownQuantityError,
    UnsupportedModelError,
)
from cockpit_core.hookspecs import PROTOCOL_VERSION, hookimpl
from cockpit_core.log import read_log
from cockpit_core.quantity import Quantity, QuantityConfig, TwoStepQuantity
from cockpit_core.registry import Registry, default_registry
from cockpit_core.requirements import (
    BATCH_DOT,
    BATCH_L2,
    BATCH_PROJECTION,
    DIAG_GGN_EXACT,
    DIAG_HESSIAN,
    GRAD_BATCH,
    SUM_GRAD_SQUARED,
    Requirements,
    Statistic,
    diag_ggn_mc,
    per_sample_projection,
    per_sample_transform,
)
from cockpit_core.schedules import EveryN, ExplicitSteps, Logarithmic
from cockpit_core.statistics.kinds import StatisticKind
from cockpit_core.statistics.per_sample import (
    ConvGrads,
    DenseGrads,
    EmbeddingGrads,
    OuterProductGrads,
    PerSampleGrads,
)
from cockpit_core.statistics.provider import Collection, ParamSlot, StatisticProvider

try:
    __version__ = _metadata.version("cockpit-core")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"


def __getattr__(name: str) -> _Any:
    """``cockpit_core.extend``: BackPACK's ``extend``, from the cockpit-backpack plugin."""
    if name == "extend":
        try:
            from cockpit_backpack import extend
        except ImportError as err:
            raise ImportError(
                "cockpit_core.extend prepares a model for BackPACK and comes with the "
                "cockpit-backpack distribution: pip install cockpit-backpack. Models need no "
                "extend for the module-hook provider (cockpit-hooks): pass the model to "
                "Cockpit(model, ...) or call cp.attach(model) (see docs/any_model.md)."
            ) from err
        return extend
    raise AttributeError(f"module 'cockpit_core' has no attribute {name!r}")


__all__ = [
    "BATCH_DOT",
    "BATCH_L2",
    "BATCH_PROJECTION",
    "DIAG_GGN_EXACT",
    "DIAG_HESSIAN",
    "GRAD_BATCH",
    "PROTOCOL_VERSION",
    "SUM_GRAD_SQUARED",
    "Cache",
    "Cockpit",
    "Collection",
    "ConvGrads",
    "DenseGrads",
    "EmbeddingGrads",
    "OuterProductGrads",
    "ParamSlot",
    "PerSampleGrads",
    "StatisticKind",
    "StatisticProvider",
    "CockpitError",
    "CockpitWarning",
    "ConfigError",
    "DuplicateQuantityError",
    "EveryN",
    "ExplicitSteps",
    "Logarithmic",
    "MisuseError",
    "MissingInfoError",
    "Quantity",
    "QuantityConfig",
    "Registry",
    "RequirementConflictError",
    "Requirements",
    "Statistic",
    "StepContext",
    "TwoStepQuantity",
    "UnknownQuantityError",
    "UnsupportedModelError",
    "__version__",
    "config_json_schema",
    "default_registry",
    "diag_ggn_mc",
    "hookimpl",
    "load_config_file",
    "per_sample_projection",
    "per_sample_transform",
    "read_log",
    "resolve_quantities",
]
