"""The 19 quantity classes of Cockpit 1.0.2, each a translation onto a native quantity.

Each class takes Cockpit 1.0.2's constructor arguments, names the native quantity that
computes it, maps its options, and converts the native value into Cockpit 1.0.2's output
layout. ``docs/migrating.md`` lists every mapping and the differences in values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cockpit_compat.quantities.bin_adaptation import native_adapt
from cockpit_compat.quantities.quantity import DROP, Quantity

Schedule = Callable[[int], bool]

_CURVATURES = {
    "diag_h": "diag_hessian",
    "diag_ggn_exact": "diag_ggn_exact",
    "diag_ggn_mc": "diag_ggn_mc",
}
"""Cockpit 1.0.2's ``curvature`` values -> the native curvature names."""


def _native_curvature(owner: str, curvature: Any) -> str:
    if not isinstance(curvature, str) or curvature not in _CURVATURES:
        raise ValueError(
            f"{owner}: curvature={curvature!r} is not one of Cockpit 1.0.2's curvatures "
            f"{', '.join(repr(c) for c in _CURVATURES)}."
        )
    return _CURVATURES[curvature]


def _floats(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1)


# -- byproducts -------------------------------------------------------------------------------


class Loss(Quantity):
    """The mini-batch loss ``info["loss"]`` (native ``loss``); value: a float."""

    native_name = "loss"

    def __init__(self, track_schedule: Schedule, verbose: bool = False):
        super().__init__(track_schedule, verbose)
        self._validate()

    def to_legacy(self, value: Any, step: int) -> float:
        """The loss as a float."""
        return float(value)

    @classmethod
    def from_legacy(cls, value: Any) -> float:
        """The loss as a float."""
        return float(value)


class Time(Loss):
    """Wall-clock time ``time.time()`` after the backward pass (native ``time``); a float."""

    native_name = "time"


class Parameters(Quantity):
    """Snapshots of the parameters (native ``parameters``); value: one nested list each."""

    native_name = "parameters"

    def __init__(self, track_schedule: Schedule, verbose: bool = False):
        super().__init__(track_schedule, verbose)
        self._validate()

    def to_legacy(self, value: Any, step: int) -> list[Any]:
        """``[p.tolist() for p in params]``, as Cockpit 1.0.2 stores them."""
        return [np.asarray(p).tolist() for p in value]

    @classmethod
    def from_legacy(cls, value: Any) -> list[np.ndarray]:
        """One numpy array per parameter."""
        return [np.asarray(p, dtype=np.float64) for p in value]


class _PerParamNorm(Quantity):
    """A native ``{"total", "per_param"}`` of norms; Cockpit 1.0.2 keeps the per-parameter list."""

    def __init__(self, track_schedule: Schedule, verbose: bool = False):
        super().__init__(track_schedule, verbose)
        self._validate()

    def to_legacy(self, value: Any, step: int) -> list[float]:
        """The per-parameter norms as a list of floats."""
        norms: list[float] = _floats(value["per_param"]).tolist()
        return norms

    @classmethod
    def from_legacy(cls, value: Any) -> dict[str, Any]:
        """``{"total": norm over all parameters, "per_param": [...]}``."""
        per = _floats(value)
        return {"total": float(np.sqrt((per**2).sum())), "per_param": per}


class GradNorm(_PerParamNorm):
    """Norm of each parameter's mini-batch gradient (native ``grad_norm``); a list of floats."""

    native_name = "grad_norm"


class UpdateSize(_PerParamNorm):
    """Norm of each parameter's update, stored under the step before it (native ``update_size``)."""

    native_name = "update_size"


class Distance(_PerParamNorm):
    """Distance of each parameter from its value at step 0 (native ``distance``); a list.

    Cockpit 1.0.2 copies the parameters at step 0 whatever the schedule, then reports the
    distance at the scheduled steps. The native ``distance`` copies them at the first step
    it tracks, so the compat layer also tracks step 0 and drops that value (zeros) unless
    the schedule selects step 0. A loop that never passes step 0 (where Cockpit 1.0.2
    fails) measures from its first tracked step.
    """

    native_name = "distance"

    def native_schedule(self) -> Schedule:
        """The schedule, extended by step 0 where it does not select it."""
        schedule = self._track_schedule
        return schedule if schedule(0) else _WithStepZero(schedule)

    def to_legacy(self, value: Any, step: int) -> Any:
        """The per-parameter distances; the extra step-0 value is dropped."""
        if step == 0 and not self._track_schedule(0):
            return DROP
        return super().to_legacy(value, step)


class _WithStepZero:
    """A schedule that also selects step 0 (the start of :class:`Distance`)."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule

    def __call__(self, step: int) -> bool:
        return step == 0 or bool(self.schedule(step))

    def __repr__(self) -> str:
        return f"step 0 or {self.schedule!r}"


# -- gradient tests and other scalars -------------------------------------------------------


class _Total(Quantity):
    """A native ``{"total", "per_param"}``; Cockpit 1.0.2 keeps the total as a float."""

    def __init__(self, track_schedule: Schedule, verbose: bool = False):
        super().__init__(track_schedule, verbose)
        self._validate()

    def to_legacy(self, value: Any, step: int) -> float:
        """The value over all parameters."""
        return float(value["total"])

    @classmethod
    def from_legacy(cls, value: Any) -> dict[str, float]:
        """``{"total": value}``."""
        return {"total": float(value)}


class CABS(_Total):
    """Batch size suggested by the CABS rule (native ``cabs``); a float."""

    native_name = "cabs"


class InnerTest(_Total):
    """Largest theta passing the inner-product test (native ``inner_test``); a float."""

    native_name = "inner_test"


class NormTest(_Total):
    """Largest theta passing the norm test (native ``norm_test``); a float."""

    native_name = "norm_test"


class OrthoTest(_Total):
    """Largest nu passing the orthogonality test (native ``ortho_test``); a float."""

    native_name = "ortho_test"


class _WithEpsilon(_Total):
    legacy_options = {"epsilon": "epsilon"}

    def __init__(self, track_schedule: Schedule, verbose: bool = False, epsilon: float = 1e-5):
        self._epsilon = epsilon
        super().__init__(track_schedule, verbose)

    def native_options(self) -> dict[str, Any]:
        """``{"epsilon": epsilon}``."""
        return {"epsilon": self._epsilon}


class EarlyStopping(_WithEpsilon):
    """Evidence-based early-stopping criterion (native ``early_stopping``); a float.

    Args:
        track_schedule: When to compute it.
        verbose: Print each stored value.
        epsilon: Added to the gradient variance (native ``epsilon``).

    """

    native_name = "early_stopping"


class MeanGSNR(_WithEpsilon):
    """Mean gradient signal-to-noise ratio (native ``mean_gsnr``); a float.

    Args:
        track_schedule: When to compute it.
        verbose: Print each stored value.
        epsilon: Added to the gradient variance (native ``epsilon``).

    """

    native_name = "mean_gsnr"


class Alpha(Quantity):
    """Normalized step size alpha, stored under the step it starts at (native ``alpha``).

    Value: a float (the native ``value["alpha"]``).
    """

    native_name = "alpha"

    def __init__(self, track_schedule: Schedule, verbose: bool = False):
        super().__init__(track_schedule, verbose)
        self._validate()

    def to_legacy(self, value: Any, step: int) -> float:
        """``value["alpha"]``."""
        return float(value["alpha"])

    @classmethod
    def from_legacy(cls, value: Any) -> dict[str, float]:
        """``{"alpha": value}``."""
        return {"alpha": float(value)}


# -- curvature --------------------------------------------------------------------------------


class HessMaxEV(Quantity):
    """Largest Hessian eigenvalue (native ``hess_max_ev``, Lanczos); value: a float.

    Args:
        track_schedule: When to compute it.
        verbose: Print each stored value.
        use_power: ``True`` (Cockpit 1.0.2's power iteration) asks for the eigenvalue of
            largest magnitude (native ``which="largest_magnitude"``), ``False`` (Cockpit
            1.0.2's ``eigsh(which="LA")``) for the largest algebraic one
            (``which="largest_algebraic"``). Both are computed by Lanczos iteration to a
            relative accuracy of ``1e-4``.

    """

    native_name = "hess_max_ev"
    legacy_options = {"use_power": "which"}

    def __init__(self, track_schedule: Schedule, verbose: bool = False, use_power: bool = True):
        if not isinstance(use_power, (bool, np.bool_)):
            raise ValueError(f"HessMaxEV: use_power must be True or False, got {use_power!r}.")
        self._use_power = bool(use_power)
        super().__init__(track_schedule, verbose)
        self._validate()

    def native_options(self) -> dict[str, Any]:
        """``{"which": "largest_magnitude" | "largest_algebraic"}``."""
        return {"which": "largest_magnitude" if self._use_power else "largest_algebraic"}

    def create_graph(self, global_step: int) -> bool:
        """``True`` at the scheduled steps: Hessian-vector products need the loss graph."""
        return self.should_compute(global_step)

    def to_legacy(self, value: Any, step: int) -> float:
        """``value["value"]``, the wanted eigenvalue."""
        return float(value["value"])

    @classmethod
    def from_legacy(cls, value: Any) -> dict[str, Any]:
        """``{"value": v, "eigenvalues": [v]}``."""
        return {"value": float(value), "eigenvalues": np.array([float(value)])}


class HessTrace(Quantity):
    """Trace of each parameter's Hessian block (native ``hess_trace``); a list of floats.

    Args:
        track_schedule: When to compute it.
        verbose: Print each stored value.
        curvature: ``"diag_h"`` (exact Hessian diagonal), ``"diag_ggn_exact"`` or
            ``"diag_ggn_mc"`` (native ``method``).

    """

    native_name = "hess_trace"
    legacy_options = {"curvature": "method"}

    def __init__(self, track_schedule: Schedule, verbose: bool = False, curvature: str = "diag_h"):
        self._curvature = _native_curvature("HessTrace", curvature)
        super().__init__(track_schedule, verbose)
        self._validate()

    def native_options(self) -> dict[str, Any]:
        """``{"method": ...}``."""
        return {"method": self._curvature}

    def to_legacy(self, value: Any, step: int) -> list[float]:
        """The per-parameter traces as a list of floats."""
        traces: list[float] = _floats(value["per_param"]).tolist()
        return traces

    @classmethod
    def from_legacy(cls, value: Any) -> dict[str, Any]:
        """``{"total": sum, "per_param": [...]}``."""
        per = _floats(value)
        return {"total": float(per.sum()), "per_param": per}


class _TIC(_Total):
    legacy_options = {"curvature": "curvature", "epsilon": "epsilon"}

    def __init__(
        self,
        track_schedule: Schedule,
        verbose: bool = False,
        curvature: str = "diag_h",
        epsilon: float = 1e-7,
    ):
        self._curvature = _native_curvature(type(self).__name__, curvature)
        self._epsilon = epsilon
        super().__init__(track_schedule, verbose)

    def native_options(self) -> dict[str, Any]:
        """``{"curvature": ..., "epsilon": ...}``."""
        return {"curvature": self._curvature, "epsilon": self._epsilon}


class TICDiag(_TIC):
    """TIC with a diagonal curvature (native ``tic_diag``); a float.

    Args:
        track_schedule: When to compute it.
        verbose: Print each stored value.
        curvature: ``"diag_h"``, ``"diag_ggn_exact"`` or ``"diag_ggn_mc"``.
        epsilon: Added to the curvature before dividing.

    """

    native_name = "tic_diag"


class TICTrace(_TIC):
    """TIC from the traces of curvature and gradient second moment (native ``tic_trace``).

    Args:
        track_schedule: When to compute it.
        verbose: Print each stored value.
        curvature: ``"diag_h"``, ``"diag_ggn_exact"`` or ``"diag_ggn_mc"``.
        epsilon: Added to the curvature trace before dividing.

    """

    native_name = "tic_trace"


# -- histograms -------------------------------------------------------------------------------


class GradHist1d(Quantity):
    """Histogram of the per-sample gradient elements (native ``grad_hist_1d``).

    Value: ``{"hist": counts [bins] (float64), "edges": [bins + 1]}``.

    Args:
        track_schedule: When to compute it.
        verbose: Print each stored value.
        bins: Number of bins.
        range: Bin range ``(low, high)``; values outside count in the edge bins.
        adapt: ``None`` or a policy of :mod:`~cockpit_compat.quantities.bin_adaptation`
            with the same schedule (native ``adapt``).

    """

    native_name = "grad_hist_1d"
    legacy_options = {"bins": "bins", "range": "range", "adapt": "adapt"}

    def __init__(
        self,
        track_schedule: Schedule,
        verbose: bool = False,
        bins: int = 100,
        range: Sequence[float] = (-2, 2),
        adapt: Any = None,
    ):
        self._bins = bins
        self._range = range
        self._adapt = native_adapt(adapt, track_schedule, "GradHist1d(adapt=...)")
        super().__init__(track_schedule, verbose)
        self._validate()

    def native_options(self) -> dict[str, Any]:
        """``bins``, ``range``, ``adapt`` (the native per-parameter counts stay in the native output)."""
        return {"bins": self._bins, "range": _pair(self._range), "adapt": self._adapt}

    def to_legacy(self, value: Any, step: int) -> dict[str, np.ndarray]:
        """``{"hist", "edges"}``."""
        return {
            "hist": np.asarray(value["hist"], dtype=np.float64),
            "edges": np.asarray(value["edges"], dtype=np.float64),
        }

    @classmethod
    def from_legacy(cls, value: Any) -> dict[str, np.ndarray]:
        """``{"hist", "edges"}`` as float arrays."""
        return {
            "hist": np.asarray(value["hist"], dtype=np.float64),
            "edges": np.asarray(value["edges"], dtype=np.float64),
        }


class GradHist2d(Quantity):
    """2-D histogram of (per-sample gradient element, parameter element) (native ``grad_hist_2d``).

    Value: ``{"hist": counts [xbins, ybins] (int64), "edges": (x_edges, y_edges)}``; with
    ``keep_individual`` also ``"param_groups": P`` and ``"param_{i}": {"hist", "edges"}``.

    Args:
        track_schedule: When to compute it.
        verbose: Print each stored value.
        bins: Bins of the gradient (x) and the parameter (y) axis.
        range: Bin ranges ``((x_low, x_high), (y_low, y_high))``.
        adapt: Two policies (or ``None``) for the x and y axis, each with the histogram's
            schedule.
        keep_individual: Also keep each parameter's histogram.

    """

    native_name = "grad_hist_2d"
    legacy_options = {
        "bins": "bins",
        "range": "range",
        "adapt": "adapt",
        "keep_individual": "keep_individual",
    }

    def __init__(
        self,
        track_schedule: Schedule,
        verbose: bool = False,
        bins: Sequence[int] = (40, 50),
        range: Sequence[Sequence[float]] = ((-1, 1), (-2, 2)),
        adapt: Sequence[Any] = (None, None),
        keep_individual: bool = False,
    ):
        if isinstance(adapt, (str, bytes)) or not hasattr(adapt, "__len__") or len(adapt) != 2:
            raise ValueError(
                f"GradHist2d(adapt=...) needs two entries (x axis, y axis), got {adapt!r}."
            )
        self._bins = bins
        self._range = range
        self._adapt = tuple(
            native_adapt(a, track_schedule, f"GradHist2d(adapt[{i}]=...)")
            for i, a in enumerate(adapt)
        )
        self._keep_individual = keep_individual
        super().__init__(track_schedule, verbose)
        self._validate()

    def native_options(self) -> dict[str, Any]:
        """``bins``, ``range``, ``adapt``, ``keep_individual``."""
        try:
            ranges: Any = tuple(_pair(r) for r in self._range)
        except (TypeError, ValueError):
            ranges = self._range  # the native validation names the problem
        return {
            "bins": _pair(self._bins),
            "range": ranges,
            "adapt": self._adapt,
            "keep_individual": self._keep_individual,
        }

    def to_legacy(self, value: Any, step: int) -> dict[str, Any]:
        """``{"hist", "edges": (x, y)}`` (and the per-parameter entries)."""
        edges = (np.asarray(value["x_edges"]), np.asarray(value["y_edges"]))
        out: dict[str, Any] = {"hist": np.asarray(value["hist"], dtype=np.int64), "edges": edges}
        if "per_param" in value:
            per = np.asarray(value["per_param"], dtype=np.int64)
            out["param_groups"] = len(per)
            for i, hist in enumerate(per):
                out[f"param_{i}"] = {"hist": hist, "edges": edges}
        return out

    @classmethod
    def from_legacy(cls, value: Any) -> dict[str, Any]:
        """``{"hist", "x_edges", "y_edges"}`` (and ``per_param`` from ``param_{i}``)."""
        x_edges, y_edges = value["edges"]
        out: dict[str, Any] = {
            "hist": np.asarray(value["hist"], dtype=np.float64),
            "x_edges": np.asarray(x_edges, dtype=np.float64),
            "y_edges": np.asarray(y_edges, dtype=np.float64),
        }
        groups = value.get("param_groups")
        if isinstance(groups, int) and all(f"param_{i}" in value for i in range(groups)):
            out["per_param"] = np.stack(
                [np.asarray(value[f"param_{i}"]["hist"], dtype=np.float64) for i in range(groups)]
            )
        return out


def _pair(values: Any) -> Any:
    """A tuple from a list/tuple/array (anything else is left to the native validation)."""
    try:
        return tuple(values)
    except TypeError:
        return values


LEGACY_CLASSES: dict[str, type[Quantity]] = {
    cls.__name__: cls
    for cls in (
        Alpha,
        CABS,
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
}
"""Cockpit 1.0.2 class name -> compat class (the keys of its output)."""
