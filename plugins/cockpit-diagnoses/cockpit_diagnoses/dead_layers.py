"""Dead layers: parameters whose gradient is exactly zero at every step of a window."""

from __future__ import annotations

from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig, Finding, Window, persistent_spans


class DeadLayersConfig(DiagnosisConfig):
    """Options of :class:`DeadLayers`."""

    window: int = Field(
        5, ge=1, description="Consecutive tracked steps with an exactly zero gradient."
    )


class DeadLayers(Diagnosis):
    """Parameters that get no gradient at all: a layer cut off from the loss.

    A gradient that is exactly zero (not small) at every one of ``window`` (5) consecutive
    tracked steps means nothing flows back to the parameter: a ReLU layer whose units all
    died, an output multiplied by zero, a detached branch, a frozen input. The rule reads
    the per-parameter norms of ``grad_norm`` (cockpit-basic); parameters are named by the
    log header. Evidence: the names (or indices) of the dead parameters.
    """

    name = "dead_layers"
    reads = ("grad_norm",)
    source = "rule: ||grad|| == 0 exactly at every step of a window (per parameter)"
    Config = DeadLayersConfig
    config: DeadLayersConfig

    def check(self, window: Window) -> list[Finding]:
        """Return one finding per first step at which parameters went dead."""
        steps, norms = window.per_param("grad_norm")
        if norms.size == 0:
            return []
        names = window.param_names
        if len(names) != norms.shape[1]:
            names = [f"parameter {i}" for i in range(norms.shape[1])]
        by_first: dict[int, tuple[int, list[str]]] = {}
        for i, name in enumerate(names):
            spans = persistent_spans(steps, norms[:, i] == 0.0, self.config.window, 1.0)
            for first, last, _ in spans:
                end, dead = by_first.get(first, (last, []))
                by_first[first] = (max(end, last), [*dead, name])
        found = []
        for first, (last, dead) in sorted(by_first.items()):
            found.append(
                self.finding(
                    "",
                    "warning",
                    first,
                    last,
                    f"{len(dead)} parameter(s) get an exactly zero gradient: "
                    + ", ".join(dead[:5])
                    + (" ..." if len(dead) > 5 else ""),
                    {"parameters": dead, "window": self.config.window},
                    "Check what multiplies or detaches these layers' outputs (dead ReLUs, "
                    "a zero scale, .detach(), requires_grad) or whether they are used at all.",
                )
            )
        return found
