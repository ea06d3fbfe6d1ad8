"""stability: lambda_max above (2 + 2 beta) / lr fires; a stable learning rate does not."""

import pytest
from cockpit_diagnoses import Stability

from cockpit_core.diagnosis import Window

QUANTITIES = [{"name": "hess_max_ev", "tol": 1e-3}, "optimizer_hparams"]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_lr_far_too_high_is_above_the_threshold_within_5_steps(run, momentum):
    lr = 10.0
    out = run(QUANTITIES, steps=8, lr=lr, momentum=momentum)
    found = Stability().check(Window(out))
    assert found and found[0].first_step <= 4
    f = found[0]
    # Cohen et al. (2021): heavy ball is stable iff lambda_max < (2 + 2 beta) / lr
    assert f.evidence["threshold"] == pytest.approx((2 + 2 * momentum) / lr, rel=1e-12)
    assert f.evidence["lr"] == lr
    assert f.evidence["formula"] == ("2/lr" if momentum == 0 else "2(1+beta)/lr")
    flagged = [out[s]["hess_max_ev"]["value"] for s in out if f.first_step <= s <= f.last_step]
    assert f.evidence["lambda_max"] == max(flagged) >= f.evidence["threshold"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_stable_learning_rate_gives_no_stability_finding(run, seed):
    out = run(QUANTITIES, steps=8, lr=0.3, seed=seed)
    assert Stability().check(Window(out)) == []


def test_no_threshold_without_sgd():
    out = {
        s: {
            "hess_max_ev": {"value": 100.0},
            "optimizer_hparams": {"optimizer": "Adam", "groups": [{"lr": 1.0}]},
        }
        for s in range(5)
    }
    assert Stability().check(Window(out)) == []
    assert not Stability().applies(Window({0: {"hess_max_ev": {"value": 1.0}}}))
