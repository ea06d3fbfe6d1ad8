"""Entry point of cockpit-gradient-tests: registers its six quantities."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterInstrument, RegisterQuantity
from cockpit_gradient_tests import QUANTITIES

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register: RegisterQuantity) -> None:
    """Register norm_test, inner_test, ortho_test, mean_gsnr, early_stopping and cabs."""
    for cls in QUANTITIES:
        register(cls)


@hookimpl
def register_instruments(register: RegisterInstrument) -> None:
    """Register the dashboard panels (gradient tests, GSNR, early stopping, CABS)."""
    from cockpit_gradient_tests.instruments import INSTRUMENTS

    for instrument in INSTRUMENTS:
        register(instrument)
