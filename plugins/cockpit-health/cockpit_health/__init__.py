"""cockpit-health: the training-health signals LLM practitioners watch.

Parameter norm, update-to-parameter ratio and the simple gradient noise scale (from
per-sample statistics, or cheaply from micro-batch gradients), plus the
``health`` preset (see ``docs/quantities/health.md``).
"""

from cockpit_health.noise_scale import NoiseScale
from cockpit_health.noise_scale_cheap import NoiseScaleCheap
from cockpit_health.param_norm import ParamNorm
from cockpit_health.update_ratio import UpdateRatio

QUANTITIES = (ParamNorm, UpdateRatio, NoiseScale, NoiseScaleCheap)
"""Every quantity class of this plugin, in documentation order."""

__all__ = ["QUANTITIES", "NoiseScale", "NoiseScaleCheap", "ParamNorm", "UpdateRatio"]
