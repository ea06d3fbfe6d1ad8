"""Entry point of the example plugin: registers its quantities with cockpit."""

from cockpit_core import hookimpl
from cockpit_example.max_sample_grad_norm import MaxSampleGradNorm

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_quantities(register):
    """Register the example quantity."""
    register(MaxSampleGradNorm)
