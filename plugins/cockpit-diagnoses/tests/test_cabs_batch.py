"""cabs_batch: CABS' suggested batch against the batch in use."""

import numpy as np
import pytest
from cockpit_diagnoses import CABSBatch

from cockpit_core.diagnosis import Window


def test_a_batch_of_2_is_too_small_for_lr_0_3_on_regression(run):
    # squared error: tr(Sigma) is about 4 L E||grad f||^2, so CABS = lr tr(Sigma) / L
    # stays near 4 lr E||grad f||^2, far above 2 for this model
    out = run(["cabs"], steps=15, lr=0.3, batch=2, task="regress")
    (f,) = CABSBatch(batch_size=2).check(Window(out))
    assert f.first_step <= 5 and f.severity == "warning"
    steps = np.array(sorted(out))
    cabs = np.array([out[s]["cabs"]["total"] for s in steps])
    median = np.median(cabs[(steps >= f.first_step) & (steps <= f.last_step)])
    assert f.evidence["median_cabs"] == pytest.approx(median, rel=1e-12)
    assert f.evidence["ratio"] == pytest.approx(median / 2, rel=1e-12) and median > 8


def test_the_batch_size_can_come_from_cp_log():
    out = {s: {"cabs": {"total": 40.0}} for s in range(12)}
    out[0]["metrics"] = {"batch_size": 8}
    out[6]["metrics"] = {"batch_size": 16}  # 40 / 16 < 4: from step 6 on the batch is fine
    (f,) = CABSBatch(window=5, fraction=1.0).check(Window(out))
    assert (f.first_step, f.last_step) == (0, 5) and f.evidence["batch_size"] == 8
    assert not CABSBatch().applies(Window({0: {"cabs": {"total": 1.0}}}))  # no batch size


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_large_batch_gives_no_finding(run, seed):
    out = run(["cabs"], steps=15, lr=0.3, batch=128, task="regress", seed=seed)
    assert CABSBatch(batch_size=128).check(Window(out)) == []
