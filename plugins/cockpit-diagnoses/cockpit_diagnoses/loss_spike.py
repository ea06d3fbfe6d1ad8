"""Loss spikes: a mini-batch loss far above its trailing window, and what jumped with it."""

from __future__ import annotations

from cockpit_core.diagnosis import Diagnosis, Finding, Window
from cockpit_diagnoses._common import fmt
from cockpit_diagnoses._spike import (
    SPIKE_SUGGESTION,
    SpikeConfig,
    at_step,
    attribution,
    find_spikes,
    how_far,
    spike_evidence,
)
from cockpit_diagnoses.precedence import LOWER_LR, won_by


class LossSpike(Diagnosis):
    """The loss at a step is far above the ``window`` (50) tracked steps before it.

    Large-scale training watches for loss spikes: PaLM (Chowdhery et al. 2022, "PaLM:
    Scaling Language Modeling with Pathways", JMLR, Sec. 5.1) saw about 20 spikes in its
    largest run and restarted from a checkpoint about 100 steps before each, skipping 200-500
    batches; OLMo 2 (Team OLMo 2024, "2 OLMo 2 Furious") finds that spikes of the gradient
    norm precede those of the loss. A tracked step is a spike when its robust z-score
    against the trailing window, ``(loss - median) / (1.4826 MAD)``, is above
    ``threshold`` (6) and the loss is above the window's largest value (earlier spikes
    left out) by more than ``margin`` (2) times that value's distance from the median; at
    least ``min_window`` (20) earlier tracked steps are needed. A spike lasts until the loss
    is back at the median before it (one finding for the excursion and its recovery).
    Non-finite losses are left to ``nonfinite``. Reads ``loss``; ``grad_norm`` and ``update_ratio``
    (cockpit-health) name the parameters that jumped with it, and a ``batch_id`` (or
    ``batch``) metric of ``cp.log(step, batch_id=...)`` the batch. Evidence: the loss, the
    window's median, robust standard deviation and largest value, the z-score, the
    parameters whose gradient norm and update ratio jumped most (factor over their own
    trailing median), the batch.
    """

    name = "loss_spike"
    reads = ("loss", "grad_norm", "update_ratio")
    source = (
        "PaLM (Chowdhery et al. 2022, Sec. 5.1) and OLMo 2 (2024): robust z-score of the loss "
        "against its trailing window"
    )
    Config = SpikeConfig
    config: SpikeConfig
    precedence = won_by(name)

    def applies(self, window: Window) -> bool:
        """The loss is needed; the other quantities only name the parameters."""
        return window.has("loss")

    def check(self, window: Window) -> list[Finding]:
        """Return one finding per spike (consecutive flagged steps)."""
        cfg = self.config
        steps, loss = window.finite_series("loss")
        found = []
        for spike in find_spikes(steps, loss, cfg):
            who, clause = attribution(window, spike.first_step, cfg)
            found.append(
                self.finding(
                    "",
                    "warning",
                    spike.first_step,
                    spike.last_step,
                    f"the loss at {at_step(spike.first_step, who)} is {fmt(spike.value)}: "
                    f"{how_far(spike)}{clause}",
                    {**spike_evidence(spike, "loss", cfg), **who},
                    SPIKE_SUGGESTION,
                    LOWER_LR,
                )
            )
        return found
