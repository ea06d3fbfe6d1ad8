"""Entry point of cockpit-alpha: registers ``alpha``."""

from cockpit_alpha import Alpha
from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterInstrument, RegisterQuantity

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register: RegisterQuantity) -> None:
    """Register the alpha quantity."""
    register(Alpha)


@hookimpl
def register_instruments(register: RegisterInstrument) -> None:
    """Register the alpha gauge panel."""
    from cockpit_alpha.instruments import INSTRUMENTS

    for instrument in INSTRUMENTS:
        register(instrument)
