"""Entry point of cockpit-wandb: registers the ``wandb`` sink."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterSink
from cockpit_wandb.sink import WandbConfig, WandbSink

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_sinks(register: RegisterSink) -> None:
    """Register the ``wandb`` sink (``Cockpit(..., sinks=["wandb"])``)."""
    register(
        "wandb",
        WandbSink,
        config=WandbConfig,
        description=(
            "A Weights & Biases run: cockpit/ scalars at the training step, the 1-D gradient "
            "histogram, the dashboard as an image, the header as config."
        ),
    )
