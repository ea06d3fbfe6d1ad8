"""COCKPIT_PLUGINS_DIR: local plugin modules, loaded with the isolation of installed plugins."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
import torch

from cockpit_core import Registry
from cockpit_core.cli.main import main
from cockpit_core.plugin import registry as registry_module
from cockpit_core.plugin.discovery import LOCAL_DISTRIBUTION
from cockpit_core.testing import check_plugin, run_cockpit, tiny_mlp

FIRST_LOSS = """
from cockpit_core import Quantity, Requirements, hookimpl


class FirstLoss(Quantity):
    name = "fakeplug_first_loss"
    REQUIREMENTS = Requirements(info={"individual_losses"})

    def compute(self, ctx):
        return float(ctx.info["individual_losses"][0])


@hookimpl
def register_quantities(register):
    register(FirstLoss)
"""


@pytest.fixture
def plugins_dir(tmp_path, monkeypatch):
    """A folder in COCKPIT_PLUGINS_DIR with a good, a broken and a helper module."""
    folder = tmp_path / "my_plugins"
    folder.mkdir()
    (folder / "fakeplug_local.py").write_text(textwrap.dedent(FIRST_LOSS))
    (folder / "fakeplug_crash.py").write_text("raise ImportError('needs numpy 9')\n")
    (folder / "fakeplug_exits.py").write_text("import sys\nsys.exit(3)\n")
    (folder / "_helpers.py").write_text("raise RuntimeError('helpers are not plugins')\n")
    (folder / "notes.txt").write_text("not python")
    missing = tmp_path / "missing"
    monkeypatch.setenv("COCKPIT_PLUGINS_DIR", f"{folder}{os.pathsep}{missing}")
    yield folder, missing
    for name in [n for n in sys.modules if n.startswith("cockpit_local_plugin_")]:
        del sys.modules[name]


def test_local_modules_load_and_broken_ones_are_reported(plugins_dir):
    folder, missing = plugins_dir
    registry = Registry.from_entry_points()
    infos = {p.name: p for p in registry.plugins}
    good = infos["fakeplug_local"]
    assert good.ok and good.quantities == ["fakeplug_first_loss"]
    assert good.distribution == str((folder / "fakeplug_local.py").resolve())
    assert good.version == LOCAL_DISTRIBUTION
    assert "import failed: ImportError: needs numpy 9" in infos["fakeplug_crash"].error
    assert "sys.exit()" in infos["fakeplug_exits"].error
    assert "which is no folder" in infos[str(missing)].error
    assert "_helpers" not in infos and "notes" not in infos
    assert infos["basic"].ok and "loss" in registry.quantities  # installed plugins still load
    # the local quantity computes the loss of the first sample of each batch
    result = run_cockpit(tiny_mlp(), ["fakeplug_first_loss"], steps=2, registry=registry)
    for snap in result.snapshots:
        model = result.model_at(snap.step)
        expected = torch.nn.functional.cross_entropy(model(snap.x[:1]), snap.y[:1]).item()
        assert result.output[snap.step]["fakeplug_first_loss"] == pytest.approx(expected, rel=1e-12)


def test_a_local_name_taken_by_an_installed_plugin_is_reported(tmp_path, monkeypatch):
    (tmp_path / "basic.py").write_text(textwrap.dedent(FIRST_LOSS))
    monkeypatch.setenv("COCKPIT_PLUGINS_DIR", str(tmp_path))
    registry = Registry.from_entry_points()
    local = [p for p in registry.plugins if p.name == "basic" and p.version == LOCAL_DISTRIBUTION]
    assert len(local) == 1 and "another plugin is named 'basic' already" in local[0].error
    assert "fakeplug_first_loss" not in registry.quantities


def test_check_plugin_finds_a_local_plugin_by_name(plugins_dir):
    report = check_plugin("fakeplug_local")
    assert report.checked == ["quantity fakeplug_first_loss"]


def test_cockpit_plugins_lists_local_plugins(plugins_dir, monkeypatch, capsys):
    monkeypatch.setattr(registry_module, "_DEFAULT", None)  # discovered anew, restored after
    assert main(["plugins", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["fakeplug_local"]["ok"] and rows["fakeplug_local"]["quantities"] == [
        "fakeplug_first_loss"
    ]
    assert not rows["fakeplug_crash"]["ok"] and rows["basic"]["ok"]
