"""Entry point of cockpit-curvature: registers its quantities."""

from cockpit_core import hookimpl
from cockpit_curvature import HessMaxEV, HessTrace, TICDiag, TICTrace

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register):
    """Register ``hess_max_ev``, ``hess_trace``, ``tic_diag`` and ``tic_trace``."""
    for cls in (HessMaxEV, HessTrace, TICDiag, TICTrace):
        register(cls)


@hookimpl
def register_instruments(register):
    """Register the curvature panels (max eigenvalue, trace, TIC)."""
    from cockpit_curvature.instruments import INSTRUMENTS

    for instrument in INSTRUMENTS:
        register(instrument)
