"""One validation path: `cockpit validate`, parse_settings and from_config run the same checks.

Every problem of a file is reported at once, each with its field path.
"""

import json
import types

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field

from cockpit_core import (
    Cockpit,
    CockpitError,
    ConfigError,
    Quantity,
    QuantityConfig,
    Registry,
    hookimpl,
)
from cockpit_core.cli.main import main
from cockpit_core.config.files import load_config_file, parse_settings, validate_config_data
from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig
from cockpit_core.log import LogFormatError, check_log_path, read_records
from cockpit_core.plugin import registry as registry_module

PARAMS = [torch.nn.Parameter(torch.zeros(2))]


class HistConfig(QuantityConfig):
    bins: int = Field(10, gt=0, description="Number of bins.")
    range: tuple[float, float] = Field((-1.0, 1.0), description="Bin range.")


class Hist(Quantity):
    """A configurable test quantity."""

    name = "hist"
    Config = HistConfig

    def compute(self, ctx):
        return self.config.bins


class Loss(Quantity):
    """Test loss."""

    name = "loss"

    def compute(self, ctx):
        return 0.0


class MemoryOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prefix: str = Field("", description="Prefix of every record.")
    flush_every: int = Field(1, ge=1, description="Records between flushes.")


SEEN = []


def memory_sink(prefix="", flush_every=1):
    return SEEN.append


def plain_sink(path):
    return SEEN.append


class LossAboveConfig(DiagnosisConfig):
    threshold: float = Field(1.0, description="Report a loss above this.")


class LossAbove(Diagnosis):
    """A test diagnosis with one option."""

    name = "loss_above"
    reads = ("loss",)
    Config = LossAboveConfig

    def check(self, window):
        return []


def make_registry():
    plugin = types.SimpleNamespace()

    @hookimpl
    def register_quantities(register):
        register(Hist)
        register(Loss)

    @hookimpl
    def register_presets(register):
        register("small", ["loss", {"name": "hist", "bins": 3}])

    @hookimpl
    def register_sinks(register):
        register("memory", memory_sink, MemoryOptions, "Keeps records in a list.")
        register("plain", plain_sink)

    @hookimpl
    def register_diagnoses(register):
        register(LossAbove)

    plugin.register_quantities = register_quantities
    plugin.register_presets = register_presets
    plugin.register_sinks = register_sinks
    plugin.register_diagnoses = register_diagnoses
    registry = Registry()
    registry.add_plugin(plugin, name="test", distribution="cockpit-test")
    return registry


BAD_FILE = """\
debug = "yes"
on_error = 1
backend = "nonexistent"
sinks = ["memroy", { name = "memory", prefx = "x", flush_every = true }, 3, { name = "plain", colour = "red" }]
quantities = [
  "loss",
  { name = "hist", label = "loss" },
  { name = "hist", bins = true, every = true, label = "h2" },
  { name = "hist", label = "h3", schedule = { kind = "log", end = 1000, num = 1000000000 } },
  { name = "hsit" },
]
"""

BAD_FILE_ERRORS = [
    ("debug", "Input should be a valid boolean, got str 'yes'"),
    ("on_error", "Input should be 'warn', 'disable' or 'raise', got int 1"),
    (
        "sinks.0",
        "Unknown sink 'memroy'. Did you mean 'memory'? Installed: memory, plain. "
        "Run `cockpit plugins` to list the installed sinks.",
    ),
    (
        "sinks.1.prefx",
        "unknown option of sink 'memory' (check the spelling; its options: prefix, flush_every)",
    ),
    ("sinks.1.flush_every", "Input should be a valid integer, got bool True"),
    (
        "sinks.2",
        "expected a sink name or a table with 'name' and the sink's options, got int 3",
    ),
    (
        "sinks.3",
        "invalid options for sink 'plain': missing a required argument: 'path'",
    ),
    (
        "quantities.1",
        "'loss' is tracked twice (also quantities.0); give one of them a distinct 'label'",
    ),
    ("quantities.2.bins", "Input should be a valid integer, got bool True"),
    ("quantities.2.every", "Input should be a valid integer, got bool True"),
    (
        "quantities.3.schedule.num",
        "num = 1000000000 is too large: a logarithmic schedule tracks at most 100000 steps; "
        "use kind 'every' to track densely",
    ),
    (
        "quantities.4.name",
        "Unknown quantity 'hsit'. Did you mean 'hist'? Installed: hist, loss. "
        "Run `cockpit quantities` to list them with their options.",
    ),
]


def _errors_without_backend(err):
    backend = [e for e in err.errors if e[0] == "backend"]
    assert len(backend) == 1
    assert backend[0][1].startswith("unknown statistics provider(s) ['nonexistent']")
    return [e for e in err.errors if e[0] != "backend"]


def test_every_problem_of_a_file_is_reported_at_once_in_file_order(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(BAD_FILE)
    with pytest.raises(ConfigError) as err:
        validate_config_data(load_config_file(path), make_registry(), str(path))
    assert [p for p, _ in err.value.errors] == [
        "debug",
        "on_error",
        "backend",
        "sinks.0",
        "sinks.1.prefx",
        "sinks.1.flush_every",
        "sinks.2",
        "sinks.3",
        "quantities.1",
        "quantities.2.bins",
        "quantities.2.every",
        "quantities.3.schedule.num",
        "quantities.4.name",
    ]
    assert _errors_without_backend(err.value) == BAD_FILE_ERRORS
    assert str(err.value).startswith(f"Invalid cockpit configuration in {path}:\n  debug: ")


def test_parse_settings_with_a_registry_runs_the_same_checks(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(BAD_FILE)
    with pytest.raises(ConfigError) as err:
        parse_settings(load_config_file(path), str(path), registry=make_registry())
    assert _errors_without_backend(err.value) == BAD_FILE_ERRORS


def test_cockpit_validate_prints_every_problem(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(registry_module, "default_registry", make_registry)
    path = tmp_path / "c.toml"
    path.write_text(BAD_FILE)
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    for field, message in BAD_FILE_ERRORS:
        assert f"\n  {field}: {message}\n" in err
    assert err.endswith("\n13 problems found.\n")


def test_top_level_errors_do_not_hide_quantity_errors():
    with pytest.raises(ConfigError) as err:
        validate_config_data(
            {"on_eror": "warn", "quantities": [{"name": "hist", "bins": 0}]}, make_registry()
        )
    assert err.value.errors == [
        (
            "on_eror",
            "unknown option (check the spelling; `cockpit quantities` lists the options)",
        ),
        ("quantities.0.bins", "Input should be greater than 0"),
    ]


# Configs `cockpit validate` used to call valid although Cockpit.from_config rejected them.
ONCE_ACCEPTED = {
    "label collision": (
        {"quantities": ["hist", {"name": "loss", "label": "hist"}]},
        "quantities.1",
        "'hist' is tracked twice (also quantities.0); give one of them a distinct 'label'",
    ),
    "unknown sink": (
        {"quantities": ["loss"], "sinks": ["memroy"]},
        "sinks.0",
        "Unknown sink 'memroy'. Did you mean 'memory'? Installed: memory, plain. "
        "Run `cockpit plugins` to list the installed sinks.",
    ),
    "bad sink option": (
        {"quantities": ["loss"], "sinks": [{"name": "memory", "flush_every": 0}]},
        "sinks.0.flush_every",
        "Input should be greater than or equal to 1",
    ),
    "huge log schedule": (
        {"quantities": [{"name": "loss", "schedule": {"kind": "log", "end": 10, "num": 10**9}}]},
        "quantities.0.schedule.num",
        "num = 1000000000 is too large: a logarithmic schedule tracks at most 100000 steps; "
        "use kind 'every' to track densely",
    ),
    "unknown diagnosis": (
        {"quantities": ["loss"], "diagnoses": ["loss_abov"]},
        "diagnoses.0",
        "Unknown diagnosis 'loss_abov'. Did you mean 'loss_above'? Installed: loss_above. "
        "Install cockpit-diagnoses, or see docs/diagnoses.md for the rules.",
    ),
    "bad diagnosis option": (
        {"quantities": ["loss"], "diagnoses": ["loss_above", {"name": "loss_above", "x": 1}]},
        "diagnoses.1.x",
        "Extra inputs are not permitted",
    ),
    "string for a boolean": (
        {"quantities": ["loss"], "debug": "yes"},
        "debug",
        "Input should be a valid boolean, got str 'yes'",
    ),
    "boolean for an integer": (
        {"quantities": [{"name": "loss", "every": True}]},
        "quantities.0.every",
        "Input should be a valid integer, got bool True",
    ),
}


@pytest.mark.parametrize("case", sorted(ONCE_ACCEPTED))
def test_validate_and_from_config_reject_the_same_configs(case, tmp_path, capsys, monkeypatch):
    data, field, message = ONCE_ACCEPTED[case]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(registry_module, "default_registry", make_registry)
    assert main(["validate", str(path)]) == 1
    assert f"  {field}: {message}\n" in capsys.readouterr().err
    with pytest.raises(ConfigError) as err:
        validate_config_data(data, make_registry())
    assert err.value.errors == [(field, message)]
    with pytest.raises(CockpitError) as err:
        Cockpit.from_config(path, PARAMS, registry=make_registry())
    assert message in str(err.value)


def test_from_config_reports_all_problems_at_once(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(BAD_FILE)
    with pytest.raises(ConfigError) as err:
        Cockpit.from_config(path, PARAMS, registry=make_registry())
    assert _errors_without_backend(err.value) == BAD_FILE_ERRORS


def test_a_valid_config_passes_every_path(tmp_path, capsys, monkeypatch):
    data = {
        "on_error": "disable",
        "sinks": [{"name": "plain", "path": "x"}, {"name": "memory", "prefix": "r"}],
        "quantities": [
            "small",
            {"name": "hist", "label": "h_log", "range": [-2, 2]},
            {"name": "hist", "label": "h_steps", "schedule": {"kind": "steps", "steps": [0, 4]}},
        ],
    }
    validated = validate_config_data(data, make_registry())
    assert [q.key for q in validated.quantities] == ["loss", "hist", "h_log", "h_steps"]
    assert validated.quantities[2].config.range == (-2.0, 2.0)
    assert [(s.path, s.name, s.options) for s in validated.sinks] == [
        ("sinks.0", "plain", {"path": "x"}),
        ("sinks.1", "memory", {"prefix": "r", "flush_every": 1}),
    ]
    assert validated.settings.on_error == "disable"
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    monkeypatch.setattr(registry_module, "default_registry", make_registry)
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == (
        f"{path}: valid (4 quantities: loss, hist, h_log, h_steps; sinks: plain, memory)\n"
    )
    cp = Cockpit.from_config(path, PARAMS, registry=make_registry())
    assert [q.key for q in cp.quantities] == ["loss", "hist", "h_log", "h_steps"]
    cp.close()


def test_validation_builds_no_sink(tmp_path):
    calls = []

    def factory(**options):
        calls.append(options)
        return calls.append

    registry = make_registry()
    plugin = types.SimpleNamespace(
        register_sinks=hookimpl(lambda register: register("counting", factory, MemoryOptions))
    )
    registry.add_plugin(plugin, name="counting", distribution="cockpit-counting")
    validate_config_data({"quantities": ["loss"], "sinks": ["counting"]}, registry)
    assert calls == []


def test_sink_entries_need_a_name():
    with pytest.raises(ConfigError) as err:
        validate_config_data({"quantities": ["loss"], "sinks": [{"prefix": "x"}]}, make_registry())
    assert err.value.errors == [("sinks.0", "missing 'name': which sink is this?")]


def test_wrong_shapes_of_quantities_and_backend_get_one_message_each():
    with pytest.raises(ConfigError) as err:
        validate_config_data({"quantities": 3, "backend": {"x": 1}}, make_registry())
    assert err.value.errors == [
        (
            "quantities",
            "expected a preset name or a list of quantity names, presets and option tables, "
            "got int 3",
        ),
        (
            "backend",
            "expected 'auto', a provider name or a list of provider names, got dict {'x': 1}",
        ),
    ]


def test_not_a_mapping():
    with pytest.raises(ConfigError) as err:
        validate_config_data(["loss"], make_registry(), "c.json")
    assert err.value.errors == [("", "expected a mapping of options, got list")]


# Log paths that `cockpit validate` used to call valid although Cockpit.from_config rejected
# them (or, ending in a slash, that both accepted and the writer created as a file); both now
# run the log writer's own check, check_log_path, which creates nothing.
BAD_LOGS = {  # log relative to tmp_path -> message of the check ({tmp}: tmp_path)
    "an existing file that is not a log": (
        "notalog.txt",
        "{tmp}/notalog.txt exists and is not a cockpit JSON Lines log (it does not start with a "
        "record); cockpit never overwrites a file: choose another log path, or move the file "
        "away.",
    ),
    "a folder": ("logs", "[Errno 21] Is a directory: '{tmp}/logs'"),
    "a new folder, ending in a slash": (
        "new/",
        "[Errno 21] Is a directory (the path ends with a slash): '{tmp}/new/'",
    ),
    "a path under a file": (
        "notalog.txt/runs/log.jsonl",
        "[Errno 20] Not a directory: '{tmp}/notalog.txt'",
    ),
}


def _files(folder):
    return {str(p): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def _config_with_log(tmp_path, log):
    (tmp_path / "notalog.txt").write_text("some notes\n")
    (tmp_path / "logs").mkdir()
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"quantities": ["loss"], "log": str(log)}))
    return path


@pytest.mark.parametrize("case", sorted(BAD_LOGS))
def test_validate_and_from_config_reject_the_same_log_paths(case, tmp_path, capsys, monkeypatch):
    relative, problem = BAD_LOGS[case]
    log = f"{tmp_path}/{relative}"
    message = f"cannot open the log file {log!r}: " + problem.format(tmp=tmp_path)
    path = _config_with_log(tmp_path, log)
    before = _files(tmp_path)
    monkeypatch.setattr(registry_module, "default_registry", make_registry)
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().err == (
        f"Invalid cockpit configuration in {path}:\n  log: {message}\n1 problem found.\n"
    )
    with pytest.raises((OSError, LogFormatError)) as err:
        check_log_path(load_config_file(path)["log"])
    assert f"cannot open the log file {log!r}: {err.value}" == message
    with pytest.raises(ConfigError) as err:
        Cockpit.from_config(path, PARAMS, registry=make_registry())
    assert err.value.errors == [("log", message)]
    assert _files(tmp_path) == before  # nothing was created or changed


def test_a_log_problem_is_listed_with_the_others_in_file_order(tmp_path, capsys, monkeypatch):
    (tmp_path / "notalog.txt").write_text("some notes\n")
    log = str(tmp_path / "notalog.txt")
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"debug": "yes", "log": log, "quantities": ["hsit"]}))
    monkeypatch.setattr(registry_module, "default_registry", make_registry)
    assert main(["validate", str(path)]) == 1
    not_a_log = BAD_LOGS["an existing file that is not a log"][1].format(tmp=tmp_path)
    assert capsys.readouterr().err == (
        f"Invalid cockpit configuration in {path}:\n"
        "  debug: Input should be a valid boolean, got str 'yes'\n"
        f"  log: cannot open the log file {log!r}: {not_a_log}\n"
        "  quantities.0: Unknown quantity 'hsit'. Did you mean 'hist'? Installed: hist, loss. "
        "Run `cockpit quantities` to list them with their options.\n"
        "3 problems found.\n"
    )


def test_new_folders_and_existing_logs_are_valid_and_validate_touches_nothing(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(registry_module, "default_registry", make_registry)
    log = tmp_path / "runs" / "a" / "log.jsonl"
    path = _config_with_log(tmp_path, log)
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: valid (1 quantities: loss)\n"
    assert not (tmp_path / "runs").exists()  # the writer creates the folders, validate does not
    check_log_path(load_config_file(path)["log"])
    Cockpit.from_config(path, PARAMS, registry=make_registry()).close()
    content = log.read_bytes()
    assert [r["kind"] for r in read_records(log)] == ["header"]
    assert main(["validate", str(path)]) == 0  # an existing log: the next run appends to it
    assert log.read_bytes() == content
