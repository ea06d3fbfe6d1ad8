"""`cockpit diagnose LOG...`: the report, --json, --only, and the exit codes 0, 1 and 2."""

import json

import pytest
import torch

from cockpit_core import Cockpit
from cockpit_core.cli import main


class Zero(torch.nn.Module):
    def forward(self, x):
        return 0.0 * x


def _write_log(path, dead: bool, steps: int = 6):
    """Train a 4-3-2 MLP (its first layer cut off by a zero factor if ``dead``)."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 3)] + ([Zero()] if dead else []) + [torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    cp = Cockpit(model.named_parameters(), ["loss", "grad_norm"], log=path)
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss}):
            loss.backward()
        opt.step()
    cp.close()
    return str(path)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("logs")
    return _write_log(folder / "healthy.jsonl", False), _write_log(folder / "dead.jsonl", True)


def test_a_healthy_log_exits_0(logs, capsys):
    healthy, _ = logs
    assert main(["diagnose", healthy]) == 0
    assert capsys.readouterr().out.strip() == f"{healthy}: no findings"


def test_a_dead_layer_is_reported_with_evidence_and_exits_1(logs, capsys):
    healthy, dead = logs
    assert main(["diagnose", healthy, dead]) == 1
    out = capsys.readouterr().out
    assert f"{dead}: 1 warning" in out
    # Linear(4, 3) -> 0 x -> Tanh -> Linear(3, 2): only the last bias gets a gradient
    assert "WARNING dead_layers: 3 parameter(s) get an exactly zero gradient: 0.weight, " in out
    assert "(steps 0-5)" in out and "suggestion: Check what multiplies" in out


def test_json_output(logs, capsys):
    _, dead = logs
    assert main(["diagnose", dead, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    (finding,) = data["logs"][0]["findings"]
    assert data["exit_code"] == 1 and finding["kind"] == "finding"
    assert finding["id"] == "dead_layers@0"
    assert finding["evidence"]["parameters"] == ["0.weight", "0.bias", "3.weight"]


def test_only_runs_the_named_diagnoses(logs, capsys):
    _, dead = logs
    assert main(["diagnose", dead, "--only", "loss_plateau,exploding_gradients"]) == 0
    assert "no findings" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, says",
    [
        (["missing.jsonl"], "no log file at missing.jsonl"),
        (["{dead}", "--only", "dead_layer"], "Did you mean 'dead_layers'?"),
        (["{garbage}"], "is not a cockpit log"),
    ],
)
def test_usage_and_io_errors_exit_2(logs, tmp_path, capsys, argv, says):
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n")
    argv = [a.format(dead=logs[1], garbage=garbage) for a in argv]
    assert main(["diagnose", *argv]) == 2
    assert says in capsys.readouterr().err
