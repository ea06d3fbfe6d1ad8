"""Misuse gets a clear error or warning that says what to do."""

import warnings

import pytest
import torch

from cockpit_core import Cockpit, CockpitWarning, MisuseError
from cockpit_core.testing import tiny_mlp


def setup():
    problem = tiny_mlp()
    model = problem.make_model()
    x, y = problem.batch(0)
    out = model(x)
    return problem, model, out, y


def test_context_entered_twice_for_one_step():
    model = torch.nn.Linear(2, 1)
    cp = Cockpit(model.parameters(), ["loss"])
    info = {"loss": torch.tensor(0.5)}
    with cp(0, info=info):
        pass
    with pytest.raises(MisuseError, match="step 0 comes after step 0: steps must increase"):
        with cp(0, info=info):
            pass


def test_steps_going_backwards():
    model = torch.nn.Linear(2, 1)
    cp = Cockpit(model.parameters(), ["loss"])
    with cp(10, info={"loss": torch.tensor(0.5)}):
        pass
    with pytest.raises(
        MisuseError, match="global iteration counter, not the epoch-local batch index"
    ):
        with cp(3, info={"loss": torch.tensor(0.5)}):
            pass


def test_parameters_without_requires_grad():
    model = torch.nn.Linear(2, 1)
    model.weight.requires_grad_(False)
    with pytest.raises(
        MisuseError, match=r"parameters \['weight'\] do not require gradients.*requires_grad\]"
    ):
        Cockpit(model.named_parameters(), ["loss"])


def test_optimizer_with_other_parameters_warns():
    problem, model, out, y = setup()
    other = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(list(model.parameters())[:2] + list(other.parameters()), lr=0.1)
    cp = Cockpit(model.named_parameters(), ["loss"])
    loss = problem.loss_module()(out, y)
    with pytest.warns(
        CockpitWarning,
        match="updates 2 parameter\\(s\\) the Cockpit does not track and does not update 4",
    ):
        with cp(0, info={"loss": loss, "optimizer": opt}):
            loss.backward()


def test_tracking_a_subset_of_the_optimizers_parameters_is_fine():
    problem, model, out, y = setup()
    extra = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD([*model.parameters(), *extra.parameters()], lr=0.1)
    cp = Cockpit(model.named_parameters(), ["loss"])
    loss = problem.loss_module()(out, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)
        with cp(0, info={"loss": loss, "optimizer": opt}):
            loss.backward()


def test_sum_reduction_warns():
    problem, model, out, y = setup()
    losses = problem.individual_losses(out, y)
    loss = losses.sum()
    cp = Cockpit(model.named_parameters(), ["loss"])
    with pytest.warns(CockpitWarning, match="reduction='mean'"):
        with cp(0, info={"loss": loss, "individual_losses": losses.detach()}):
            loss.backward()


def test_bad_step_type():
    cp = Cockpit(torch.nn.Linear(2, 1).parameters(), ["loss"])
    with pytest.raises(MisuseError, match="step must be an integer, got 1.5"):
        with cp(1.5, info={"loss": torch.tensor(1.0)}):
            pass


def test_unwritable_log_path_is_a_config_error(tmp_path):
    from cockpit_core import ConfigError

    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="log: cannot open the log file"):
        Cockpit(torch.nn.Linear(2, 1).parameters(), ["loss"], log=tmp_path / "file" / "log.jsonl")
