"""cockpit-gradient-tests: quantities from per-sample gradient statistics.

Norm, inner-product and orthogonality tests, mean gradient signal-to-noise ratio,
evidence-based early stopping and the CABS batch-size rule, with the formulas and
defaults of Cockpit 1.0.2 (see ``docs/quantities/gradient_tests.md``).
"""

from cockpit_gradient_tests.cabs import CABS
from cockpit_gradient_tests.early_stopping import EarlyStopping
from cockpit_gradient_tests.inner_test import InnerTest
from cockpit_gradient_tests.mean_gsnr import MeanGSNR
from cockpit_gradient_tests.norm_test import NormTest
from cockpit_gradient_tests.ortho_test import OrthoTest

QUANTITIES = (NormTest, InnerTest, OrthoTest, MeanGSNR, EarlyStopping, CABS)
"""Every quantity class of this plugin, in documentation order."""

__all__ = [
    "CABS",
    "QUANTITIES",
    "EarlyStopping",
    "InnerTest",
    "MeanGSNR",
    "NormTest",
    "OrthoTest",
]
