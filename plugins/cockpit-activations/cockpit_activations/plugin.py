"""Entry point of cockpit-activations: registers ``activations``, ``logits`` and their panels."""

from cockpit_activations import Activations, Logits
from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterInstrument, RegisterQuantity

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register: RegisterQuantity) -> None:
    """Register the two forward-pass quantities."""
    register(Activations)
    register(Logits)


@hookimpl
def register_instruments(register: RegisterInstrument) -> None:
    """Register the activation and logits panels."""
    from cockpit_activations.instruments import INSTRUMENTS

    for instrument in INSTRUMENTS:
        register(instrument)
