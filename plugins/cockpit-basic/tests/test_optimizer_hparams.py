"""optimizer_hparams: what the optimizer was configured with at each step."""

import pytest
import torch
from cockpit_basic import OptimizerHparams

from cockpit_core import Cockpit
from cockpit_core.testing import check_quantity, run_cockpit, tiny_mlp


def test_protocol():
    check_quantity(OptimizerHparams)


def test_sgd_with_momentum_as_configured():
    # the kit's "sgd_momentum": SGD(lr=0.05, momentum=0.9, weight_decay=1e-3)
    result = run_cockpit(tiny_mlp(), [OptimizerHparams()], steps=2, optimizer="sgd_momentum")
    for step in (0, 1):
        value = result.output[step]["optimizer_hparams"]
        assert value["optimizer"] == "SGD"
        (group,) = value["groups"]
        expected = {"lr": 0.05, "momentum": 0.9, "dampening": 0, "weight_decay": 1e-3}
        assert {k: group[k] for k in expected} == expected
        assert group["nesterov"] is False and group["maximize"] is False
        assert not {"params", "foreach", "fused", "capturable", "differentiable"} & set(group)


def test_adam_records_its_betas():
    result = run_cockpit(tiny_mlp(), [OptimizerHparams()], steps=1, optimizer="adam")
    value = result.output[0]["optimizer_hparams"]
    assert value["optimizer"] == "Adam"
    assert value["groups"][0]["lr"] == 0.01
    assert value["groups"][0]["betas"] == [0.9, 0.999]


def test_only_groups_with_tracked_parameters_and_the_lr_of_each_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(
        [
            {"params": model[0].parameters(), "lr": 0.1},
            {"params": model[1].parameters(), "lr": torch.tensor(0.25), "momentum": 0.5},
        ]
    )  # a tensor lr is allowed: it is logged as a float
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    cp = Cockpit(model[1].named_parameters(), [OptimizerHparams()])
    x = torch.randn(5, 3)
    for step in range(3):
        opt.zero_grad()
        loss = model(x).square().mean()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
        schedule.step()
    for step in range(3):
        (group,) = cp.get_output()[step]["optimizer_hparams"]["groups"]
        assert isinstance(group["lr"], float)
        assert group["lr"] == pytest.approx(0.25 * 0.5**step, rel=1e-15)  # exact in float32
        assert group["momentum"] == 0.5 and group["initial_lr"] == 0.25


def test_without_an_optimizer_in_info_nothing_is_recorded_and_nothing_is_required():
    from cockpit_core import Cockpit

    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.parameters(), ["loss", "optimizer_hparams"], on_error="raise")
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y)
    with cp(0, info={"loss": loss, "batch_size": len(x)}):  # no optimizer: no MissingInfoError
        loss.backward()
    assert "optimizer_hparams" not in cp.get_output()[0]
    assert cp.get_output()[0]["loss"] == loss.item()
