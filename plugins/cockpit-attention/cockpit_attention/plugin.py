"""Entry point of cockpit-attention: registers ``attention`` and its panels."""

from cockpit_attention import Attention
from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterInstrument, RegisterQuantity

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register: RegisterQuantity) -> None:
    """Register the attention quantity."""
    register(Attention)


@hookimpl
def register_instruments(register: RegisterInstrument) -> None:
    """Register the attention panels."""
    from cockpit_attention.instruments import INSTRUMENTS  # imported only when panels are needed

    for instrument in INSTRUMENTS:
        register(instrument)
