"""cockpit new-plugin: names, the generated files, plugins/_template, the provider variant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cockpit_core.cli.main import main
from cockpit_core.cli.scaffold import ScaffoldError, new_plugin, plugin_names, render
from cockpit_core.testing import check_plugin, tiny_mlp

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "plugins" / "_template"
IGNORED = {"__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}


def tree(folder: Path) -> dict[str, str]:
    """Relative path -> text of every file, without caches and build output."""
    return {
        str(path.relative_to(folder)): path.read_text(encoding="utf-8")
        for path in sorted(folder.rglob("*"))
        if path.is_file()
        and not IGNORED & set(path.relative_to(folder).parts)
        and not any(part.endswith(".egg-info") for part in path.parts)
    }


def test_plugins_template_is_the_generator_output(tmp_path):
    generated = tree(new_plugin("example", tmp_path, with_instrument=True))
    assert generated == tree(TEMPLATE), (
        "plugins/_template is out of date; regenerate it: rm -r plugins/_template && "
        "cockpit new-plugin example --with-instrument --dir /tmp/x && "
        "cp -r /tmp/x/cockpit-example plugins/_template"
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("acme", ("acme", "cockpit-acme", "cockpit_acme")),
        ("Grad-Stats", ("grad_stats", "cockpit-grad-stats", "cockpit_grad_stats")),
        ("cockpit-grad-stats", ("grad_stats", "cockpit-grad-stats", "cockpit_grad_stats")),
        (" my.stats ", ("my_stats", "cockpit-my-stats", "cockpit_my_stats")),
    ],
)
def test_names_are_normalized(name, expected):
    names = plugin_names(name)
    assert (names.topic, names.distribution, names.package) == expected


@pytest.mark.parametrize("name", ["9lives", "class", "acme!", "", "core", "grüße", "a__b"])
def test_invalid_names_are_refused_with_the_rule(name):
    with pytest.raises(ScaffoldError, match="snake_case Python identifier"):
        plugin_names(name)


def test_generated_files_follow_the_options(tmp_path):
    bare = tree(new_plugin("bare", tmp_path))
    full = tree(new_plugin("full", tmp_path, with_instrument=True, with_provider=True))
    assert sorted(bare) == [
        ".gitignore",
        "README.md",
        "cockpit_bare/__init__.py",
        "cockpit_bare/max_sample_grad_norm.py",
        "cockpit_bare/plugin.py",
        "cockpit_bare/py.typed",
        "conftest.py",
        "pyproject.toml",
        "tests/test_max_sample_grad_norm.py",
        "tests/test_plugin.py",
    ]
    assert set(full) - {k.replace("bare", "full") for k in bare} == {
        "cockpit_full/instruments.py",
        "cockpit_full/loop_provider.py",
        "tests/test_instruments.py",
        "tests/test_loop_provider.py",
    }
    assert "def register_instruments" not in bare["cockpit_bare/plugin.py"]
    assert "register_statistic_providers" not in bare["cockpit_bare/plugin.py"]
    assert 'name = "full_loop"' in full["cockpit_full/loop_provider.py"]
    assert 'full = "cockpit_full.plugin"' in full["pyproject.toml"]
    assert "{{" not in "".join(full.values()) + "".join(bare.values())
    for path, text in {**bare, **full}.items():
        if path.endswith(".py"):
            compile(text, path, "exec")  # every generated module is valid Python


def test_generated_project_is_lint_clean_with_its_own_settings(tmp_path):
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed next to this Python")
    folder = new_plugin("linted", tmp_path, with_instrument=True, with_provider=True)
    for args in (["check", "."], ["format", "--check", "."]):
        proc = subprocess.run([str(ruff), *args], cwd=folder, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_existing_folder_or_installed_distribution_is_refused(tmp_path):
    (tmp_path / "cockpit-taken").mkdir()
    with pytest.raises(ScaffoldError, match="exists already"):
        new_plugin("taken", tmp_path)
    with pytest.raises(ScaffoldError, match="cockpit-basic is installed already"):
        new_plugin("basic", tmp_path)
    assert not (tmp_path / "cockpit-basic").exists()


def test_cli_generates_and_reports_errors(tmp_path, capsys):
    assert main(["new-plugin", "Acme-Stats", "--dir", str(tmp_path), "--with-provider"]) == 0
    out = capsys.readouterr().out
    target = tmp_path / "cockpit-acme-stats"
    assert f"Created {target}" in out and "python -m pip install -e ." in out
    assert (target / "cockpit_acme_stats" / "loop_provider.py").is_file()
    assert not (target / "cockpit_acme_stats" / "instruments.py").exists()
    assert main(["new-plugin", "acme-stats", "--dir", str(tmp_path)]) == 1
    assert "exists already" in capsys.readouterr().err


def test_render_blocks_and_placeholders():
    text = "a {{x}}\n{{#on}}\nkept\n{{#off}}\ndropped\n{{/off}}\n{{/on}}\n{{#off}}\nno\n{{/off}}\n"
    assert render(text, {"x": "1"}, {"on": True, "off": False}) == "a 1\nkept\n"
    with pytest.raises(ScaffoldError, match="unknown template placeholder"):
        render("{{y}}", {}, {})
    with pytest.raises(ScaffoldError, match="not closed"):
        render("{{#on}}\n", {}, {"on": True})
    with pytest.raises(ScaffoldError, match="unknown template flag"):
        render("{{#nope}}\n{{/nope}}\n", {}, {})


def test_generated_provider_plugin_passes_check_plugin(tmp_path, monkeypatch):
    folder = new_plugin("provtest", tmp_path, with_provider=True)
    monkeypatch.syspath_prepend(str(folder))
    try:
        import cockpit_provtest.plugin as plugin

        report = check_plugin(plugin, arguments={"provtest_loop": {"problems": [tiny_mlp()]}})
    finally:
        for name in [n for n in sys.modules if n.startswith("cockpit_provtest")]:
            del sys.modules[name]
    assert report.checked == ["quantity max_sample_grad_norm", "provider provtest_loop"]
    assert report.distribution == "<local>"
