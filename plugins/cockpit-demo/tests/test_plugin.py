"""cockpit-demo registers ``cockpit demo`` through the ``register_commands`` hook."""

import argparse
import subprocess
import sys

import pytest
from cockpit_demo import command, plugin

from cockpit_core.cli.main import main
from cockpit_core.plugin.registry import default_registry


def test_the_entry_point_registers_the_demo_command():
    entry = default_registry().commands["demo"]
    assert entry.distribution == "cockpit-demo"
    assert (entry.configure, entry.run) == (command.configure, command.run)
    assert entry.help == plugin.HELP


def test_cockpit_demo_help_shows_its_arguments(capsys):
    # plugins' commands join the parser when the command line names one that is not the core's
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: cockpit demo ")
    assert all(
        f"--{name}" in out for name in ("model", "preset", "steps", "out", "seed", "compare-lr")
    )


@pytest.mark.parametrize(
    "text, message",
    [("0", "must be at least 1, got 0"), ("1.5", "expected a whole number, got '1.5'")],
)
def test_steps_must_be_a_positive_whole_number(text, message):
    assert command.positive_int("7") == 7
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        command.positive_int(text)


def test_loading_the_plugin_imports_no_training_code():
    # discovery stays fast: the training modules (and scikit-learn) load when the demo runs
    code = (
        "import sys, cockpit_demo.plugin; "
        "print(sorted(m for m in sys.modules if m.startswith(('cockpit_demo.', 'sklearn'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "['cockpit_demo.command', 'cockpit_demo.plugin']"
