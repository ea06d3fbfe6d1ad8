"""Cockpit 1.0.2's quantity classes (``cockpit.quantities``), computed by native quantities.

Construct them with Cockpit 1.0.2's arguments (``GradNorm(schedules.linear(1))``,
``HessMaxEV(schedule, use_power=False)``, ``GradHist1d(schedule, bins=10)``) and pass them
to :class:`cockpit_compat.Cockpit`. Each names the native quantity that computes it
(``native_name``); ``docs/migrating.md`` lists the option and output mappings.
"""

from cockpit_compat.quantities import bin_adaptation
from cockpit_compat.quantities._definitions import (
    CABS,
    LEGACY_CLASSES,
    Alpha,
    Distance,
    EarlyStopping,
    GradHist1d,
    GradHist2d,
    GradNorm,
    HessMaxEV,
    HessTrace,
    InnerTest,
    Loss,
    MeanGSNR,
    NormTest,
    OrthoTest,
    Parameters,
    TICDiag,
    TICTrace,
    Time,
    UpdateSize,
)
from cockpit_compat.quantities.quantity import Quantity

__all__ = [
    "CABS",
    "LEGACY_CLASSES",
    "Alpha",
    "Distance",
    "EarlyStopping",
    "GradHist1d",
    "GradHist2d",
    "GradNorm",
    "HessMaxEV",
    "HessTrace",
    "InnerTest",
    "Loss",
    "MeanGSNR",
    "NormTest",
    "OrthoTest",
    "Parameters",
    "Quantity",
    "TICDiag",
    "TICTrace",
    "Time",
    "UpdateSize",
    "bin_adaptation",
]
