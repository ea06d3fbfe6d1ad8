"""Entry point of cockpit-histograms: registers ``grad_hist_1d`` and ``grad_hist_2d``."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterInstrument, RegisterQuantity
from cockpit_histograms import GradHist1d, GradHist2d

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register: RegisterQuantity) -> None:
    """Register the two histogram quantities."""
    register(GradHist1d)
    register(GradHist2d)


@hookimpl
def register_instruments(register: RegisterInstrument) -> None:
    """Register the histogram panels (last step, over time, 2-D, per layer)."""
    from cockpit_histograms.instruments import INSTRUMENTS

    for instrument in INSTRUMENTS:
        register(instrument)
