"""Entry point of cockpit-health: registers its quantities, the ``health`` preset and panels."""

from cockpit_core import hookimpl
from cockpit_health import QUANTITIES

COCKPIT_PROTOCOL_VERSION = 1

HEALTH = ["loss", "grad_norm", "param_norm", "update_ratio", "activations", "logits"]
"""The cheap training-health signals (no per-sample statistics): ``loss`` and ``grad_norm``
come from cockpit-basic, ``activations`` and ``logits`` (read from the forward pass: the
Cockpit needs the model) from cockpit-activations. Attention logits will join them."""


@hookimpl
def register_quantities(register):
    """Register param_norm, update_ratio and noise_scale."""
    for cls in QUANTITIES:
        register(cls)


@hookimpl
def register_presets(register):
    """Register ``health``: :data:`HEALTH`."""
    register(
        "health",
        HEALTH,
        "What LLM practitioners watch, cheaply (no per-sample statistics): loss, gradient "
        "norm, parameter norm, update/parameter ratio, activation scale and output logits "
        "(from cockpit-basic and cockpit-activations; the last two need the model).",
    )


@hookimpl
def register_instruments(register):
    """Register the dashboard panels of the health quantities."""
    from cockpit_health.instruments import INSTRUMENTS

    for instrument in INSTRUMENTS:
        register(instrument)
