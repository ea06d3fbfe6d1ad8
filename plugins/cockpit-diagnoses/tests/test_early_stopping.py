"""early_stopping: a model that has learned all there is gives a positive mean criterion."""

import numpy as np
import pytest
from cockpit_diagnoses import EarlyStopping

from cockpit_core.diagnosis import Window


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nothing_left_to_learn_fires_within_60_steps(run, seed):
    # targets independent of the inputs: after a few steps only noise is left to fit
    out = run(["early_stopping"], steps=60, lr=0.05, task="noise", seed=seed)
    found = EarlyStopping().check(Window(out))
    assert found and found[0].last_step < 60 and found[0].severity == "info"
    values = np.array([out[s]["early_stopping"]["total"] for s in sorted(out)])
    means = np.array([values[i : i + 10].mean() for i in range(len(values) - 9)])
    assert found[0].evidence["largest_mean_criterion"] <= means.max() + 1e-12
    assert found[0].first_step == int(np.nonzero(means > 0)[0][0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_run_still_learning_gives_no_early_stopping_finding(run, seed):
    out = run(["early_stopping"], steps=30, lr=0.3, seed=seed)
    assert EarlyStopping().check(Window(out)) == []
