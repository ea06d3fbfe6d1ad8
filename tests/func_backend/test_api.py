"""Options, errors and coverage reports of the any-model path (cp.attach, backend, chunk_size)."""

from __future__ import annotations

import pytest
import torch

from cockpit_core import Cockpit, CockpitWarning, ConfigError, MissingInfoError, MisuseError
from cockpit_core.testing import tiny_mlp
from cockpit_core.testing.transformer import tiny_transformer

from ._helpers import FIRST_ORDER, assert_close, train


def _step(cp, model, x, y, info_keys=("loss", "batch_size", "inputs", "targets")):
    out = model(x)
    loss = torch.nn.functional.cross_entropy(out, y)
    info = {"loss": loss, "batch_size": len(x), "inputs": x, "targets": y}
    with cp(0, info={k: info[k] for k in info_keys}):
        loss.backward()


def test_backend_func_without_attach_says_to_call_attach():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), ["norm_test"], backend="func")
    with pytest.raises(MisuseError, match=r"call cp.attach\(model, loss_fn\)"):
        _step(cp, model, *problem.batch(0))


def test_func_path_without_inputs_says_which_info_is_missing():
    problem = tiny_transformer(extended=False)
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), ["norm_test"], backend="func")
    cp.attach(model, problem.individual_losses)
    with pytest.raises(MissingInfoError, match=r"info=\{'inputs': x, 'targets': y"):
        _step(cp, model, *problem.batch(0), info_keys=("loss", "batch_size"))


def test_inputs_of_another_size_than_the_batch_are_rejected():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), ["norm_test"], backend="func")
    cp.attach(model, problem.individual_losses)
    x, y = problem.batch(0)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    with pytest.raises(MisuseError, match="holds 4 samples but the batch size is 8"):
        with cp(0, info={"loss": loss, "batch_size": 8, "inputs": x[:4], "targets": y[:4]}):
            loss.backward()


def test_settings_are_validated_with_field_paths():
    model = tiny_mlp().make_model()
    with pytest.raises(ConfigError, match="backend"):
        Cockpit(model.named_parameters(), ["loss"], backend="jax")
    with pytest.raises(ConfigError, match="chunk_size"):
        Cockpit(model.named_parameters(), ["loss"], chunk_size=0)
    cp = Cockpit.from_config({"backend": "func", "chunk_size": 2}, model.named_parameters())
    assert cp._router.order == ["func"] and cp._router.providers["func"].chunk_size == 2


def test_attach_rejects_a_model_that_does_not_own_the_parameters():
    a, b = tiny_mlp().make_model(), tiny_mlp().make_model()
    cp = Cockpit(a.named_parameters(), ["loss"])
    with pytest.raises(MisuseError, match="does not own the tracked parameter"):
        cp.attach(b, torch.nn.CrossEntropyLoss(reduction="none"))


def test_a_mean_reduced_loss_module_gives_the_same_statistics():
    """A mean-reduced loss on a batch of one sample is that sample's loss."""
    problem = tiny_mlp()
    model = problem.make_model()
    values = []
    for loss_fn in (torch.nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss(reduction="none")):
        cp = Cockpit(model.named_parameters(), ["norm_test"], backend="func")
        cp.attach(model, loss_fn)
        model.zero_grad()
        _step(cp, model, *problem.batch(0))
        values.append(cp.get_output()[0]["norm_test"])
    assert_close(values[0], values[1], rtol=1e-14, atol=0)


def test_check_reports_how_each_quantity_is_computed():
    problem = tiny_transformer(extended=True)
    model = problem.make_model()
    quantities = ["norm_test", "hess_max_ev", "tic_diag", "hess_trace"]
    cp = Cockpit(model.named_parameters(), quantities)
    rows = {r.quantity: r for r in cp.check(model).rows}  # attaches the model, without a loss
    assert rows["norm_test"].available  # module hooks serve every parameter, 'pos' included
    assert rows["norm_test"].how == "hooks"
    assert rows["hess_max_ev"].why == ""  # attached: attention runs in the math kernel
    if "autodiff" in cp.registry.providers:  # exact diagonals need the loss
        assert not rows["tic_diag"].available
        assert "autodiff: needs the model and a per-sample loss" in rows["tic_diag"].why

    cp.attach(model, problem.individual_losses, math_attention=False)
    rows = {r.quantity: r for r in cp.check(model).rows}
    assert "sdpa_kernel" in rows["hess_max_ev"].why  # no math attention: a caveat

    cp.attach(model, problem.individual_losses)
    report = cp.check(model)
    rows = {r.quantity: r for r in report.rows}
    assert rows["norm_test"].available and rows["norm_test"].how == "hooks"
    assert rows["hess_max_ev"].available and rows["hess_max_ev"].why == ""
    assert "hooks (captured where TinyTransformer.forward broadcasts it): parameter(s) 'pos'" in (
        str(report)
    )
    if "autodiff" in cp.registry.providers:  # cockpit-autodiff: exact diagonals of any model
        assert rows["hess_trace"].available and rows["hess_trace"].how == "autodiff"
        assert rows["tic_diag"].available
        assert rows["tic_diag"].how == "hooks, autodiff"
        assert "batch_l2, sum_grad_squared: hooks; diag_hessian: autodiff" in str(report)
        return
    for name in ("tic_diag", "hess_trace"):  # exact second-order diagonals: BackPACK only
        assert not rows[name].available
        assert "DiagHessian does not support" in rows[name].why
        assert "method='hutchinson'" in rows[name].hint
        assert "pip install" not in rows[name].why  # BackPACK is installed
    assert "hint: " in str(report)


def test_func_failure_is_reported_and_training_goes_on():
    """BatchNorm in training mode has no per-sample gradients: the quantity fails, not the run."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    ).double()
    cp = Cockpit(model.named_parameters(), ["norm_test", "loss"], backend="func")
    cp.attach(model, torch.nn.CrossEntropyLoss(reduction="none"))
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randint(0, 2, (6,))
    with pytest.warns(CockpitWarning, match="torch.func could not compute per-sample gradients"):
        _step(cp, model, x, y)
    assert "loss" in cp.get_output()[0] and "norm_test" not in cp.get_output()[0]
    assert "BatchNorm" in cp.errors[0]["error"]


def test_all_first_order_quantities_run_without_extend_and_without_errors():
    cp = train(tiny_transformer(extended=False), list(FIRST_ORDER), steps=2, backend="auto")
    assert set(cp.get_output()[0]) == set(FIRST_ORDER) and not cp.errors
