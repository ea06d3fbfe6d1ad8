"""The `cockpit` command line."""

import io
import json
import subprocess
import sys

import pytest

from cockpit_core.cli.main import main
from cockpit_core.plugin.registry import default_registry


def test_plugins_lists_distributions_versions_and_state(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "basic  (cockpit-basic 0.1.0)  ok" in out
    assert main(["plugins", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    basic = next(r for r in rows if r["name"] == "basic")
    assert basic["ok"] and "grad_norm" in basic["quantities"] and "economy" in basic["presets"]


def test_quantities_lists_options_with_descriptions(capsys):
    assert main(["quantities", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in data["quantities"]}
    every = next(o for o in rows["loss"]["options"] if o["name"] == "every")
    assert every["type"] == "int | None" and "every this many steps" in every["description"]
    assert "economy" in data["presets"]
    assert main(["quantities"]) == 0
    assert "update_size  [cockpit-basic" in capsys.readouterr().out


def test_schema_is_json_with_a_name_discriminator(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "quantities" in schema["properties"]
    assert '"propertyName": "name"' in json.dumps(schema)


@pytest.mark.parametrize(
    "text, code, message",
    [
        ('quantities = ["loss", { name = "grad_norm", every = 5 }]\n', 0, "valid (2 quantities"),
        ('quantities = ["los"]\n', 1, "quantities.0: Unknown quantity 'los'. Did you mean 'loss'?"),
        (
            'quantities = [{ name = "loss", every = 0 }]\n',
            1,
            "quantities.0.every: Input should be greater",
        ),
        ('debug = "sometimes"\n', 1, "debug: Input should be a valid boolean"),
    ],
)
def test_validate_exit_codes_and_messages(tmp_path, capsys, text, code, message):
    path = tmp_path / "cockpit.toml"
    path.write_text(text)
    assert main(["validate", str(path)]) == code
    captured = capsys.readouterr()
    assert message in (captured.out if code == 0 else captured.err)


def test_validate_prints_every_problem_of_the_file(tmp_path, capsys):
    path = tmp_path / "cockpit.toml"
    path.write_text(
        'debug = "yes"\n'
        'quantities = ["loss", { name = "grad_norm", label = "loss" }, '
        '{ name = "loss", label = "l2", every = true }]\n'
    )
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().err == (
        f"Invalid cockpit configuration in {path}:\n"
        "  debug: Input should be a valid boolean, got str 'yes'\n"
        "  quantities.1: 'loss' is tracked twice (also quantities.0); give one of them a "
        "distinct 'label'\n"
        "  quantities.2.every: Input should be a valid integer, got bool True\n"
        "3 problems found.\n"
    )


def test_validate_checks_sinks_without_building_them(tmp_path, capsys):
    path = tmp_path / "cockpit.toml"
    log_dir = tmp_path / "tb"
    path.write_text(
        f'quantities = ["loss"]\nsinks = [{{ name = "tensorboard", log_dir = "{log_dir}" }}]\n'
    )
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: valid (1 quantities: loss; sinks: tensorboard)\n"
    assert not log_dir.exists()
    path.write_text('quantities = ["loss"]\nsinks = [{ name = "tensorboard", log_dirr = "x" }]\n')
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert (
        "  sinks.0.log_dirr: unknown option of sink 'tensorboard' (check the spelling; its options: log_dir, "
        in err
    )
    assert err.endswith("\n1 problem found.\n")


def test_plugins_lists_sinks_providers_and_conflicts(fake_distribution, monkeypatch, capsys):
    from cockpit_core import Registry
    from cockpit_core.plugin import registry as registry_module

    fake_distribution(
        "fakeplug-tb",
        "fakeplug_tb",
        "from cockpit_core import hookimpl\n\n@hookimpl\ndef register_sinks(register):\n"
        "    register('tensorboard', lambda **options: print)\n",
    )
    registry = Registry.from_entry_points()
    monkeypatch.setattr(registry_module, "default_registry", lambda: registry)
    conflict = (
        "The sink name 'tensorboard' is registered by both 'cockpit-tensorboard' and "
        "'fakeplug-tb', so cockpit cannot tell which one you mean. Uninstall one of the "
        "distributions (pip uninstall ...), or ask one author to rename the sink."
    )
    assert main(["plugins", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["tensorboard"]["sinks"] == ["tensorboard"]
    assert rows["fakeplug_tb"]["sinks"] == ["tensorboard"] and rows["fakeplug_tb"]["ok"]
    assert rows["fakeplug_tb"]["conflicts"] == [conflict]
    assert rows["tensorboard"]["conflicts"] == [conflict]
    assert rows["basic"]["conflicts"] == []
    assert "func" in rows["core"]["providers"]
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert f"CONFLICT sink:tensorboard: {conflict}\n" in out
    assert "    sinks: tensorboard\n" in out


def test_an_os_error_is_a_message_and_exit_code_1(monkeypatch, capsys):
    from cockpit_core.cli import commands as cli_commands

    def broken(args):
        raise OSError("No space left on device")

    monkeypatch.setattr(cli_commands, "cmd_schema", broken)
    assert main(["schema"]) == 1
    assert capsys.readouterr().err == "error: No space left on device\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "-3"], "argument --steps: must be at least 1, got -3"),
        (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["--steps", "many"], "argument --steps: expected a whole number, got 'many'"),
        (["--preset", "bogus"], "argument --preset: Unknown quantity 'bogus'. Installed: "),
        (
            ["--preset", "loss,gradnorm"],
            "argument --preset: Unknown quantity 'gradnorm'. Did you mean 'grad_norm'?",
        ),
    ],
)
def test_demo_rejects_bad_arguments_before_creating_the_run_folder(tmp_path, capsys, argv, message):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--out", str(run), *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: cockpit demo ") and f"cockpit demo: error: {message}" in err
    assert not run.exists()
    if "--preset" in argv:
        presets = ", ".join(sorted(default_registry().presets))
        assert f"Presets: {presets}." in err  # the installed presets


def test_run_demo_checks_its_arguments_before_creating_the_run_folder(tmp_path):
    from cockpit_demo.training import run_demo

    from cockpit_core.errors import ConfigError

    with pytest.raises(ValueError, match="steps must be at least 1, got 0"):
        run_demo(steps=0, out=tmp_path / "a")
    with pytest.raises(ConfigError, match="Unknown quantity 'bogus'"):
        run_demo(preset="bogus", out=tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_check_imports_the_model_module_from_the_current_directory(tmp_path):
    # started like the console script: sys.path[0] is the script's folder, not the cwd
    launcher = tmp_path / "bin" / "cockpit_launcher.py"
    launcher.parent.mkdir()
    launcher.write_text("import sys\nfrom cockpit_core.cli.main import main\nsys.exit(main())\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "models.py").write_text(
        "import torch\n\n\ndef mlp():\n    return torch.nn.Sequential(torch.nn.Linear(4, 2))\n"
    )
    out = subprocess.run(
        [sys.executable, str(launcher), "check", "models:mlp", "--quantities", "loss,grad_norm"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "loss       ok           no statistics beyond p.grad",
        "grad_norm  ok           no statistics beyond p.grad",
    ]


def test_demo_progress_is_lines_without_carriage_returns_when_stderr_is_no_terminal(
    tmp_path, capsys, monkeypatch
):
    pytest.importorskip("sklearn")
    from cockpit_demo import training

    monkeypatch.setattr(training, "_plot", lambda cp, path, title: None)  # not needed here
    assert main(["demo", "--steps", "5", "--out", str(tmp_path / "run"), "--preset", "loss"]) == 0
    err = capsys.readouterr().err  # captured: not a terminal
    assert "\r" not in err
    progress = [line.split("  ")[0] for line in err.splitlines() if line.startswith("step ")]
    assert progress == [f"step {step}/5" for step in range(1, 6)]  # a line per tenth, at most


def test_progress_on_a_terminal_is_a_bar_redrawn_in_place():
    pytest.importorskip("tqdm")
    from cockpit_demo.training import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal, log = Terminal(), io.StringIO()
    for stream in (terminal, log):
        with progress(300, stream) as report:
            for step in range(300):
                report(step, 1.0 / (step + 1))
    assert "\r" in terminal.getvalue() and "300/300" in terminal.getvalue()
    assert "loss 0.0033" in terminal.getvalue()
    lines = log.getvalue().splitlines()
    assert [line.split("  ")[:2] for line in lines] == [
        [f"step {step}/300", f"loss {1 / step:.4f}"] for step in range(30, 301, 30)
    ]
