"""Messages of cockpit-diagnoses that state a signed change use the verb of its sign.

Every template that formats a change (``fell by``, ``rose by``, ``grew``, ``fell to``, a
comparison with a threshold) is tested with a change each way: a loss that rose must not
"fall by -0.56 %".
"""

import re

import numpy as np
import pytest
from cockpit_diagnoses import DIAGNOSES, LossPlateau
from cockpit_diagnoses._common import change_by, change_factor, relation
from cockpit_diagnoses.batch_size import failing_message
from cockpit_diagnoses.exploding_gradients import growth_message
from cockpit_diagnoses.gsnr_collapse import gsnr_message
from cockpit_diagnoses.loss_plateau import plateau_wording
from cockpit_diagnoses.stability import stability_message
from cockpit_diagnoses.vanishing_gradients import vanishing_message

from cockpit_core.diagnosis import Window

SIGNED = re.compile(r"\b(by|to|grew|fell|rose|dropped|down) -\d")
"""A verb of change followed by a negative number: the wording this file rules out."""


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (2.0, 1.9, "fell by 5 %"),
        (2.0, 2.0112, "rose by 0.56 %"),
        (-2.0, -1.0, "rose by 50 %"),  # a negative loss (e.g. a log-likelihood) that rose
        (-2.0, -3.0, "fell by 50 %"),
        (0.0, 0.5, "rose"),
        (1.0, 1.0, "did not change"),
    ],
)
def test_change_by(start, end, expected):
    assert change_by(start, end) == expected


def test_change_factor_and_relation():
    assert change_factor(2.0, 0.1) == "fell to 0.05x"
    assert change_factor(2.0, 6.0) == "rose to 3x"
    assert change_factor(1.0, 120.0, up="grew") == "grew 120x"
    assert change_factor(1.0, 1.0) == "stayed at 1x"
    assert [relation(2, 1), relation(1, 2), relation(1, 1)] == [">", "<", "="]


def test_loss_plateau_wording_follows_the_sign():
    message, suggestion, advice = plateau_wording(2.0, 1.951, 50)
    assert message == "the loss fell by only 2.45 % over 50 tracked steps (trend 2 -> 1.951)"
    assert "raise the learning rate" in suggestion and advice == {"learning_rate": "up"}
    message, suggestion, advice = plateau_wording(2.0, 2.0112, 50)
    assert message == "the loss rose by 0.56 % over 50 tracked steps (trend 2 -> 2.011)"
    assert "do not raise the learning rate" in suggestion and advice == {}
    message, _, advice = plateau_wording(2.0, 2.0, 50)
    assert message.startswith("the loss did not change over 50") and advice == {}


@pytest.mark.parametrize(("slope", "verb"), [(-0.001, "fell by only"), (0.0002, "rose by")])
def test_the_loss_plateau_rule_says_rose_for_a_rising_loss(slope, verb):
    window = Window({s: {"loss": 2.0 + slope * s} for s in range(60)})
    (finding,) = LossPlateau().check(window)
    assert f"the loss {verb} " in finding.message and not SIGNED.search(finding.message)
    assert (finding.evidence["relative_decrease"] > 0) == (slope < 0)
    assert (finding.advice == {"learning_rate": "up"}) == (slope < 0)


def test_gsnr_wording_follows_the_sign():
    assert gsnr_message(0.2, 0.01).startswith("the mean GSNR fell to 0.05x its early value")
    assert gsnr_message(0.2, 0.4).startswith("the mean GSNR rose to 2x its early value")


def test_vanishing_wording_follows_the_sign():
    names = ["a", "b"]
    assert "(the furthest fell to 0.0005x): a, b" in vanishing_message(names, 1e-3, 5e-4)
    assert "(the furthest rose to 2x): a, b" in vanishing_message(names, 1e-3, 2.0)


def test_exploding_wording_follows_the_sign():
    assert growth_message(0.1, 12.0, 10) == (
        "the gradient norm grew 120x within 10 tracked steps (from 0.1 to 12)"
    )
    assert growth_message(12.0, 0.12, 10).startswith("the gradient norm fell to 0.01x within")


def test_stability_wording_follows_the_side_of_the_threshold():
    above = stability_message(5.0, 0.2, "2/lr", 30)
    assert above.startswith("lambda_max 5 is above the stability threshold 0.2 (2/lr)")
    assert above.endswith("the learning rate is too high for this curvature")
    below = stability_message(0.19, 0.2, "2/lr", 3)  # reported with margin 0.9
    assert below.startswith("lambda_max 0.19 is below, at 95 % of, the stability threshold")
    assert "above" not in below and "too high" not in below


def test_batch_size_wording_follows_the_comparison():
    assert "(median theta_max 1.2 > theta = 0.8)" in failing_message(
        "norm_test", "theta", 9, 1.2, 0.8
    )
    assert "(median theta_max 0.7 < theta = 0.8)" in failing_message(
        "norm_test", "theta", 4, 0.7, 0.8
    )


def _series(step, sign):
    """Values of every quantity the first-party rules read, moving the way ``sign`` says."""
    grow = float(np.exp(sign * 0.6 * step))
    return {
        "loss": 2.0 + sign * 0.0002 * step,
        "alpha": {"alpha": 0.5 * sign},
        "grad_norm": {"total": grow, "per_param": [grow, 1e-6 * grow]},
        "mean_gsnr": {"total": grow},
        "norm_test": {"total": 0.8 + sign * 0.4},
        "early_stopping": {"total": sign},
    }


@pytest.mark.parametrize("sign", [1, -1])
def test_no_first_party_message_puts_a_negative_number_after_a_verb_of_change(sign):
    window = Window({s: _series(s, sign) for s in range(60)}, header={"params": ["w", "b"]})
    messages = [
        f.message for cls in DIAGNOSES if cls().applies(window) for f in cls().check(window)
    ]
    assert messages  # the windows do trigger rules
    assert not [m for m in messages if SIGNED.search(m)]
