"""Vanishing gradients: a parameter's gradient norm collapses relative to its early value."""

from __future__ import annotations

from typing import TypedDict

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, Finding, Window, persistent_spans
from cockpit_diagnoses._common import change_factor, fmt
from cockpit_diagnoses._relative import RelativeDropConfig, reference_value
from cockpit_diagnoses.precedence import LOWER_LR, won_by


class VanishingGradientsConfig(RelativeDropConfig):
    """Options of :class:`VanishingGradients`."""

    ratio: float = Field(
        1e-3,
        gt=0.0,
        lt=1.0,
        description="Report a norm below this share of the parameter's reference norm.",
    )


class _Stretch(TypedDict):
    """Parameters whose gradients vanished from one first step on: each one's evidence."""

    last: int
    parameters: dict[str, dict[str, float]]  # name -> {"reference": ..., "median": ...}


class VanishingGradients(Diagnosis):
    """A layer stops learning: its gradient norm falls ``1/ratio`` x below its early value.

    For each parameter ``p`` the reference is the median of ``||grad_p||`` over the first
    ``reference`` (5) tracked steps; a tracked step is flagged when
    ``||grad_p|| < ratio * reference`` (``ratio`` 1e-3), reported when that holds at
    ``fraction`` (0.8) of ``window`` (10) consecutive tracked steps. Saturated tanh or
    sigmoid units (Glorot & Bengio 2010, "Understanding the difficulty of training deep
    feedforward neural networks", AISTATS) and ReLUs that die one by one shrink a layer's
    gradient this way, by products of small Jacobians (Hochreiter 1991; Bengio, Simard &
    Frasconi 1994). Parameters whose reference is 0 are left to ``dead_layers``. Reads the
    ``per_param`` norms of ``grad_norm`` (cockpit-basic). Evidence: per parameter, the
    reference and the median norm of the stretch.
    """

    name = "vanishing_gradients"
    reads = ("grad_norm",)
    source = "Glorot & Bengio (2010); rule: ||grad_p|| < ratio x its early median"
    Config = VanishingGradientsConfig
    config: VanishingGradientsConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return one finding per first step at which parameters' gradients vanished."""
        cfg = self.config
        steps, norms = window.per_param("grad_norm")
        if norms.shape[0] <= cfg.reference:
            return []
        names = window.param_names
        if len(names) != norms.shape[1]:
            names = [f"parameter {i}" for i in range(norms.shape[1])]
        by_first: dict[int, _Stretch] = {}
        for i, name in enumerate(names):
            ref = reference_value(norms[:, i], cfg.reference)
            if not np.isfinite(ref) or ref <= 0:
                continue
            flags = norms[:, i] < cfg.ratio * ref
            flags[: cfg.reference] = False  # the reference steps themselves
            for first, last, _ in persistent_spans(steps, flags, cfg.window, cfg.fraction):
                inside = (steps >= first) & (steps <= last)
                entry = by_first.setdefault(first, {"last": last, "parameters": {}})
                entry["last"] = max(entry["last"], last)
                entry["parameters"][name] = {
                    "reference": ref,
                    "median": float(np.median(norms[inside, i])),
                }
        found = []
        for first, entry in sorted(by_first.items()):
            params = entry["parameters"]
            worst = min(params.values(), key=lambda v: v["median"] / v["reference"])
            found.append(
                self.finding(
                    "",
                    "warning",
                    first,
                    entry["last"],
                    vanishing_message(
                        list(params), cfg.ratio, worst["median"] / worst["reference"]
                    ),
                    {"parameters": params, "ratio": cfg.ratio, "reference_steps": cfg.reference},
                    "Look for saturated activations or dying ReLUs in these layers: lower the "
                    "learning rate, normalize the inputs or activations, or change the "
                    "initialization.",
                    LOWER_LR,
                )
            )
        return found


def vanishing_message(names: list[str], ratio: float, lowest: float) -> str:
    """``the gradient of 2 parameter(s) fell below 0.001x its early value (...): a, b``.

    ``lowest`` is the smallest median of the stretch over its reference; its verb follows
    its direction (``the furthest fell to 0.0002x``).
    """
    return (
        f"the gradient of {len(names)} parameter(s) fell below {fmt(ratio)}x its early value "
        f"(the furthest {change_factor(1.0, lowest)}): "
        + ", ".join(names[:5])
        + (" ..." if len(names) > 5 else "")
    )
