"""Model coverage before training (`cp.check`, `cockpit check`) and silent BackPACK skips."""

import re
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from cockpit_backpack import extend

from cockpit_core import (
    BATCH_L2,
    DIAG_HESSIAN,
    Cockpit,
    CockpitWarning,
    Quantity,
    Requirements,
)
from cockpit_core.cli.main import main


class NeedsL2(Quantity):
    name = "needs_l2"
    REQUIREMENTS = Requirements(statistics=(BATCH_L2,))

    def compute(self, ctx):
        return float(sum(t.sum() for t in ctx.stat(BATCH_L2)))


class NeedsDiagH(Quantity):
    name = "needs_diag_h"
    REQUIREMENTS = Requirements(statistics=(DIAG_HESSIAN,))

    def compute(self, ctx):
        return 0.0


class NeedsHvp(Quantity):
    name = "needs_hvp"
    REQUIREMENTS = Requirements(info={"loss"}, loss_graph=True)

    def compute(self, ctx):
        return 0.0


def layernorm_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.GELU(), torch.nn.Linear(4, 2)
    )


def test_check_lists_per_quantity_how_and_why():
    model = layernorm_model()
    cp = Cockpit(model.named_parameters(), [NeedsL2(), NeedsDiagH(), NeedsHvp(), "loss"])
    report = cp.check(model)
    rows = {r.quantity: r for r in report.rows}
    assert not report.ok
    assert rows["needs_l2"].available and rows["needs_l2"].how == "hooks"
    autodiff = (  # cockpit-autodiff serves any model, once a per-sample loss is attached
        "; autodiff: needs the model and a per-sample loss: call cp.attach(model, loss_fn)"
        if "autodiff" in cp.registry.providers
        else ""
    )
    assert rows["needs_diag_h"].why == (
        "No installed provider computes diag_hessian for all 6 parameters (backpack: BackPACK "
        f"DiagHessian does not support '1' (LayerNorm), '2' (GELU){autodiff})."
    )
    assert (
        rows["needs_hvp"].available and rows["needs_hvp"].how == "autograd Hessian-vector products"
    )
    assert rows["loss"].available and rows["loss"].how == "no statistics beyond p.grad"
    text = str(report)
    assert "needs_l2" in text and "UNAVAILABLE" in text
    assert "  batch_l2: hooks; diag_hessian: none: all 6 parameters" in text


def test_check_says_why_backpack_cannot_serve_a_parameter():
    model = layernorm_model()
    extend(model[0])
    cp = Cockpit(model.named_parameters(), [NeedsL2()], backend="backpack")
    row = cp.check(model).rows[0]
    assert not row.available
    assert row.why == (
        "No installed provider computes batch_l2 for parameter(s) '1.weight', '1.bias' "
        "(backpack: BackPACK BatchGrad does not support LayerNorm); parameter(s) "
        "'3.weight', '3.bias' (backpack: the module is not extended "
        "(cockpit_backpack.extend(model)))."
    )


def test_check_on_a_supported_model_is_ok():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 2)
    )
    cp = Cockpit(model.named_parameters(), [NeedsL2(), NeedsDiagH()])
    assert cp.check(model).ok


def test_silently_skipped_parameters_are_detected_not_turned_into_wrong_numbers():
    model = extend(layernorm_model())
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    cp = Cockpit(model.named_parameters(), [NeedsL2(), "loss"])
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    loss = loss_fn(model(x), y)
    with pytest.warns(
        CockpitWarning,
        match=r"BackPACK computed no batch_l2 for parameter\(s\) '1.weight' \(LayerNorm\)",
    ):
        with cp(0, info={"loss": loss, "batch_size": 5}):
            loss.backward()
    assert "needs_l2" not in cp.get_output()[0]
    assert "UnsupportedModelError" in cp.errors[0]["error"]


def test_cockpit_check_cli(tmp_path, capsys):
    (tmp_path / "mymodels.py").write_text(
        textwrap.dedent(
            """
            import torch

            def good():
                return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

            def with_layernorm():
                return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
            """
        )
    )
    path = tmp_path / "mymodels.py"
    assert main(["check", f"{path}:good", "--quantities", "loss,grad_norm"]) == 0
    assert "loss" in capsys.readouterr().out
    code = subprocess.run(
        [
            sys.executable,
            "-m",
            "cockpit_core",
            "check",
            "mymodels:with_layernorm",
            "--quantities",
            "loss",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
    )
    assert code.returncode == 0, code.stderr
    assert main(["check", f"{path}:nope"]) == 1
    assert "has no function 'nope'" in capsys.readouterr().err
    assert main(["check", "no_such_module_xyz:f"]) == 1
    assert "cannot import 'no_such_module_xyz'" in capsys.readouterr().err


class _FrequencyScaled(torch.nn.Module):
    """A Linear layer after an embedding whose gradient mixes the samples (no module rule)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3, scale_grad_by_freq=True)
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, idx):
        return self.lin(self.embed(idx).mean(1))


def test_cockpit_check_cli_backend_and_loss(monkeypatch, capsys):
    """--loss lets torch.func serve what no module rule covers; --backend picks providers."""
    module = types.ModuleType("cockpit_check_models")
    module.frequency_scaled = _FrequencyScaled
    monkeypatch.setitem(sys.modules, "cockpit_check_models", module)
    spec = ["check", "cockpit_check_models:frequency_scaled", "--quantities", "norm_test"]

    assert main(spec) == 1  # no loss: torch.func cannot serve 'embed.weight'
    out = capsys.readouterr().out
    assert "UNAVAILABLE" in out and "'embed.weight'" in out

    assert main([*spec, "--loss", "cross_entropy"]) == 0
    out = capsys.readouterr().out
    assert "hooks; func for 'embed' (Embedding)" in out
    assert re.search(r"^  func: parameter\(s\) 'embed.weight'$", out, flags=re.MULTILINE), out
    assert "not hooks: Embedding: scale_grad_by_freq=True" in out

    assert main([*spec, "--loss", "cross_entropy", "--backend", "func"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  func: all 3 parameters$", out, flags=re.MULTILINE), out

    assert main([*spec, "--backend", "no_such_provider"]) == 1
    assert "unknown statistics provider(s) ['no_such_provider']" in capsys.readouterr().err


def test_check_attaches_the_model_and_training_goes_on_without_errors():
    """cp.check(model) attaches the model: its providers must observe the next steps."""
    model = layernorm_model()
    cp = Cockpit(model.named_parameters(), [NeedsL2()])
    assert cp.check(model).ok  # LayerNorm: module hooks
    for step in range(3):
        x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss, "batch_size": 5}):
            loss.backward()
    assert cp.errors == [] and set(cp.get_output()) == {0, 1, 2}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("attach", [False, True], ids=["parameters", "model"])
def test_runtime_curvature_error_says_what_check_says(attach):
    """On a model BackPACK's second-order extensions do not cover, the step's error never
    tells the user to extend the model as if that sufficed; with the model it is check's."""
    from cockpit_core.testing import tiny_transformer

    problem = tiny_transformer(extended=False)
    model = problem.make_model()
    # without the providers that compute curvature diagonals on any model
    backend = ["hooks", "backpack", "func"]
    cp = Cockpit(model if attach else model.named_parameters(), ["tic_diag"], backend=backend)
    x, y = problem.batch(0)
    out = model(x)
    loss = problem.loss_module()(out, y)
    info = {"loss": loss, "batch_size": len(x)}
    info["individual_losses"] = problem.individual_losses(out, y).detach()
    with cp(0, info=info):
        loss.backward()
    (error,) = cp.errors
    if attach:
        (row,) = cp.check(model).rows
        assert row.why.split(".; ")[-1].rstrip(".") in error["error"]
        assert "does not support 'embed' (Embedding)" in error["error"]
    else:
        assert "helps only if BackPACK supports every module" in error["error"]
        assert "cp.attach(model, loss_fn)" in error["error"]
    assert "Call model = " not in error["error"]
