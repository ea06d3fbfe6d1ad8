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
    env = {"PYTHONPATH": str(site), "PATH": ""}
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
