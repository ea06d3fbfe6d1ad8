"""Numerics: the first step whose loss or gradients were not finite, and where."""

from __future__ import annotations

import re

from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig, Finding, Window
from cockpit_diagnoses.precedence import LOWER_LR, won_by

_NAMED = re.compile(r"'([^']+)'")


class NonFinite(Diagnosis):
    """Steps that cockpit skipped because the loss or a gradient was NaN or infinite.

    Reads the ``skipped`` records whose reason starts with ``non-finite values`` (cockpit
    checks the loss and every tracked gradient before computing quantities). Reported as an
    ``error`` from the first such step to the last. Evidence: the first step, how many
    steps were skipped, the first reason and the parameters it names (the first layer
    whose gradient was not finite).
    """

    name = "nonfinite"
    reads = ()
    source = "rule: cockpit's check of the loss and gradients (skipped records)"
    Config = DiagnosisConfig
    precedence = won_by(name)

    def applies(self, window: Window) -> bool:
        """Only skipped records are read."""
        return bool(window.skipped)

    def check(self, window: Window) -> list[Finding]:
        """Return one finding covering every non-finite step."""
        bad = [
            r
            for r in window.skipped
            if str(r.get("reason", "")).startswith("non-finite values")
            and isinstance(r.get("step"), int)
        ]
        if not bad:
            return []
        bad.sort(key=lambda r: r["step"])
        first, reason = bad[0]["step"], str(bad[0]["reason"])
        scaler = "scaler" in reason.lower()
        named = _NAMED.findall(reason)
        where = f" (first in {named[0]})" if named else ""
        return [
            self.finding(
                "",
                "warning" if scaler else "error",
                first,
                bad[-1]["step"],
                f"non-finite loss or gradients from step {first}{where}; {len(bad)} step(s) "
                "skipped",
                {
                    "first_step": first,
                    "skipped_steps": len(bad),
                    "reason": reason,
                    "parameters": named,
                },
                "Lower the learning rate, add gradient clipping, or look for log(0), "
                "division by zero or bad inputs at that step; with mixed precision, check "
                "the loss scale.",
                LOWER_LR,
            )
        ]
