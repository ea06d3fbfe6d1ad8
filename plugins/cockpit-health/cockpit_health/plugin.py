"""Entry point of cockpit-health: registers its quantities, the ``health`` preset and panels."""

from cockpit_core import hookimpl
from cockpit_health import QUANTITIES

COCKPIT_PROTOCOL_VERSION = 1

HEALTH = ["loss", "grad_norm", "param_norm", "update_ratio", "activations", "logits", "attention"]
"""The cheap training-health signals (no per-sample statistics): ``loss`` and ``grad_norm``
come from cockpit-basic, ``activations`` and ``logits`` from cockpit-activations,
``attention`` (max attention logit and entropy per layer and head; empty for a model without
attention) from cockpit-attention; the last three are read from the forward pass, so the
Cockpit needs the model."""


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
        "norm, parameter norm, update/parameter ratio, activation scale, output logits and "
        "attention logits and entropy (from cockpit-basic, cockpit-activations and "
        "cockpit-attention; the last three need the model).",
    )


@hookimpl
def register_instruments(register):
    """Register the dashboard panels of the health quantities."""
    from cockpit_health.instruments import INSTRUMENTS

    for instrument in INSTRUMENTS:
        register(instrument)
