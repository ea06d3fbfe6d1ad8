"""logit_divergence: log Z of the output logits runs far from 0.

Trained: the tiny LM of ``_lm.py`` whose output layer (the tied token embedding) trains at
300x the learning rate from step 30 on. The healthy runs of the same model are in
``test_activation_blowup.py`` (one run per seed for both rules).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from cockpit_diagnoses import (
    ActivationBlowup,
    AttentionEntropyCollapse,
    AttentionLogitGrowth,
    LogitDivergence,
)
from cockpit_diagnoses.logit_divergence import divergence_message
from pydantic import ValidationError

from cockpit_core.diagnosing.run import diagnose, report_entries
from cockpit_core.diagnosis import Finding, Window
from cockpit_core.log import read_records

from ._lm import train_lm

HEAD_LR = (30, {"transformer.wte.weight": 300.0})
"""The output layer (tied to the token embedding) at 300x Adam's lr 3e-3 from step 30."""

SIGNED = re.compile(r"\b(by|to|grew|fell|rose|dropped|down) -\d")
"""A verb of change followed by a negative number (tests/diagnoses/test_wording.py)."""


def test_a_too_high_learning_rate_on_the_output_layer_drives_log_z_away():
    out, _ = train_lm(["logits"], steps=60, jump=HEAD_LR)
    (f,) = LogitDivergence().check(Window(out))
    log_z = np.array([out[s]["logits"]["log_z_mean"] for s in range(60)])
    early = float(np.median(log_z[:5]))
    flagged = (np.abs(log_z) > 30) & (np.abs(log_z) - abs(early) > 10)
    assert not flagged[:31].any()  # the update of step 30 is the first at the high lr
    assert (f.id, f.severity) == (f"logit_divergence@{f.first_step}", "warning")
    assert f.first_step == int(np.nonzero(flagged)[0][0]) and f.first_step <= 36
    steps = np.arange(f.first_step, f.last_step + 1)
    inside = log_z[steps][flagged[steps]]
    ev = f.evidence
    assert ev["early_log_z"] == pytest.approx(early, rel=1e-12) and 2 < early < 4
    assert ev["median_log_z"] == pytest.approx(np.median(inside), rel=1e-12)
    assert ev["farthest_log_z"] == pytest.approx(inside[np.argmax(np.abs(inside))], rel=1e-12)
    assert ev["steps_flagged"] == len(inside) >= 8
    for field in ("log_z_max", "max_logit"):
        logged = [out[s]["logits"][field] for s in steps]
        assert ev[field] == pytest.approx(max(logged), rel=1e-12)
    assert ev["z_loss"] == pytest.approx(np.median([out[s]["logits"]["z_loss"] for s in steps]))
    assert ev["max_logit"] <= ev["log_z_max"]  # log Z >= the largest logit, at every position
    assert f"the mean log Z of the output logits is {ev['farthest_log_z']:.4g}" in f.message
    assert "1e-4 * (log Z)^2" in f.suggestion
    assert f.advice == {"z_loss": "up", "learning_rate": "down"}


def test_while_training_the_divergence_is_a_finding_record(tmp_path):
    log = tmp_path / "log.jsonl"
    train_lm(["logits"], steps=45, jump=HEAD_LR, log=log, diagnoses=["logit_divergence"])
    found = [r for r in read_records(log) if r["kind"] == "finding"]
    assert found and {r["diagnosis"] for r in found} == {"logit_divergence"}
    assert found[-1]["advice"] == {"z_loss": "up", "learning_rate": "down"}


# -- synthetic windows ---------------------------------------------------------------------


def _window(log_z, **fields):
    """``logits`` values with ``log_z_mean = log_z(step)``, 40 steps."""
    out = {}
    for s in range(40):
        value = {"log_z_mean": log_z(s), "log_z_max": log_z(s) + 1.0, "max_logit": log_z(s) - 1.0}
        value["z_loss"] = 1e-4 * value["log_z_mean"] ** 2
        value.update({k: f(s) for k, f in fields.items()})
        out[s] = {"logits": value}
    return Window(out)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_log_z_far_from_zero_on_either_side(sign):
    (f,) = LogitDivergence().check(_window(lambda s: sign * (45.0 if s >= 20 else 3.0)))
    assert (f.first_step, f.last_step, f.evidence["steps_flagged"]) == (20, 39, 20)
    assert f.evidence["early_log_z"] == sign * 3.0
    assert f.evidence["farthest_log_z"] == f.evidence["median_log_z"] == sign * 45.0
    assert f.evidence["max_logit"] == sign * 45.0 - 1.0
    assert f.evidence["z_loss"] == pytest.approx(1e-4 * 45.0**2)
    assert f"is {sign * 45:.4g}, 42 nats farther from 0 than its early value {sign * 3:.4g}" in (
        f.message
    )
    assert not SIGNED.search(f.message)


def test_log_z_must_be_beyond_the_limit_and_have_drifted():
    # 45 from the start: far from 0, but it sat there (a model trained like that)
    assert LogitDivergence().check(_window(lambda s: 45.0)) == []
    # drifted 20 nats, but to 25: within the limit
    assert LogitDivergence().check(_window(lambda s: 25.0 if s >= 20 else 5.0)) == []
    assert LogitDivergence(limit=20).check(_window(lambda s: 25.0 if s >= 20 else 5.0))
    # 35 from an early 28: beyond the limit, but only 7 nats farther
    assert LogitDivergence().check(_window(lambda s: 35.0 if s >= 20 else 28.0)) == []
    assert LogitDivergence(drift=5).check(_window(lambda s: 35.0 if s >= 20 else 28.0))
    # from +20 across 0 to -35: 15 nats farther from 0 than it was
    (f,) = LogitDivergence().check(_window(lambda s: -35.0 if s >= 20 else 20.0))
    assert "15 nats farther from 0 than its early value 20" in f.message


def test_short_stretches_steps_before_start_and_non_finite_values():
    assert LogitDivergence().check(_window(lambda s: 45.0 if 20 <= s < 27 else 3.0)) == []
    (f,) = LogitDivergence().check(_window(lambda s: 45.0 if 20 <= s < 28 else 3.0))
    assert (f.first_step, f.last_step) == (20, 27)
    (f,) = LogitDivergence().check(_window(lambda s: 45.0 if s >= 5 else 3.0))
    assert f.first_step == 10
    gaps = _window(lambda s: math.nan if s % 5 == 0 else (45.0 if s >= 20 else 3.0))
    (f,) = LogitDivergence().check(gaps)
    assert f.evidence["steps_flagged"] == 16  # NaN steps are left out, not flagged
    no_extra = Window({s: {"logits": {"log_z_mean": 45.0 if s >= 20 else 3.0}} for s in range(40)})
    (f,) = LogitDivergence().check(no_extra)
    assert "max_logit" not in f.evidence and "the largest logit" not in f.message
    assert LogitDivergence().check(Window({})) == []
    assert not LogitDivergence().applies(Window({0: {"loss": 1.0}}))


def test_divergence_message_states_values_not_signed_changes():
    message = divergence_message(3.0, -60.0, -55.0)
    assert message.startswith("the mean log Z of the output logits is -60, 57 nats farther")
    assert "the largest logit is -55" in message and not SIGNED.search(message)


def test_logit_divergence_options_are_validated():
    with pytest.raises(ValidationError, match="limit"):
        LogitDivergence(limit=0)
    with pytest.raises(ValidationError, match="drift"):
        LogitDivergence(drift=-1)
    with pytest.raises(ValidationError, match="extra"):
        LogitDivergence(limits=20)


def test_a_plateau_does_not_raise_the_learning_rate_against_diverging_logits():
    # log Z runs away from step 10 while the loss falls by 2.5 % over 50 steps (a plateau)
    out = {
        s: {"loss": 2.0 - 0.001 * s, "logits": {"log_z_mean": 45.0 if s >= 10 else 3.0}}
        for s in range(60)
    }
    found = diagnose(out, names=["logit_divergence", "loss_plateau"])
    assert sorted(f.id for f in found) == ["logit_divergence@10", "loss_plateau@0"]
    (entry,) = report_entries(found)
    assert entry.head.id == "logit_divergence@10" and not entry.conflict
    (overruled,) = entry.overruled
    assert overruled.finding.id == "loss_plateau@0" and overruled.knob == "learning_rate"
    assert "run away" in overruled.because


@pytest.mark.parametrize(
    "cls", [AttentionLogitGrowth, AttentionEntropyCollapse, LogitDivergence, ActivationBlowup]
)
def test_each_runaway_rule_wins_the_learning_rate_over_a_plateau_or_a_short_step(cls):
    runaway = Finding(
        f"{cls.name}@5", cls.name, "warning", 5, 20, "m", advice={"learning_rate": "down"}
    )
    for name in ("loss_plateau", "step_size/undershoot"):
        up = Finding(
            f"{name}@0", name.split("/")[0], "info", 0, 30, "m", advice={"learning_rate": "up"}
        )
        (entry,) = report_entries([runaway, up], rules=cls.precedence)
        assert entry.head is runaway and [o.finding for o in entry.overruled] == [up]
