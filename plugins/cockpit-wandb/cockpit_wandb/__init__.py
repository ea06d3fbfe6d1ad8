"""cockpit-wandb: a sink that logs cockpit's scalars and dashboard to a Weights & Biases run."""

from cockpit_wandb.sink import WandbConfig, WandbSink

__all__ = ["WandbConfig", "WandbSink"]
