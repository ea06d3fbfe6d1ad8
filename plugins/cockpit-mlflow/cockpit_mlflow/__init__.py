"""cockpit-mlflow: a sink that logs cockpit's metrics, header and dashboard to an MLflow run."""

from cockpit_mlflow.keys import metric_key
from cockpit_mlflow.sink import MlflowConfig, MlflowSink

__all__ = ["MlflowConfig", "MlflowSink", "metric_key"]
