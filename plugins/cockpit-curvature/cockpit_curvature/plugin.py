"""Entry point of cockpit-curvature: registers its quantities."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterInstrument, RegisterQuantity
from cockpit_curvature import HessMaxEV, HessSpectrum, HessTrace, TICDiag, TICTrace

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register: RegisterQuantity) -> None:
    """Register ``hess_max_ev``, ``hess_trace``, ``tic_diag``, ``tic_trace``, ``hess_spectrum``."""
    for cls in (HessMaxEV, HessTrace, TICDiag, TICTrace, HessSpectrum):
        register(cls)


@hookimpl
def register_instruments(register: RegisterInstrument) -> None:
    """Register the curvature panels (max eigenvalue, trace, TIC, sharpness, spectrum)."""
    from cockpit_curvature.instruments import INSTRUMENTS
    from cockpit_curvature.sharpness_panel import SHARPNESS
    from cockpit_curvature.spectrum_panel import INSTRUMENT as SPECTRUM

    for instrument in (*INSTRUMENTS, SHARPNESS, SPECTRUM):
        register(instrument)
