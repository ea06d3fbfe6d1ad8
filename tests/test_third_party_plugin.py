"""Acceptance: a plugin made from plugins/_template, pip-installed, works end to end."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1] / "plugins" / "_template"


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    """Copy the template, rename it like a third party would, pip install it into a folder."""
    tmp = tmp_path_factory.mktemp("third_party")
    src = tmp / "acme-cockpit"
    shutil.copytree(TEMPLATE, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (src / "cockpit_example").rename(src / "acme_cockpit")
    for path in src.rglob("*"):
        if path.suffix in {".py", ".toml", ".md"}:
            text = path.read_text().replace("cockpit_example", "acme_cockpit")
            path.write_text(text.replace("cockpit-example", "acme-cockpit"))
    site = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(src),
        ],
        check=True,
    )
    env = dict(os.environ, PYTHONPATH=str(site) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp, env


def run(args, env, **kwargs):
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=300, **kwargs
    )


def test_listed_by_cockpit_quantities(installed_plugin):
    _, env = installed_plugin
    proc = run(["-m", "cockpit_core", "quantities", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)["quantities"]}
    assert rows["max_sample_grad_norm"]["distribution"] == "acme-cockpit"
    assert [o["name"] for o in rows["max_sample_grad_norm"]["options"]][-1] == "relative"
    plugins = run(["-m", "cockpit_core", "plugins", "--json"], env)
    acme = next(p for p in json.loads(plugins.stdout) if p["distribution"] == "acme-cockpit")
    assert acme["ok"] and acme["quantities"] == ["max_sample_grad_norm"]


def test_named_in_a_config_file_it_is_validated_runs_and_appears_in_the_output(installed_plugin):
    tmp, env = installed_plugin
    config = tmp / "cockpit.toml"
    config.write_text('quantities = ["loss", { name = "max_sample_grad_norm", relative = true }]\n')
    assert run(["-m", "cockpit_core", "validate", str(config)], env).returncode == 0
    bad = tmp / "bad.toml"
    bad.write_text('quantities = [{ name = "max_sample_grad_norm", relativ = true }]\n')
    proc = run(["-m", "cockpit_core", "validate", str(bad)], env)
    assert proc.returncode == 1 and "quantities.0.relativ: unknown option" in proc.stderr
    script = textwrap.dedent(
        f"""
        from cockpit_core import Cockpit
        from cockpit_core.testing import tiny_mlp

        problem = tiny_mlp()
        model = problem.make_model()
        loss_fn = problem.loss_module()
        cp = Cockpit.from_config({str(config)!r}, model.named_parameters())
        for step in range(2):
            x, y = problem.batch(step)
            loss = loss_fn(model(x), y)
            with cp(step, info={{"loss": loss, "batch_size": len(x)}}):
                loss.backward()
        out = cp.get_output()
        print(sorted(out[1]), out[1]["max_sample_grad_norm"] > 1)
        """
    )
    proc = run(["-c", script], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['loss', 'max_sample_grad_norm'] True"
