"""The `cockpit` command starts light, says what each command does, and ends quietly.

Start-up *times* are measured by `benchmarks/cli_startup.py`, not asserted here; these
tests check what decides them: which modules `--help` and `--version` import.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cockpit_core.cli.main import build_parser, main

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "cockpit_core"

LIGHT_CHILD = """
import argparse, sys, types

package = types.ModuleType("cockpit_core")  # a bare package: the real __init__ imports torch
package.__path__ = [sys.argv[1]]
sys.modules["cockpit_core"] = package
from cockpit_core.cli.main import build_parser, main

(commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
for argv in [["--help"], ["--version"]] + [[name, "--help"] for name in commands.choices]:
    try:
        main(argv)
    except SystemExit as stop:
        assert stop.code == 0, (argv, stop.code)
heavy = {"torch", "backpack", "numpy", "scipy", "pydantic", "pluggy", "matplotlib", "tqdm"}
loaded = sorted(
    name
    for name in sys.modules
    if name.split(".")[0] in heavy or (name.startswith("cockpit_") and name.split(".")[0] != "cockpit_core")
)
print("LOADED", loaded)
"""


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_help_and_version_of_every_command_import_neither_torch_nor_plugins():
    # the CLI module on its own, with the package __init__ replaced by an empty one (the
    # real one imports torch; benchmarks/results/cli_startup.md has the numbers of both)
    out = subprocess.run(
        [sys.executable, "-c", LIGHT_CHILD, str(PACKAGE_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "usage: cockpit [-h] [--version] COMMAND ..." in out.stdout
    assert out.stdout.rstrip().splitlines()[-1] == "LOADED []"


def test_version_is_the_one_in_pyproject(capsys):
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    pyproject = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"cockpit {pyproject['project']['version']}\n"


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_command_has_a_description_in_its_help(name, capsys):
    description = _subcommands()[name].description
    assert description and len(description) > 80  # more than a restated title
    with pytest.raises(SystemExit) as stop:
        main([name, "--help"])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"usage: cockpit {name} ")
    assert " ".join(description.split()) in out


def test_the_command_list_shows_each_command_with_its_summary(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name in _subcommands():
        assert name in out
    assert "print the cockpit-core version and exit" in out
    assert "Run `cockpit COMMAND --help`" in out


BARE_PACKAGE_MAIN = """
import sys, types

package = types.ModuleType("cockpit_core")
package.__path__ = [sys.argv.pop(1)]
sys.modules["cockpit_core"] = package
from cockpit_core.cli.main import main

sys.exit(main())
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "cockpit_core", "quantities"],  # fails in the command's print
        ["-c", BARE_PACKAGE_MAIN, str(PACKAGE_DIR), "--version"],  # in argparse's exit; no torch
    ],
)
def test_a_closed_standard_output_ends_the_command_quietly(argv):
    # `cockpit quantities | head -1`, made deterministic: the pipe is closed before the
    # command writes anything, so its first write fails
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run(
            [sys.executable, *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert out.returncode == 141  # 128 + SIGPIPE, as a shell reports for `yes | head -1`
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr
    assert "Exception ignored" not in out.stderr and "Errno 32" not in out.stderr
