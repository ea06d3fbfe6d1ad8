"""The config loader only raises ConfigError (with a path); broken plugins are reported."""

import json
import subprocess
import sys

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cockpit_core import Cockpit, ConfigError

PARAMS = [torch.nn.Parameter(torch.zeros(2))]
KEYS = st.sampled_from(
    [
        "quantities",
        "on_error",
        "debug",
        "log",
        "keep_in_memory",
        "name",
        "every",
        "offset",
        "schedule",
        "kind",
        "steps",
        "start",
        "end",
        "num",
        "label",
        "bins",
        "x",
        "loss",
    ]
)
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=True),
    st.sampled_from(["loss", "grad_norm", "economy", "every", "log", "steps", "warn", "", "basic"]),
    st.text(max_size=5),
)
NESTED = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(KEYS, st.integers(0, 3)), children, max_size=4),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, NESTED, max_size=5))
def test_random_nested_configs_raise_only_config_errors_with_paths(tmp_path_factory, data):
    if "log" in data:
        data["log"] = (
            str(tmp_path_factory.mktemp("log") / "log.jsonl")
            if isinstance(data["log"], str)
            else data["log"]
        )
    try:
        cp = Cockpit.from_config(data, PARAMS)
    except ConfigError as err:
        assert err.errors and all(isinstance(path, str) and msg for path, msg in err.errors)
    else:
        cp.close()


@settings(max_examples=100, deadline=None)
@given(NESTED)
def test_random_quantity_lists_raise_only_config_errors(entries):
    try:
        Cockpit(PARAMS, entries if isinstance(entries, (list, str, dict)) else [entries])
    except ConfigError as err:
        assert err.errors


def test_cockpit_plugins_reports_broken_plugins(fake_distribution):
    site = fake_distribution("fakeplug-crash", "fakeplug_crash", "import does_not_exist_anywhere\n")
    fake_distribution("fakeplug-old", "fakeplug_old", "COCKPIT_PROTOCOL_VERSION = 0\n")
    fake_distribution(
        "fakeplug-hook",
        "fakeplug_hook",
        "from cockpit_core import hookimpl\n\n@hookimpl\ndef register_quantities(register):\n    register(42)\n",
    )
    env = {"PYTHONPATH": str(site), "PATH": "", "COCKPIT_NO_CACHE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "cockpit_core", "plugins", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert (
        "ModuleNotFoundError: No module named 'does_not_exist_anywhere'"
        in rows["fakeplug_crash"]["error"]
    )
    assert "declares plugin protocol version 0" in rows["fakeplug_old"]["error"]
    assert (
        "hook raised TypeError: 42 is not a subclass of cockpit_core.Quantity"
        in rows["fakeplug_hook"]["error"]
    )
    assert rows["basic"]["ok"]
    text = subprocess.run(
        [sys.executable, "-m", "cockpit_core", "plugins"], env=env, capture_output=True, text=True
    )
    assert "fakeplug_crash  (fakeplug-crash 1.0)  SKIPPED: import failed" in text.stdout


def test_a_plugin_exiting_at_import_does_not_stop_any_command(fake_distribution, tmp_path):
    site = fake_distribution("fakeplug-exit", "fakeplug_exit", "import sys\nsys.exit(3)\n")
    fake_distribution(
        "fakeplug-hookexit",
        "fakeplug_hookexit",
        "from cockpit_core import hookimpl\n\n@hookimpl\n"
        "def register_presets(register):\n    raise SystemExit('bye')\n",
    )
    env = {"PYTHONPATH": str(site), "PATH": "", "COCKPIT_NO_CACHE": "1"}
    config = tmp_path / "c.toml"
    config.write_text('quantities = ["loss", "grad_norm"]\n')

    def cockpit(*args):
        return subprocess.run(
            [sys.executable, "-m", "cockpit_core", *args], env=env, capture_output=True, text=True
        )

    proc = cockpit("plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["fakeplug_exit"]["error"].startswith(
        "import failed: SystemExit: 3 (the plugin called sys.exit() or raised SystemExit) ("
    )
    assert rows["fakeplug_hookexit"]["error"] == (
        "hook raised SystemExit: bye (the plugin called sys.exit() or raised SystemExit)"
    )
    assert rows["basic"]["ok"]
    text = cockpit("plugins")
    assert text.returncode == 0
    assert (
        "fakeplug_exit  (fakeplug-exit 1.0)  SKIPPED: import failed: SystemExit: 3" in text.stdout
    )
    for args in (("quantities",), ("schema",)):
        assert cockpit(*args).returncode == 0, args
    proc = cockpit("validate", str(config))
    assert (proc.returncode, proc.stdout) == (
        0,
        f"{config}: valid (2 quantities: loss, grad_norm)\n",
    )


def _registry():
    from cockpit_core.plugin.registry import default_registry

    return default_registry()


SINK_ENTRIES = st.one_of(
    st.sampled_from(["tensorboard", "tensorbord", ""]),
    st.dictionaries(
        st.sampled_from(["name", "log_dir", "flush_secs", "histograms", "x"]), LEAVES, max_size=4
    ),
    LEAVES,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(KEYS, NESTED, max_size=5),
    st.one_of(st.none(), st.lists(SINK_ENTRIES, max_size=3), NESTED),
)
def test_validation_of_random_configs_raises_only_config_errors(data, sinks):
    from cockpit_core.config.files import validate_config_data

    if sinks is not None:
        data["sinks"] = sinks
    try:
        validated = validate_config_data(data, _registry(), "random.toml")
    except ConfigError as err:
        assert err.errors and all(
            isinstance(p, str) and isinstance(m, str) and m for p, m in err.errors
        )
    else:
        assert all(s.path.startswith("sinks.") for s in validated.sinks)
