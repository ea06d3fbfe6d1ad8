"""Entry point of cockpit-tensorboard: registers the ``tensorboard`` sink."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterSink
from cockpit_tensorboard.sink import TensorBoardConfig, TensorBoardSink

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_sinks(register: RegisterSink) -> None:
    """Register the ``tensorboard`` sink (``Cockpit(..., sinks=["tensorboard"])``)."""
    register(
        "tensorboard",
        TensorBoardSink,
        config=TensorBoardConfig,
        description=(
            "Curated TensorBoard events: cockpit/ scalars, the 1-D gradient histogram, "
            "the dashboard as an image."
        ),
    )
