"""cockpit-diagnoses: rules that read logged quantities and say what is wrong, with evidence."""

from cockpit_diagnoses.activation_blowup import ActivationBlowup
from cockpit_diagnoses.attention_entropy_collapse import AttentionEntropyCollapse
from cockpit_diagnoses.attention_logit_growth import AttentionLogitGrowth
from cockpit_diagnoses.batch_size import BatchSize
from cockpit_diagnoses.cabs_batch import CABSBatch
from cockpit_diagnoses.cost import Cost
from cockpit_diagnoses.dead_layers import DeadLayers
from cockpit_diagnoses.early_stopping import EarlyStopping
from cockpit_diagnoses.exploding_gradients import ExplodingGradients
from cockpit_diagnoses.grad_norm_spike import GradNormSpike
from cockpit_diagnoses.gsnr_collapse import GSNRCollapse
from cockpit_diagnoses.histogram_clamped import HistogramClamped
from cockpit_diagnoses.logit_divergence import LogitDivergence
from cockpit_diagnoses.loss_plateau import LossPlateau
from cockpit_diagnoses.loss_spike import LossSpike
from cockpit_diagnoses.nonfinite import NonFinite
from cockpit_diagnoses.stability import Stability
from cockpit_diagnoses.step_size import StepSize
from cockpit_diagnoses.update_ratio_range import UpdateRatioRange
from cockpit_diagnoses.vanishing_gradients import VanishingGradients

DIAGNOSES = (
    StepSize,
    Stability,
    BatchSize,
    EarlyStopping,
    DeadLayers,
    ExplodingGradients,
    NonFinite,
    LossPlateau,
    VanishingGradients,
    GSNRCollapse,
    HistogramClamped,
    CABSBatch,
    LossSpike,
    GradNormSpike,
    UpdateRatioRange,
    AttentionLogitGrowth,
    AttentionEntropyCollapse,
    LogitDivergence,
    ActivationBlowup,
    Cost,
)
"""Every diagnosis of this plugin, in documentation order."""

__all__ = [
    "DIAGNOSES",
    "ActivationBlowup",
    "AttentionEntropyCollapse",
    "AttentionLogitGrowth",
    "BatchSize",
    "CABSBatch",
    "Cost",
    "DeadLayers",
    "EarlyStopping",
    "ExplodingGradients",
    "GSNRCollapse",
    "GradNormSpike",
    "HistogramClamped",
    "LogitDivergence",
    "LossPlateau",
    "LossSpike",
    "NonFinite",
    "Stability",
    "StepSize",
    "UpdateRatioRange",
    "VanishingGradients",
]
