"""Gradient-norm spikes: the gradient norm far above its trailing window, and where."""

from __future__ import annotations

from cockpit_diagnoses._spike import SpikeDiagnosis
from cockpit_diagnoses.precedence import won_by


class GradNormSpike(SpikeDiagnosis):
    """The total gradient norm at a step is far above the ``window`` (50) tracked steps before.

    OLMo 2 (Team OLMo 2024, "2 OLMo 2 Furious", its section on training stability) watches the gradient
    norm because its spikes precede loss spikes; PaLM (Chowdhery et al. 2022, Sec. 5.1)
    handles the loss spikes. The same test as ``loss_spike`` on ``grad_norm``'s ``total``:
    robust z-score above ``threshold`` (6) against the trailing window and above its largest
    value by more than ``margin`` (2) times that value's distance from the median. Reported as ``info``: clipping and adaptive
    optimizers absorb many gradient spikes, and ``loss_spike`` warns when the loss follows.
    Reads ``grad_norm`` (cockpit-basic); its ``per_param`` norms and ``update_ratio``
    (cockpit-health) name the parameters that jumped, a ``batch_id`` metric the batch.
    Evidence as for ``loss_spike``.
    """

    name = "grad_norm_spike"
    reads = ("grad_norm", "update_ratio")
    source = (
        "OLMo 2 (2024): gradient-norm spikes precede loss spikes; PaLM (Chowdhery et al. 2022, "
        "Sec. 5.1); robust z-score against the trailing window"
    )
    series = ("grad_norm", "total")
    what = "the gradient norm"
    severity = "info"
    precedence = won_by(name)
