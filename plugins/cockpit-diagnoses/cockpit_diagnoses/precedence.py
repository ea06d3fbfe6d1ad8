"""Whose evidence wins when two findings turn a knob opposite ways: the table of rules.

Each finding of these rules declares the knobs its suggestion turns, alternatives included
(:attr:`cockpit_core.diagnosis.Finding.advice`):

- learning rate down: ``step_size/overshoot``, ``stability``, ``exploding_gradients``,
  ``nonfinite``, ``vanishing_gradients``, ``early_stopping``, ``loss_spike``,
  ``grad_norm_spike``, ``update_ratio_range`` (above ``high``), ``attention_logit_growth``,
  ``attention_entropy_collapse``, ``activation_blowup``; ``logit_divergence`` (learning
  rate down, or a z-loss: ``z_loss`` up);
- learning rate up: ``step_size/undershoot``, ``loss_plateau`` (when the loss fell too
  little; a loss that rose advises nothing), ``update_ratio_range`` (below ``low``; a
  layer that is not updated at all advises nothing);
- batch size up and learning rate down: ``batch_size``, ``cabs_batch``, ``gsnr_collapse``;
- nothing: ``dead_layers``, ``histogram_clamped``, ``cost``.

When two findings of one run whose stretches overlap advise opposite directions, the
report (:func:`cockpit_core.diagnosing.run.report_entries`) keeps the one whose evidence a rule
of :data:`PRECEDENCE` puts first and lists the other under it, with the rule's reason;
opposite advice that no rule decides becomes one conflict entry naming both. Each
diagnosis class declares the rules it wins (``precedence = won_by(name)``), so the core
collects them from the installed diagnoses like any third party's.
"""

from __future__ import annotations

from cockpit_core.diagnosis import Precedence

LEARNING_RATE = "learning_rate"
BATCH_SIZE = "batch_size"
LOWER_LR = {LEARNING_RATE: "down"}
RAISE_LR = {LEARNING_RATE: "up"}
GROW_BATCH = {BATCH_SIZE: "up", LEARNING_RATE: "down"}
"""Advice of the rules whose suggestion is "grow the batch, or lower the learning rate"."""

TOO_LARGE_STEP = ("stability", "step_size/overshoot", "exploding_gradients", "nonfinite")
"""Findings that measure a step that is already too large."""

RUNAWAY = (
    "attention_logit_growth",
    "attention_entropy_collapse",
    "logit_divergence",
    "activation_blowup",
)
"""Findings of logits or activations that run away, the instabilities of high learning rates."""

PRECEDENCE: tuple[Precedence, ...] = (
    Precedence(
        LEARNING_RATE,
        wins=TOO_LARGE_STEP,
        over=("loss_plateau", "step_size/undershoot"),
        because="the step is already too large (it overshoots the minimum along the update, "
        "the curvature is above 2/lr, or the gradient explodes or turns non-finite): a flat "
        "loss or a short step along the update is its symptom, not a reason to raise the "
        "learning rate",
    ),
    Precedence(
        LEARNING_RATE,
        wins=("vanishing_gradients",),
        over=("loss_plateau",),
        because="layers stopped getting gradient: the loss is flat because they no longer "
        "learn, and a larger step does not revive saturated or dead units (large steps are a "
        "common cause)",
    ),
    Precedence(
        LEARNING_RATE,
        wins=("early_stopping",),
        over=("loss_plateau",),
        because="the gradient is indistinguishable from zero given its noise: the loss is "
        "flat because training converged at this learning rate, and a larger one only adds "
        "noise",
    ),
    Precedence(
        LEARNING_RATE,
        wins=("batch_size", "cabs_batch", "gsnr_collapse"),
        over=("loss_plateau",),
        because="the mini-batch gradient is mostly noise: a larger learning rate amplifies "
        "the noise rather than the progress; grow the batch first",
    ),
    Precedence(
        LEARNING_RATE,
        wins=("loss_spike", "grad_norm_spike"),
        over=("loss_plateau",),
        because="the loss or the gradient spiked: the step was too large for that batch, and "
        "a flat loss around a spike (the loss climbing back) is not a reason to raise the "
        "learning rate",
    ),
    Precedence(
        LEARNING_RATE,
        wins=("update_ratio_range",),
        over=("loss_plateau", "step_size/undershoot"),
        because="a layer's updates rewrite too large a share of its weights per step: its "
        "step is already too large, and a flat loss or a short step along the update is not "
        "a reason to make it larger",
    ),
    Precedence(
        LEARNING_RATE,
        wins=RUNAWAY,
        over=("loss_plateau", "step_size/undershoot"),
        because="attention logits, output logits or activations run away, which high "
        "learning rates cause (Wortsman et al. 2023): a flat loss or a short step along the "
        "update is not a reason to raise the learning rate",
    ),
)
"""The first-party rules, strongest evidence first."""


def won_by(name: str) -> tuple[Precedence, ...]:
    """The rules of :data:`PRECEDENCE` in which findings of the diagnosis ``name`` win."""
    return tuple(r for r in PRECEDENCE if any(p.split("/")[0] == name for p in r.wins))
