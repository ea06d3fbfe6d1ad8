"""cockpit-tensorboard: a sink that writes curated cockpit tags to TensorBoard event files."""

from cockpit_tensorboard.sink import TensorBoardConfig, TensorBoardSink
from cockpit_tensorboard.tags import TagMap

__all__ = ["TagMap", "TensorBoardConfig", "TensorBoardSink"]
