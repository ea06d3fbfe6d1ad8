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
"""

from cockpit_curvature._estimators.base import (
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

__all__ = [
    "DIAG_ESTIMATORS",
    "ESTIMATORS",
    "DiagEstimate",
    "MatVec",
    "TraceEstimate",
    "block_sums",
    "diag_hutchinson",
    "hutchinson",
    "hutchpp",
    "rademacher",
    "xdiag",
    "xtrace",
]
