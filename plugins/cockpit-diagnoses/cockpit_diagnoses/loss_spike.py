"""Loss spikes: a mini-batch loss far above its trailing window, and what jumped with it."""

from __future__ import annotations

from cockpit_diagnoses._spike import SpikeDiagnosis
from cockpit_diagnoses.precedence import won_by


class LossSpike(SpikeDiagnosis):
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
    series = ("loss", None)
    what = "the loss"
    severity = "warning"
    precedence = won_by(name)
