"""dead_layers, exploding_gradients (and vanishing_gradients), from grad_norm's norms."""

import pytest
import torch
from cockpit_diagnoses import DeadLayers, ExplodingGradients, VanishingGradients

from cockpit_core.diagnosis import Window
from cockpit_core.log import read_records


def _header(model):
    return {"params": [{"name": n} for n, _ in model.named_parameters()]}


def test_a_layer_multiplied_by_zero_is_dead_within_5_steps(run, kit):
    out = run(["grad_norm"], steps=10, lr=0.3, dead=True)
    (f,) = DeadLayers().check(Window(out, header=_header(kit.make_model(0, dead=True))))
    assert f.first_step == 0 and f.last_step == 9
    # brute force: which gradients autograd gives as exactly zero on one batch
    model = kit.make_model(0, dead=True)
    x, y = kit.make_data(0)
    kit.per_sample_losses("classify", model(x[:32]), y[:32]).mean().backward()
    zero = {n for n, p in model.named_parameters() if torch.count_nonzero(p.grad) == 0}
    assert set(f.evidence["parameters"]) == zero == {"0.weight", "0.bias", "3.weight"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_healthy_model_has_no_dead_layer_no_explosion_no_vanishing(run, seed):
    out = run(["grad_norm"], steps=30, lr=0.3, seed=seed)
    assert DeadLayers().check(Window(out)) == []
    assert ExplodingGradients().check(Window(out)) == []
    assert VanishingGradients().check(Window(out)) == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_diverging_regression_explodes_within_10_steps(run, seed):
    out = run(["grad_norm"], steps=15, lr=1.0, task="regress", seed=seed)
    found = ExplodingGradients().check(Window(out))
    assert found and found[0].first_step <= 10
    f = found[0]
    norms = [out[s]["grad_norm"]["total"] for s in sorted(out)]
    i = sorted(out).index(f.first_step)
    past = [n for n in norms[max(0, i - 9) : i] if n > 0]
    assert f.evidence["growth"] == pytest.approx(norms[i] / min(past), rel=1e-12)
    assert f.evidence["growth"] >= 100


def test_online_the_dead_layer_is_a_finding_record_after_5_steps(run, tmp_path):
    log = tmp_path / "log.jsonl"
    run(["grad_norm"], steps=8, lr=0.3, dead=True, log=log, diagnoses=["dead_layers"])
    records = read_records(log)
    finding, final = [r for r in records if r["kind"] == "finding"]
    assert (finding["id"], finding["last_step"]) == ("dead_layers@0", 4)
    assert (final["id"], final["last_step"]) == ("dead_layers@0", 7)  # at close: whole stretch
    # reported right after the values of the 5th tracked step, once
    before = [r["step"] for r in records[: records.index(finding)] if r["kind"] == "values"]
    assert before[-1] == 4
    assert finding["evidence"]["parameters"] == ["0.weight", "0.bias", "3.weight"]
