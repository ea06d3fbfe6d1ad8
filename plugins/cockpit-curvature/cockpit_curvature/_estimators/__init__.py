"""Randomized trace and diagonal estimators from matrix-vector products, with error bars.

Every estimator works on a symmetric ``D x D`` operator given only through ``matvec`` (flat
float64 vectors of length ``D``; in the curvature quantities a Hessian-vector product).
Probes are Rademacher vectors drawn one after the other from a ``torch.Generator``, so a
run is reproducible and the same computation can be repeated on an explicit matrix.

- Trace estimators return a :class:`TraceEstimate`: the trace of each diagonal block (one
  block per parameter, sizes ``sizes``), their sum, standard errors of both and the number
  of products used (``hess_trace``).
- Diagonal estimators return a :class:`DiagEstimate`: unbiased sample vectors of
  ``diag(A)`` whose mean is the estimate, from which per-entry standard errors, and those
  of any linear function of the diagonal, follow (``tic_diag``, ``tic_trace``).

The estimators always compute their error bars; the quantities report those of XTrace and
XDiag only from ``CALIBRATED_MIN_PRODUCTS`` products on (:func:`error_bars_calibrated`).
"""

from cockpit_curvature._estimators.base import (
    CALIBRATED_MIN_PRODUCTS,
    DiagEstimate,
    MatVec,
    TraceEstimate,
    block_sums,
    rademacher,
)
from cockpit_curvature._estimators.diag_hutchinson import diag_hutchinson
from cockpit_curvature._estimators.hutchinson import hutchinson
from cockpit_curvature._estimators.hutchpp import hutchpp
from cockpit_curvature._estimators.xdiag import xdiag
from cockpit_curvature._estimators.xtrace import xtrace

ESTIMATORS = {"hutchinson": hutchinson, "hutchpp": hutchpp, "xtrace": xtrace}
"""The trace estimators by their ``hess_trace`` method name."""

DIAG_ESTIMATORS = {"hutchinson": diag_hutchinson, "xdiag": xdiag}
"""The diagonal estimators by their ``curvature`` name in ``tic_diag`` / ``tic_trace``."""

LEAVE_ONE_OUT = frozenset({"xtrace", "xdiag"})
"""Estimators whose error bars are calibrated only from ``CALIBRATED_MIN_PRODUCTS`` products."""


def error_bars_calibrated(method: str, probes: int) -> bool:
    """Whether the error bars of ``method`` with ``probes`` products can be reported.

    Args:
        method: An estimator name (``hess_trace``'s ``method`` or the TIC's ``curvature``).
        probes: The product budget ``m`` (XTrace and XDiag use ``2 (m // 2)``, which is at
            least ``CALIBRATED_MIN_PRODUCTS`` exactly when ``m`` is, as that is even).

    Returns:
        ``False`` for XTrace and XDiag below ``CALIBRATED_MIN_PRODUCTS`` products (their
        error bars were measured off by more than 20% there), ``True`` otherwise.

    """
    return method not in LEAVE_ONE_OUT or probes >= CALIBRATED_MIN_PRODUCTS


__all__ = [
    "CALIBRATED_MIN_PRODUCTS",
    "DIAG_ESTIMATORS",
    "ESTIMATORS",
    "LEAVE_ONE_OUT",
    "DiagEstimate",
    "MatVec",
    "TraceEstimate",
    "block_sums",
    "diag_hutchinson",
    "error_bars_calibrated",
    "hutchinson",
    "hutchpp",
    "rademacher",
    "xdiag",
    "xtrace",
]
