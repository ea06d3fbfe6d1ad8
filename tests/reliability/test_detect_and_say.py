"""Odd training loops get a clear warning or a skipped step, never silently wrong values."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from cockpit_backpack import extend

from cockpit_core import Cockpit, CockpitWarning
from cockpit_core.testing import tiny_mlp

FIRST_ORDER = ["grad_norm", "norm_test", "inner_test", "ortho_test"]


def train(cp, model, problem, steps=4, before=None, zero="none", batch_size=None, inside=None):
    """SGD on ``problem``; ``before(step)`` runs before each forward pass."""
    loss_fn = problem.loss_module()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        if before is not None:
            before(step)
        x, y = problem.batch(step)
        out = model(x)
        loss = loss_fn(out, y)
        losses = problem.individual_losses(out, y).detach()
        opt.zero_grad(set_to_none=zero == "none")
        info = {
            "loss": loss,
            "individual_losses": losses,
            "batch_size": batch_size or len(x),
            "optimizer": opt,
        }
        with cp(step, info=info):
            if inside is None or inside(step):
                loss.backward()
        opt.step()
    return cp.get_output()


# -- parameters frozen, unfrozen, reshaped, replaced ------------------------------------


@pytest.mark.parametrize("zero", ["none", "zeros"])
@pytest.mark.parametrize("path", ["hooks", "backpack"])
def test_a_frozen_parameter_warns_and_the_rest_is_described_exactly(path, zero):
    problem = tiny_mlp()
    model = problem.make_model()

    def freeze(step):
        if step == 2:
            model[0].weight.requires_grad_(False)

    cp = Cockpit(model if path == "hooks" else model.named_parameters(), FIRST_ORDER)
    with pytest.warns(
        CockpitWarning,
        match=r"Parameter\(s\) '0.weight' no longer require gradients at step 2 \(frozen\): "
        r"from now on quantities treat them as having a zero gradient \(a stale p.grad is "
        r"ignored\) and leave them out of per-sample statistics",
    ):
        out = train(cp, model, problem, before=freeze, zero=zero)
    assert not cp.errors and sorted(out) == [0, 1, 2, 3]

    # from step 2 on: the values of a Cockpit that tracks only the trainable parameters
    model2 = problem.make_model()
    cp2 = Cockpit([(n, p) for n, p in model2.named_parameters() if n != "0.weight"], FIRST_ORDER)
    if path == "hooks":
        cp2.attach(model2)

    def freeze2(step):
        if step == 2:
            model2[0].weight.requires_grad_(False)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CockpitWarning)  # its optimizer updates more
        reference = train(cp2, model2, problem, before=freeze2, zero=zero)
    for step in (2, 3):
        for key in FIRST_ORDER:
            assert out[step][key]["total"] == pytest.approx(reference[step][key]["total"], rel=1e-9)


def test_an_unfrozen_parameter_warns():
    problem = tiny_mlp()
    model = problem.make_model()

    def toggle(step):
        model[0].weight.requires_grad_(step != 1)

    cp = Cockpit(model.named_parameters(), ["grad_norm", "norm_test"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(cp, model, problem, steps=3, before=toggle)
    messages = [str(w.message) for w in caught if w.category is CockpitWarning]
    assert any("require gradients again at step 2 (unfrozen)" in m for m in messages)
    assert not cp.errors  # BackPACK observes every module: nothing lost


def test_a_parameter_that_changes_shape_warns_and_drops_pending_two_step_values():
    problem = tiny_mlp()
    model = problem.make_model()

    def grow(step):
        if step == 2:  # net surgery: the last layer gets a fourth class
            last = model[4]
            for p in last.parameters():
                p.grad = None
            with torch.no_grad():
                last.weight.set_(torch.cat([last.weight, last.weight[:1]]))
                last.bias.set_(torch.cat([last.bias, last.bias[:1]]))
            last.out_features = 4

    cp = Cockpit(model.named_parameters(), ["grad_norm", "update_size"])
    with pytest.warns(
        CockpitWarning,
        match=r"Parameter\(s\) changed shape at step 2 \('4.weight' \[3, 4\] -> \[4, 4\], "
        r"'4.bias' \[3\] -> \[4\]\): the two points of two-step quantities that started "
        r"before \(update_size, alpha, \.\.\.\) cannot be compared",
    ):
        out = train(cp, model, problem, steps=4, before=grow)
    assert "update_size" in out[0] and "update_size" not in out[1]  # 1 -> 2 was dropped
    assert "update_size" in out[2] and not cp.errors
    assert all("grad_norm" in out[s] for s in range(4))


def test_a_replaced_layer_warns():
    problem = tiny_mlp()
    model = problem.make_model()

    def replace(step):
        if step == 1:
            torch.manual_seed(5)
            model[4] = extend(torch.nn.Linear(4, 3).double())

    cp = Cockpit(model, ["grad_norm"])
    with pytest.warns(
        CockpitWarning,
        match=r"Parameter\(s\) '4.weight', '4.bias' are no longer part of the attached model "
        r"at step 1 \(a replaced layer\?\): they get no gradient",
    ):
        train(cp, model, problem, steps=2, before=replace)


# -- no backward, wrong batch size ---------------------------------------------------------


def test_a_block_without_backward_is_skipped_with_the_reason():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), ["loss", "grad_norm", "norm_test"])
    with pytest.warns(
        CockpitWarning,
        match=r"step 1 skipped: no tracked parameter received a gradient inside `with cp\(1, "
        r"\.\.\.\)`: backward\(\) was not called in the block \(or ran before it\)\. Call "
        r"loss.backward\(\) inside the block",
    ):
        out = train(cp, model, problem, steps=3, zero="zeros", inside=lambda step: step != 1)
    assert sorted(out) == [0, 2]
    (skipped,) = cp.skipped
    assert skipped["step"] == 1 and skipped["reason"].startswith("no backward: no tracked")
    assert skipped["quantities"] == ["grad_norm", "loss", "norm_test"]


@pytest.mark.parametrize("path", ["hooks", "backpack"])
def test_a_batch_size_that_disagrees_with_the_per_sample_statistics_warns(path):
    problem = tiny_mlp(batch_size=16)
    model = problem.make_model()
    cp = Cockpit(model if path == "hooks" else model.named_parameters(), ["norm_test"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(cp, model, problem, steps=1, batch_size=3)
    messages = " ".join(str(w.message) for w in caught if w.category is CockpitWarning)
    messages += " ".join(e["error"] for e in cp.errors)
    if path == "backpack":
        assert (
            "Per-sample statistics are scaled wrongly: info['batch_size'] is 3, but the "
            "per-sample gradients of '4.bias' average to p.grad / 5.33333, as if the "
            "mini-batch had 16 samples." in messages
        )
    else:  # the module hooks see 16 rows and refuse to guess
        assert "but the batch has 3 samples" in messages


# -- BatchNorm in training mode ----------------------------------------------------------


def _bn_model():
    torch.manual_seed(0)
    return extend(
        torch.nn.Sequential(
            torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 3)
        ).double()
    )


@pytest.mark.parametrize("attach", ["model", "model and loss"])
def test_check_does_not_say_ok_for_per_sample_quantities_on_training_batch_norm(attach):
    model = _bn_model()
    cp = Cockpit(model.named_parameters(), ["grad_norm", "norm_test"])
    if attach == "model and loss":  # torch.func could compute them: still not defined
        cp.attach(model, torch.nn.CrossEntropyLoss(reduction="none"))
    report = cp.check(model)
    rows = {r.quantity: r for r in report.rows}
    assert rows["grad_norm"].available
    assert not rows["norm_test"].available
    assert (
        "in training mode BatchNorm mixes the samples of a batch, so per-sample gradients are not defined"
        in str(report)
    )
    model.eval()
    cp2 = Cockpit(model.named_parameters(), ["norm_test"])
    assert cp2.check(model).ok  # in eval mode BatchNorm is an affine map per sample


def test_backpack_refuses_batch_norm_in_training_mode():
    from cockpit_backpack.provider import BackpackProvider

    from cockpit_core import BATCH_L2
    from cockpit_core.statistics.provider import ParamSlot

    model = _bn_model()
    provider = BackpackProvider(list(model.parameters()), [n for n, _ in model.named_parameters()])
    provider.attach(model)
    slot = ParamSlot(2, "1.weight", model[1].weight, model[1], "1", "weight")
    assert provider.supports(slot, BATCH_L2.kind) == (
        "in training mode BatchNorm mixes the samples of a batch, so per-sample gradients are "
        "not defined"
    )
    model.eval()
    assert provider.supports(slot, BATCH_L2.kind) is None


@pytest.mark.parametrize("attach", [True, False], ids=["model attached", "no model"])
def test_first_step_warns_about_batch_norm_in_training_mode(attach):
    problem = tiny_mlp(batch_size=8)
    model = _bn_model()
    cp = Cockpit(model.named_parameters(), ["grad_norm", "norm_test"], on_error="warn")
    if attach:
        cp.attach(model)
    with pytest.warns(
        CockpitWarning,
        match=r"BatchNorm module\(s\) '1' are in training mode while per-sample statistics are "
        r"tracked: in training mode BatchNorm mixes the samples of a batch",
    ):
        train(cp, model, problem, steps=1)


def test_no_batch_norm_warning_in_eval_mode_without_a_model():
    problem = tiny_mlp(batch_size=8)
    model = _bn_model().eval()
    cp = Cockpit(model.named_parameters(), ["grad_norm", "norm_test"], on_error="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(cp, model, problem, steps=1)
    assert not [w for w in caught if "BatchNorm" in str(w.message)]
    assert not cp.errors and "norm_test" in cp.get_output()[0]


def test_cockpit_check_reports_batch_norm_in_training_mode(tmp_path, capsys):
    from cockpit_core.cli.main import main

    factory = tmp_path / "bn_model.py"
    factory.write_text(
        "import torch\n\n\ndef make():\n    return torch.nn.Sequential(torch.nn.Linear(6, 4), "
        "torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 3))\n"
    )
    assert main(["check", f"{factory}:make", "--quantities", "grad_norm,norm_test"]) == 1
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["grad_norm", "ok", "no", "statistics", "beyond", "p.grad"]
    assert rows[1].split()[:2] == ["norm_test", "UNAVAILABLE"]
    assert (
        "BatchNorm module(s) '1': in training mode BatchNorm mixes the samples of a batch, so "
        "per-sample gradients are not defined" in rows[2]
    )


# -- gradient clipping ---------------------------------------------------------------------


def test_statistics_describe_the_unclipped_gradient_and_update_size_the_clipped_update():
    problem = tiny_mlp()
    results = {}
    for clip in (None, 1e-3, "value"):
        model = problem.make_model()
        loss_fn = problem.loss_module()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cp = Cockpit(model.named_parameters(), ["grad_norm", "update_size", "alpha", "norm_test"])
        for step in range(2):
            x, y = problem.batch(step)
            out = model(x)
            loss = loss_fn(out, y)
            losses = problem.individual_losses(out, y).detach()
            opt.zero_grad()
            with cp(step, info={"loss": loss, "individual_losses": losses, "optimizer": opt}):
                loss.backward()
            if clip == "value":
                torch.nn.utils.clip_grad_value_(model.parameters(), 1e-3)
            elif clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
        results[clip] = cp.get_output()
    plain, clipped = results[None], results[1e-3]
    # the gradient of backward, before clipping: equal at the first step
    assert clipped[0]["grad_norm"]["total"] == pytest.approx(plain[0]["grad_norm"]["total"])
    assert clipped[0]["norm_test"]["total"] == pytest.approx(plain[0]["norm_test"]["total"])
    # the real update: lr * clip (clip_grad_norm_ divides by the norm + 1e-6)
    assert clipped[0]["update_size"]["total"] == pytest.approx(0.1 * 1e-3, rel=1e-4)
    assert plain[0]["update_size"]["total"] == pytest.approx(0.1 * plain[0]["grad_norm"]["total"])
    # alpha fits along the real (clipped) step; norm clipping keeps the direction of
    # -lr * g, so the SGD prediction still spans it exactly
    assert clipped[0]["alpha"]["step_length"] == pytest.approx(1e-4, rel=1e-4)
    assert clipped[0]["alpha"]["exact"] is True
    assert math.isfinite(clipped[0]["alpha"]["alpha"])
    # value clipping turns the update: no longer in the span, a diagonal approximation
    assert results["value"][0]["alpha"]["exact"] is False
