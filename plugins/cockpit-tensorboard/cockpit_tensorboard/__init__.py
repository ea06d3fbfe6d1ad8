"""cockpit-tensorboard: a sink that writes every tracked value to TensorBoard event files."""

from cockpit_tensorboard.sink import TensorBoardConfig, TensorBoardSink

__all__ = ["TensorBoardConfig", "TensorBoardSink"]
