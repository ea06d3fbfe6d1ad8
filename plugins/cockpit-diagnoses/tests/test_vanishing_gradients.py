"""vanishing_gradients: weight decay on a noise task shrinks the gradients of the inner layers."""

import numpy as np
import pytest
from cockpit_diagnoses import VanishingGradients

from cockpit_core.diagnosis import Window


def _header(kit):
    return {"params": [{"name": n} for n, _ in kit.make_model(0, 1).named_parameters()]}


def test_weight_decay_on_noise_makes_the_inner_gradients_vanish_within_30_steps(run, kit):
    # nothing to learn: SGD with lr 0.3 and weight decay 1 shrinks every weight by 0.7 per
    # step, and the gradients that flow through the last layer's weight shrink with it
    out = run(["grad_norm"], steps=40, lr=0.3, weight_decay=1.0, task="noise")
    found = VanishingGradients().check(Window(out, header=_header(kit)))
    assert found and found[0].first_step <= 30
    assert all(f.severity == "warning" and f.last_step == 39 for f in found)
    steps = np.array(sorted(out))
    norms = np.array([out[s]["grad_norm"]["per_param"] for s in steps], dtype=np.float64)
    reference = np.median(norms[:5], axis=0)  # brute force: the rule's definition
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    reported = {}
    for f in found:
        inside = (steps >= f.first_step) & (steps <= f.last_step)
        for name, got in f.evidence["parameters"].items():
            i = names.index(name)
            assert got["reference"] == pytest.approx(reference[i], rel=1e-12)
            assert got["median"] == pytest.approx(np.median(norms[inside, i]), rel=1e-12)
            assert got["median"] < 1e-3 * got["reference"]
            reported[name] = f.first_step
    # the output bias keeps the gradient of the noise's mean; the others vanish
    assert set(reported) == {"0.weight", "0.bias", "2.weight"}


# healthy runs (three seeds): test_gradients.py::test_a_healthy_model_has_no_dead_layer...


def test_a_dead_parameter_is_left_to_dead_layers():
    out = {s: {"grad_norm": {"total": 1.0, "per_param": [0.0, 1.0]}} for s in range(20)}
    assert VanishingGradients().check(Window(out)) == []
