"""Entry point of cockpit-alpha: registers ``alpha``."""

from cockpit_alpha import Alpha
from cockpit_core import hookimpl

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register):
    """Register the alpha quantity."""
    register(Alpha)


@hookimpl
def register_instruments(register):
    """Register the alpha gauge panel."""
    from cockpit_alpha.instruments import INSTRUMENTS

    for instrument in INSTRUMENTS:
        register(instrument)
