"""cockpit-histograms: histograms of per-sample gradient elements (1-D, and 2-D over parameters)."""

from cockpit_histograms._binning import RangeAdaptation
from cockpit_histograms.grad_hist_1d import GradHist1d
from cockpit_histograms.grad_hist_2d import GradHist2d

__all__ = ["GradHist1d", "GradHist2d", "RangeAdaptation"]
