"""Entry point of the plugin (see pyproject.toml): the hooks that register it with cockpit."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterInstrument, RegisterQuantity

from cockpit_example.max_sample_grad_norm import MaxSampleGradNorm

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register: RegisterQuantity) -> None:
    """Register the plugin's quantities."""
    register(MaxSampleGradNorm)


@hookimpl
def register_instruments(register: RegisterInstrument) -> None:
    """Register the plugin's dashboard panels."""
    from cockpit_example.instruments import INSTRUMENTS  # imported only when panels are needed

    for instrument in INSTRUMENTS:
        register(instrument)
