"""cockpit-curvature: Hessian max eigenvalue, Hessian trace and TIC quantities for cockpit."""

from cockpit_curvature.hess_max_ev import HessMaxEV
from cockpit_curvature.hess_spectrum import HessSpectrum
from cockpit_curvature.hess_trace import HessTrace
from cockpit_curvature.tic_diag import TICDiag
from cockpit_curvature.tic_trace import TICTrace

__all__ = ["HessMaxEV", "HessSpectrum", "HessTrace", "TICDiag", "TICTrace"]
