"""Randomized trace estimators from matrix-vector products, with error estimates and cost.

Every estimator works on a symmetric ``D x D`` operator given only through ``matvec`` (flat
float64 vectors of length ``D``; for ``hess_trace`` a Hessian-vector product) and returns a
:class:`TraceEstimate`: the trace of each diagonal block (one block per parameter, sizes
``sizes``), their sum, standard errors of both and the number of products used. Probes are
Rademacher vectors drawn one after the other from a ``torch.Generator``, so a run is
reproducible and the same computation can be repeated on an explicit matrix.
"""

from cockpit_curvature._estimators.base import MatVec, TraceEstimate, block_sums, rademacher
from cockpit_curvature._estimators.hutchinson import hutchinson
from cockpit_curvature._estimators.hutchpp import hutchpp
from cockpit_curvature._estimators.xtrace import xtrace

ESTIMATORS = {"hutchinson": hutchinson, "hutchpp": hutchpp, "xtrace": xtrace}
"""The trace estimators by their ``hess_trace`` method name."""

__all__ = [
    "ESTIMATORS",
    "MatVec",
    "TraceEstimate",
    "block_sums",
    "hutchinson",
    "hutchpp",
    "rademacher",
    "xtrace",
]
