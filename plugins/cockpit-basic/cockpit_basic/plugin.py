"""Entry point of cockpit-basic: registers its quantities and the standard presets."""

from cockpit_basic import (
    Distance,
    GradNorm,
    Loss,
    OptimizerHparams,
    Parameters,
    Time,
    UpdateSize,
)
from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterInstrument, RegisterPreset, RegisterQuantity

COCKPIT_PROTOCOL_VERSION = 1

# Cockpit 1.0.2's configurations plus optimizer_hparams (free: no statistics; it needs
# info["optimizer"]) for the effective learning rate and sharpness panels.
ECONOMY = [
    "alpha",
    "distance",
    "grad_hist_1d",
    "grad_norm",
    "inner_test",
    "loss",
    "norm_test",
    "optimizer_hparams",
    "ortho_test",
    "update_size",
]
BUSINESS = ECONOMY + ["tic_diag", "hess_trace"]
FULL = BUSINESS + ["hess_max_ev", "grad_hist_2d"]
BASIC = ["loss", "grad_norm", "distance", "update_size", "parameters", "time"]


@hookimpl
def register_quantities(register: RegisterQuantity) -> None:
    """Register the seven basic quantities."""
    for cls in (Loss, Parameters, Distance, UpdateSize, GradNorm, Time, OptimizerHparams):
        register(cls)


@hookimpl
def register_presets(register: RegisterPreset) -> None:
    """Register ``economy``, ``business``, ``full`` (Cockpit 1.0.2's, with optimizer_hparams) and ``basic``."""
    register(
        "economy",
        ECONOMY,
        "Cheap first-order diagnostics (Cockpit 1.0.2 'economy') and the optimizer's "
        "hyperparameters.",
    )
    register("business", BUSINESS, "economy + Hessian trace and TIC (Cockpit 1.0.2 'business').")
    register("full", FULL, "business + Hessian max eigenvalue and 2-D histogram (1.0.2 'full').")
    register("basic", BASIC, "Only the quantities of cockpit-basic: no per-sample statistics.")


@hookimpl
def register_instruments(register: RegisterInstrument) -> None:
    """Register the dashboard panels of the basic quantities."""
    from cockpit_basic.instruments import INSTRUMENTS

    for instrument in INSTRUMENTS:
        register(instrument)
