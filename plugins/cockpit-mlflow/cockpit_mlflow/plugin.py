"""Entry point of cockpit-mlflow: registers the ``mlflow`` sink."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterSink
from cockpit_mlflow.sink import MlflowConfig, MlflowSink

COCKPIT_PROTOCOL_VERSION = 1


@hookimpl
def register_sinks(register: RegisterSink) -> None:
    """Register the ``mlflow`` sink (``Cockpit(..., sinks=["mlflow"])``)."""
    register(
        "mlflow",
        MlflowSink,
        config=MlflowConfig,
        description=(
            "An MLflow run: cockpit/ metrics at the training step, the header as tags, the "
            "dashboard and the cockpit log as artifacts."
        ),
    )
