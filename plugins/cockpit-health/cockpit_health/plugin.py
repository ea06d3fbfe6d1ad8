"""Entry point of cockpit-health: registers its quantities, the ``health`` preset and panels."""

from cockpit_core import hookimpl
from cockpit_core.hookspecs import RegisterInstrument, RegisterPreset, RegisterQuantity
from cockpit_health import QUANTITIES

COCKPIT_PROTOCOL_VERSION = 1

HEALTH: list[str | dict[str, object]] = [
    "loss",
    "grad_norm",
    "param_norm",
    "update_ratio",
    "activations",
    "logits",
    {"name": "attention", "entropy": False},
]
"""The cheap training-health signals (no per-sample statistics): ``loss`` and ``grad_norm``
come from cockpit-basic, ``activations`` and ``logits`` from cockpit-activations,
``attention`` from cockpit-attention, with its largest logit per layer and head only (the
entropy needs a softmax of every logit, about as much again; track ``attention`` itself
for it; empty for a model without attention). The last three are read from the forward
pass, so the Cockpit needs the model."""


@hookimpl
def register_quantities(register: RegisterQuantity) -> None:
    """Register param_norm, update_ratio and noise_scale."""
    for cls in QUANTITIES:
        register(cls)


@hookimpl
def register_presets(register: RegisterPreset) -> None:
    """Register ``health``: :data:`HEALTH`."""
    register(
        "health",
        HEALTH,
        "What LLM practitioners watch, cheaply (no per-sample statistics): loss, gradient "
        "norm, parameter norm, update/parameter ratio, activation scale, output logits and "
        "the largest attention logits (from cockpit-basic, cockpit-activations and "
        "cockpit-attention; the last three need the model).",
    )


@hookimpl
def register_instruments(register: RegisterInstrument) -> None:
    """Register the dashboard panels of the health quantities."""
    from cockpit_health.instruments import INSTRUMENTS

    for instrument in INSTRUMENTS:
        register(instrument)
