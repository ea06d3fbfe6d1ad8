"""activation_blowup: a module's output grows far above its running median.

Trained: the tiny LM of ``_lm.py`` whose first MLP input layer trains at 300x the learning
rate from step 40 on. The healthy runs here serve ``logit_divergence`` too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cockpit_diagnoses import ActivationBlowup, LogitDivergence
from pydantic import ValidationError

from cockpit_core.diagnosis import Window

from ._lm import train_lm

FC = "transformer.h.0.mlp.c_fc"
FC_LR = (40, {f"{FC}.weight": 300.0})
"""Block 0's MLP input layer at 300x Adam's lr 3e-3 from step 40."""


def _running_factor(values, i, trailing=50):
    """``values[i]`` over the median of the ``trailing`` values before it."""
    return values[i] / np.median(values[max(0, i - trailing) : i])


def test_a_too_high_learning_rate_on_one_layer_blows_up_its_outputs_and_names_it():
    out, _ = train_lm(["activations"], steps=70, jump=FC_LR)
    (f,) = ActivationBlowup().check(Window(out))
    assert f.severity == "warning" and 41 <= f.first_step <= 50
    rows = f.evidence["modules"]
    modules = list(out[0]["activations"]["modules"])
    # the layer itself is named first, then what inherits its outputs, in forward order
    assert rows[0]["module"] == FC and f"(first in forward order {FC}: " in f.message
    assert [modules.index(r["module"]) for r in rows] == sorted(
        modules.index(r["module"]) for r in rows
    )
    for row in rows:
        k = modules.index(row["module"])
        values = np.array([out[s]["activations"][row["field"]][k] for s in range(70)])
        assert row["value"] == pytest.approx(values[row["step"]], rel=1e-12)
        assert row["factor"] == pytest.approx(_running_factor(values, row["step"]), rel=1e-12)
        assert row["factor"] >= 10 and row["first_step"] >= 41
    assert f.advice == {"learning_rate": "down"} and f"Look at {FC} first" in f.suggestion


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_runs_blow_up_nothing_and_keep_log_z(seed):
    out, _ = train_lm(["logits", "activations"], steps=80, seed=seed)
    window = Window(out)
    assert ActivationBlowup().check(window) == []
    assert LogitDivergence().check(window) == []


# -- synthetic windows ---------------------------------------------------------------------

MODULES = ["block.0.fc", "block.0", "block.1.fc", "block.1"]


def _window(sizes, steps=60, modules=MODULES):
    """``activations`` values: ``sizes[field](step)`` is the ``[modules]`` array of a step."""
    out = {}
    for s in range(steps):
        value = {"modules": list(modules)}
        for field in ("rms", "amax", "zero_frac"):
            value[field] = sizes.get(field, lambda s: np.ones(len(modules)))(s)
        out[s] = {"activations": value}
    return Window(out)


def jump(k, at, factor, field_size=1.0, n=len(MODULES)):
    """Module ``k``'s size multiplied by ``factor`` from step ``at`` on."""

    def sizes(s):
        row = np.full(n, field_size)
        if s >= at:
            row[k] *= factor
        return row

    return sizes


def test_a_jump_of_one_module_is_named_with_its_running_median():
    (f,) = ActivationBlowup().check(_window({"rms": jump(2, 30, 12.0)}))
    assert (f.id, f.first_step) == ("activation_blowup@30", 30)
    (row,) = f.evidence["modules"]
    # the running median catches up once half of the 50-step window is at the new size
    assert (row["module"], row["field"], row["factor"], row["median"]) == (
        "block.1.fc",
        "rms",
        12.0,
        1.0,
    )
    assert row["last_step"] == 54 and row["steps_flagged"] == 25
    assert "rms 12x its running median 1 at step 30" in f.message


def test_a_steady_growth_is_not_a_blowup_but_a_fast_one_is():
    # 3 % per step: the value is 1.03^25 ~ 2.1 times the median of the 50 steps before
    steady = _window({"rms": lambda s: np.full(4, 1.03**s)}, steps=120)
    assert ActivationBlowup().check(steady) == []
    fast = _window({"amax": lambda s: np.full(4, 1.3 ** max(0, s - 30))}, steps=60)
    (f,) = ActivationBlowup().check(fast)
    assert [r["module"] for r in f.evidence["modules"]] == MODULES  # forward order
    assert {r["field"] for r in f.evidence["modules"]} == {"amax"}
    assert f.first_step == 30 + math.ceil(math.log(10) / math.log(1.3)) == 39


def test_modules_whose_stretches_overlap_are_one_finding_in_forward_order():
    sizes = {"rms": lambda s: jump(3, 30, 20.0)(s) * jump(0, 35, 15.0)(s)}
    (f,) = ActivationBlowup().check(_window(sizes))
    assert [r["module"] for r in f.evidence["modules"]] == ["block.0.fc", "block.1"]
    assert f.first_step == 30 and "activations of 2 module(s)" in f.message
    assert "first in forward order block.0.fc: rms 15x" in f.message


def test_persistence_start_and_too_short_a_history():
    blip = {"rms": lambda s: jump(0, 30, 50.0)(s) if s < 33 else np.ones(4)}
    assert ActivationBlowup().check(_window(blip)) == []  # 3 steps: no blow-up
    four = {"rms": lambda s: jump(0, 30, 50.0)(s) if s < 34 else np.ones(4)}
    assert ActivationBlowup().check(_window(four))  # 4 of 5
    # from step 5 on: by step 10, the first judged, half of the 10 steps before are at 50
    early = _window({"rms": jump(0, 5, 50.0)})
    assert ActivationBlowup().check(early) == []
    (f,) = ActivationBlowup(min_trailing=5, start=0).check(early)
    assert (f.first_step, f.last_step) == (5, 9)


def test_zero_and_non_finite_sizes_are_not_judged():
    zeros = _window({"rms": lambda s: np.array([0.0 if s < 30 else 5.0, 1.0, 1.0, 1.0])})
    assert ActivationBlowup().check(zeros) == []  # a running median of 0 gives no factor
    nans = _window({"amax": lambda s: np.array([math.nan, math.inf, 1.0, 1.0])})
    assert ActivationBlowup().check(nans) == []
    ragged = _window({"rms": lambda s: np.ones(3)})  # a value per module is missing
    assert ActivationBlowup().check(ragged) == []
    lists = Window(
        {
            s: {"activations": {"modules": ["a"], "rms": [20.0 if s >= 30 else 1.0], "amax": [1.0]}}
            for s in range(40)
        }
    )
    (f,) = ActivationBlowup().check(lists)  # as read back from a log: lists
    assert f.evidence["modules"][0]["module"] == "a"
    assert ActivationBlowup().check(Window({})) == []
    assert not ActivationBlowup().applies(Window({0: {"loss": 1.0}}))


def test_activation_blowup_options_are_validated():
    with pytest.raises(ValidationError, match="min_trailing"):
        ActivationBlowup(trailing=5, min_trailing=10)
    with pytest.raises(ValidationError, match="growth"):
        ActivationBlowup(growth=1.0)
    with pytest.raises(ValidationError, match="extra"):
        ActivationBlowup(grwoth=5)
