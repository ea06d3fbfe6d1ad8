"""The walk-through of docs/writing_quantities.md, run command by command as written there.

The commands are read from the doc (the ``bash`` block after the marker comment), so the doc
and this test cannot drift apart. They run in a temporary folder with this environment's
``bin`` first on ``PATH`` (``python`` and ``cockpit`` are this venv's). To run offline, pip is
configured through its environment variables only: no index (``PIP_NO_INDEX``) and the
installed setuptools instead of an isolated build environment (``PIP_NO_BUILD_ISOLATION=0``,
pip's spelling of ``--no-build-isolation``). The generated distribution is installed into this
environment and uninstalled when the module's tests end, also when they fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "writing_quantities.md"
MARKER = "<!-- tests/kit/test_new_plugin.py runs the commands of the next block, in order -->"
DISTRIBUTION = "cockpit-acme"
BIN = Path(sys.executable).parent


def walkthrough_commands() -> list[str]:
    """The commands of the walk-through, without comments."""
    text = DOC.read_text(encoding="utf-8")
    assert MARKER in text, f"{DOC.name} lost the marker of the walk-through"
    block = re.search(r"```bash\n(.*?)```", text.split(MARKER, 1)[1], re.S)
    assert block is not None, "no ```bash block after the marker"
    lines = [line.split(" #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _uninstall(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet", DISTRIBUTION],
        env=env,
        capture_output=True,
        timeout=120,
    )


def _installed() -> bool:
    try:
        metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory):
    """Run every command of the walk-through; uninstall the distribution afterwards."""
    if not (BIN / "cockpit").exists():
        pytest.skip(f"the `cockpit` script is not installed next to {sys.executable}")
    env = {k: v for k, v in os.environ.items() if k != "COCKPIT_PLUGINS_DIR"}
    env.update(
        PATH=str(BIN) + os.pathsep + env.get("PATH", ""),
        PIP_NO_INDEX="1",
        PIP_NO_BUILD_ISOLATION="0",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        XDG_CACHE_HOME=str(tmp_path_factory.mktemp("cache")),  # `cockpit plugins`' cache
    )
    if _installed():  # a leftover of an interrupted run
        _uninstall(env)
    cwd = tmp_path_factory.mktemp("walkthrough")
    runs: dict[str, subprocess.CompletedProcess[str]] = {}
    try:
        for command in walkthrough_commands():
            if command.startswith("cd "):
                cwd = cwd / command[3:].strip()
                continue
            proc = subprocess.run(
                command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=300
            )
            runs[command] = proc
            assert proc.returncode == 0, f"`{command}` failed:\n{proc.stdout}\n{proc.stderr}"
        yield runs, cwd
    finally:
        _uninstall(env)


def test_the_walkthrough_is_the_expected_sequence():
    commands = walkthrough_commands()
    assert commands[0].startswith("cockpit new-plugin acme")
    assert commands[1] == f"cd {DISTRIBUTION}"
    assert [c.split()[:4] for c in commands[2:]] == [
        ["python", "-m", "pip", "install"],
        ["cockpit", "plugins"],
        ["python", "-m", "pytest"],
        ["python", "-m", "pip", "wheel"],
    ]


def test_cockpit_plugins_lists_the_installed_plugin(walkthrough):
    runs, _ = walkthrough
    out = runs["cockpit plugins"].stdout
    assert re.search(r"^acme  \(cockpit-acme 0\.1\.0\)  ok$", out, re.M), out
    assert "    quantities: max_sample_grad_norm" in out.split("acme  (cockpit-acme")[1]


def test_generated_tests_pass_without_skips(walkthrough):
    runs, _ = walkthrough
    out = runs["python -m pytest"].stdout
    summary = out.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    assert set(counts) <= {"passed", "warnings", "warning"}, out  # nothing skipped or failed
    passed = counts["passed"]
    # check_quantity twice, two brute-force values, the panel, check_plugin
    assert passed == 6


def test_the_wheel_declares_the_entry_point_and_ships_the_package(walkthrough):
    _, cwd = walkthrough
    (wheel,) = (cwd / "dist").glob("cockpit_acme-0.1.0-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read("cockpit_acme-0.1.0.dist-info/entry_points.txt").decode()
        requires = zf.read("cockpit_acme-0.1.0.dist-info/METADATA").decode()
    assert "[cockpit]\nacme = cockpit_acme.plugin" in entry_points
    assert {
        "cockpit_acme/plugin.py",
        "cockpit_acme/max_sample_grad_norm.py",
        "cockpit_acme/instruments.py",
        "cockpit_acme/py.typed",
    } <= names
    assert not any(name.startswith("tests/") for name in names)
    major, minor = (int(n) for n in re.findall(r"\d+", metadata.version("cockpit-core"))[:2])
    assert f"Requires-Dist: cockpit-core<{major + 1},>={major}.{minor}" in requires
