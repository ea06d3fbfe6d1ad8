"""cockpit-basic: the quantities every run wants (loss, norms, distances, time) and the presets."""

from cockpit_basic.distance import Distance
from cockpit_basic.grad_norm import GradNorm
from cockpit_basic.loss import Loss
from cockpit_basic.optimizer_hparams import OptimizerHparams
from cockpit_basic.parameters import Parameters
from cockpit_basic.time import Time
from cockpit_basic.update_size import UpdateSize

__all__ = [
    "Distance",
    "GradNorm",
    "Loss",
    "OptimizerHparams",
    "Parameters",
    "Time",
    "UpdateSize",
]
