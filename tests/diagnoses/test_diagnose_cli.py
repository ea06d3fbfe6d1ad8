"""`cockpit diagnose LOG...`: the report, --json, --only, and the exit codes 0, 1 and 2."""

import json

import pytest
import torch

from cockpit_core import Cockpit
from cockpit_core.cli.main import main


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


# -- options: --set, --config, and how they combine with --only -------------------------

COST_AT_ANY_OVERHEAD = ["--set", "cost.min_records=1", "--set", "cost.max_overhead=1e-6"]
"""The cost rule judging the 5 measured steps of a test log against a budget of ~0."""


def _report(capsys) -> tuple[dict, str]:
    captured = capsys.readouterr()
    return (json.loads(captured.out) if captured.out else {}), captured.err


def _found(data: dict) -> list[tuple[str, str]]:
    return [(f["diagnosis"], f["severity"]) for log in data["logs"] for f in log["findings"]]


def test_set_makes_the_cost_finding_a_warning_and_the_exit_code_1(logs, capsys):
    healthy, _ = logs
    assert main(["diagnose", healthy, "--only", "cost", *COST_AT_ANY_OVERHEAD, "--json"]) == 0
    data, _ = _report(capsys)
    assert _found(data) == [("cost", "info")] and data["exit_code"] == 0
    evidence = data["logs"][0]["findings"][0]["evidence"]
    assert evidence["max_overhead"] == 1e-6 and evidence["measured_steps"] == 5
    argv = ["diagnose", healthy, "--only", "cost", *COST_AT_ANY_OVERHEAD]
    assert main([*argv, "--set", "cost.severity=warning"]) == 1
    out = capsys.readouterr().out
    assert f"{healthy}: 1 warning" in out and "WARNING cost: cockpit adds at least" in out


def test_set_without_only_applies_on_top_of_every_installed_rule(logs, capsys):
    healthy, dead = logs
    argv = [healthy, dead, *COST_AT_ANY_OVERHEAD, "--set", 'cost.severity="warning"', "--json"]
    assert main(["diagnose", *argv]) == 1
    data, _ = _report(capsys)
    assert [[f["diagnosis"] for f in log["findings"]] for log in data["logs"]] == [
        ["cost"],
        ["cost", "dead_layers"],  # both at step 0, both warnings: by id
    ]
    assert {f["severity"] for log in data["logs"] for f in log["findings"]} == {"warning"}


@pytest.mark.parametrize(("window", "expected"), [(3, 1), (7, 0)])
def test_only_and_set_combine(logs, capsys, window, expected):
    _, dead = logs
    argv = [dead, "--only", "dead_layers", "--set", f"dead_layers.window={window}", "--json"]
    assert main(["diagnose", *argv]) == expected
    data, _ = _report(capsys)
    findings = data["logs"][0]["findings"]
    assert [f["evidence"]["window"] for f in findings] == [window] * expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("step_size.window=20", ("step_size", "window", 20)),
        ("cost.max_overhead=0.5", ("cost", "max_overhead", 0.5)),
        ("cost.severity=warning", ("cost", "severity", "warning")),
        ('cost.severity="warning"', ("cost", "severity", "warning")),
        ("rule.flag=true", ("rule", "flag", True)),
        ("rule.text=a=b", ("rule", "text", "a=b")),
        ("rule.text=", ("rule", "text", "")),
    ],
)
def test_set_values_are_json_when_they_parse_else_strings(text, expected):
    from cockpit_core.diagnosing.options import parse_setting

    assert parse_setting(text) == expected


def _config(tmp_path, text: str, suffix: str = ".toml") -> str:
    path = tmp_path / f"cockpit{suffix}"
    path.write_text(text)
    return str(path)


CONFIGS = {
    ".toml": 'diagnoses = ["loss_plateau", { name = "dead_layers", window = 3 }]\n',
    ".yaml": "diagnoses:\n  - loss_plateau\n  - {name: dead_layers, window: 3}\n",
    ".json": '{"diagnoses": ["loss_plateau", {"name": "dead_layers", "window": 3}]}',
}


@pytest.mark.parametrize("suffix", sorted(CONFIGS))
def test_config_runs_exactly_its_diagnoses_with_their_options(logs, tmp_path, capsys, suffix):
    _, dead = logs
    config = _config(tmp_path, CONFIGS[suffix], suffix)
    # cost with these options finds something in every log: it is not in the config
    argv = [dead, "--config", config, "--json"]
    assert main(["diagnose", *argv]) == 1
    data, _ = _report(capsys)
    (finding,) = data["logs"][0]["findings"]
    assert finding["id"] == "dead_layers@0" and finding["evidence"]["window"] == 3


def test_config_with_set_and_only(logs, tmp_path, capsys):
    healthy, dead = logs
    config = _config(
        tmp_path,
        'diagnoses = [{ name = "dead_layers", window = 3 }, '
        '{ name = "cost", min_records = 1, max_overhead = 1e-6 }]\n',
    )
    assert main(["diagnose", dead, "--config", config, "--json"]) == 1
    assert _found(_report(capsys)[0]) == [("dead_layers", "warning"), ("cost", "info")]
    argv = [dead, "--config", config, "--set", "dead_layers.window=7", "--json"]
    assert main(["diagnose", *argv]) == 0  # --set on top of the file's options
    assert _found(_report(capsys)[0]) == [("cost", "info")]
    argv = [healthy, "--config", config, "--only", "cost", "--set", "cost.severity=warning"]
    assert main(["diagnose", *argv, "--json"]) == 1  # --only picks from the file's list
    assert _found(_report(capsys)[0]) == [("cost", "warning")]


@pytest.mark.parametrize(
    ("config", "argv", "says"),
    [
        (None, ["--set", "cost.min_recrds=1"], "diagnoses.cost.min_recrds: Extra inputs"),
        (None, ["--set", "cost.severity=error"], "diagnoses.cost.severity: Input should be"),
        (None, ["--set", "dead_layer.window=3"], "Did you mean 'dead_layers'?"),
        (None, ["--set", "cost"], "--set 'cost': expected NAME.OPTION=VALUE"),
        (None, ["--set", "cost.name=x"], "diagnoses.cost.name: the name is not an option"),
        (
            None,
            ["--only", "stability", "--set", "cost.severity=warning"],
            "diagnoses.cost: options of a diagnosis that does not run",
        ),
        ('on_error = "warn"\n', [], "diagnoses: the file lists no diagnoses"),
        ("diagnoses = []\n", [], "diagnoses: the file lists no diagnoses"),
        ('diagnoses = [{ name = "dead_layers", windw = 3 }]\n', [], "diagnoses.0.windw"),
        ('diagnoses = ["stabilty"]\n', [], "Did you mean 'stability'?"),
        ("diagnoses = [{ window = 3 }]\n", [], "diagnoses.0.name: a diagnosis needs a name"),
        ('on_error = "explode"\ndiagnoses = ["cost"]\n', [], "  on_error: Input should be"),
        ('diagnoses = ["cost"]\n', ["--only", "stability"], "which the config file does not list"),
    ],
)
def test_invalid_options_and_configs_exit_2_naming_the_field(
    logs, tmp_path, capsys, config, argv, says
):
    _, dead = logs
    if config is not None:
        argv = ["--config", _config(tmp_path, config), *argv]
    assert main(["diagnose", dead, *argv]) == 2
    captured = capsys.readouterr()
    assert says in captured.err and captured.out == ""


def test_a_missing_config_file_exits_2(logs, tmp_path, capsys):
    assert main(["diagnose", logs[0], "--config", str(tmp_path / "nope.toml")]) == 2
    assert f"config file not found: {tmp_path / 'nope.toml'}" in capsys.readouterr().err


def test_diagnose_takes_options_in_python(logs):
    from cockpit_core.diagnosing.run import diagnose
    from cockpit_core.errors import ConfigError

    _, dead = logs
    (finding,) = diagnose(dead, options={"dead_layers": {"window": 3}})
    assert finding.id == "dead_layers@0" and finding.evidence["window"] == 3
    assert diagnose(dead, options={"dead_layers": {"window": 7}}) == []
    with pytest.raises(ConfigError, match="diagnoses.dead_layers: options of a diagnosis"):
        diagnose(dead, names=["cost"], options={"dead_layers": {"window": 3}})
