"""Entry point of the example plugin: registers its quantities and panels with cockpit."""

from cockpit_core import hookimpl
from cockpit_example.max_sample_grad_norm import MaxSampleGradNorm

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register):
    """Register the example quantity."""
    register(MaxSampleGradNorm)


@hookimpl
def register_instruments(register):
    """Register the example's dashboard panel."""
    from cockpit_example.instruments import INSTRUMENTS  # imported only when panels are needed

    for instrument in INSTRUMENTS:
        register(instrument)
