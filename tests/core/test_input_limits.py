"""Hostile inputs: planted symlinks, configs beyond the limits, corrupt caches, escape codes."""

from __future__ import annotations

import json
import os
import sys

import pytest

from cockpit_core.cli.main import main
from cockpit_core.config.files import load_config_file
from cockpit_core.config.limits import MAX_DEPTH, MAX_VALUES
from cockpit_core.errors import ConfigError, UnknownQuantityError, escape_controls, shown_name
from cockpit_core.log.atomic_file import atomic_write, write_text_atomic
from cockpit_core.plugin import listing as plugin_listing

ESCAPE = "\x1b[31m"

# -- temporary files: a fresh name, never a planted symlink -----------------------------------


def plant(folder, name):
    """A symlink at the old fixed temporary name ``.NAME.tmp``; returns its target."""
    target = folder / "victim.txt"
    target.write_text("precious")
    os.symlink(target, folder / f".{name}.tmp")
    return target


def test_atomic_write_does_not_follow_a_planted_symlink(tmp_path):
    target = plant(tmp_path, "out.txt")
    write_text_atomic(tmp_path / "out.txt", "new")
    assert (tmp_path / "out.txt").read_text() == "new"
    assert target.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.txt.tmp", "out.txt", "victim.txt"]


def test_atomic_write_failure_leaves_the_target_and_no_temporary_file(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(path, "w") as out:
        out.write("half")
        raise RuntimeError("boom")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_write_keeps_the_permissions_of_the_replaced_file(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    path.chmod(0o640)
    write_text_atomic(path, "new")
    assert (path.stat().st_mode & 0o777) == 0o640


@pytest.mark.parametrize("name, start", [("dash.png", b"\x89PNG"), ("dash.html", b"<!DOCTYPE")])
def test_cli_plot_does_not_follow_a_symlink_at_the_old_temporary_name(tmp_path, name, start):
    from cockpit_core.testing import run_cockpit, tiny_mlp

    log = tmp_path / "log.jsonl"
    run_cockpit(tiny_mlp(), ["loss", "grad_norm"], steps=3, log=log).cockpit.close()
    target = plant(tmp_path, name)
    assert main(["plot", str(log), "-o", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_bytes().startswith(start)
    assert target.read_text() == "precious"
    assert not list(tmp_path.glob(f".{name}.*.tmp"))


def test_plugin_cache_is_written_through_a_fresh_temporary_name(tmp_path):
    path = tmp_path / "plugins-x.json"
    target = plant(tmp_path, path.name)
    listing = plugin_listing.Listing([], [], [], [])
    assert plugin_listing.write_cache(path, "digest", listing)
    assert plugin_listing.read_cache(path, "digest") is not None
    assert target.read_text() == "precious"


# -- config limits ------------------------------------------------------------------------------


def nested_json(depth: int) -> str:
    return (
        '{"quantities": ["loss"], "provider_options": {"x": {"a": '
        + "[" * depth
        + "]" * depth
        + "}}}"
    )


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 20_000, 100_000])
def test_a_deeply_nested_json_config_is_a_config_error(tmp_path, depth):
    path = tmp_path / "cockpit.json"
    path.write_text(nested_json(depth))
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    message = str(info.value)
    assert str(path) in message and f"nested deeper than {MAX_DEPTH} levels" in message


def test_a_json_config_at_the_limit_loads(tmp_path):
    path = tmp_path / "cockpit.json"
    path.write_text(nested_json(MAX_DEPTH - 5))
    assert load_config_file(path)["quantities"] == ["loss"]


def test_brackets_inside_json_strings_do_not_count(tmp_path):
    path = tmp_path / "cockpit.json"
    path.write_text(json.dumps({"log": "[" * 500 + '\\"{' * 200}))
    assert load_config_file(path)["log"].startswith("[[[")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 20_000])
def test_a_deeply_nested_toml_config_is_a_config_error(tmp_path, depth):
    pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    path = tmp_path / "cockpit.toml"
    path.write_text("quantities = " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_DEPTH} levels") as info:
        load_config_file(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 20_000])
def test_a_deeply_nested_yaml_config_is_a_config_error(tmp_path, depth):
    path = tmp_path / "cockpit.yaml"
    path.write_text("quantities: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_DEPTH} levels") as info:
        load_config_file(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "name, text",
    [
        ("cockpit.json", '{"live_every": ' + "7" * 5000 + "}"),
        ("cockpit.yaml", "live_every: " + "7" * 5000 + "\n"),
        ("cockpit.toml", "live_every = " + "7" * 5000 + "\n"),
    ],
)
def test_a_5000_digit_integer_is_a_config_error(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    message = str(info.value)
    assert str(path) in message
    assert f"a number has more than {sys.get_int_max_str_digits()} digits" in message


BILLION_LAUGHS = """\
quantities: [loss]
provider_options:
  autodiff:
    a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
    h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
"""


def test_a_yaml_alias_bomb_is_refused(tmp_path):
    path = tmp_path / "cockpit.yaml"
    path.write_text(BILLION_LAUGHS)
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    message = str(info.value)
    assert str(path) in message and f"expands to more than {MAX_VALUES} values" in message


def test_a_few_yaml_aliases_are_fine(tmp_path):
    path = tmp_path / "cockpit.yaml"
    path.write_text("quantities: &q [loss, grad_norm]\nprovider_options:\n  x: {again: *q}\n")
    assert load_config_file(path)["provider_options"] == {"x": {"again": ["loss", "grad_norm"]}}


def test_cli_validate_reports_the_limit_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "cockpit.json"
    path.write_text(nested_json(50_000))
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"nested deeper than {MAX_DEPTH} levels" in err and str(path) in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "value, message",
    [
        ("[" * 50_000 + "]" * 50_000, f"nested deeper than {MAX_DEPTH} levels"),
        ("9" * 5000, f"a number has more than {sys.get_int_max_str_digits()} digits"),
    ],
)
def test_cli_diagnose_set_with_hostile_json_is_a_usage_error(tmp_path, capsys, value, message):
    log = tmp_path / "log.jsonl"
    log.write_text("")
    code = main(["diagnose", str(log), "--set", f"cost.severity={value}"])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "--set 'cost.severity'" in err
    assert "Traceback" not in err


# -- the plugin listing cache: a wrong shape means a full load --------------------------------


GOOD_ROW = {
    "name": "basic",
    "distribution": "cockpit-basic",
    "version": "0.1.0",
    "module": "cockpit_basic",
    "ok": True,
    "error": None,
    "hooks": [],
    "quantities": ["loss"],
    "presets": [],
    "instruments": [],
    "sinks": [],
    "providers": [],
    "kinds": [],
    "diagnoses": [],
    "extension_error": None,
    "conflicts": [],
}


def edited(change):
    """A cached listing, edited by ``change(stored_listing_dict)``."""

    def edit(data):
        change(data["entries"][0]["listing"])

    return edit


@pytest.mark.parametrize(
    "edit",
    [
        edited(lambda s: s["rows"][0].pop("ok")),
        edited(lambda s: s["rows"][0].update(name=3)),
        edited(lambda s: s["rows"][0].update(quantities="loss")),
        edited(lambda s: s["rows"][0].update(quantities=[1, 2])),
        edited(lambda s: s["rows"][0].pop("extension_error")),
        edited(lambda s: s.update(rows=[1])),
        edited(lambda s: s.update(conflicts=[["a", 2]])),
        edited(lambda s: s.update(conflicts="ab")),
        edited(lambda s: s.pop("warnings")),
        edited(lambda s: s.update(extension_errors=None)),
        lambda data: data["entries"][0].update(listing=[]),
        lambda data: data["entries"][0].update(created="yesterday"),
        lambda data: data["entries"][0].pop("created"),
    ],
)
def test_an_edited_cache_with_its_fingerprint_means_a_full_load(tmp_path, monkeypatch, edit):
    path = tmp_path / "plugins.json"
    fresh = plugin_listing.Listing([dict(GOOD_ROW)], [], [], [])
    loads = []

    def load():
        loads.append(1)
        return fresh

    monkeypatch.delenv(plugin_listing.NO_CACHE_VARIABLE, raising=False)
    monkeypatch.setattr(
        plugin_listing, "fingerprint", lambda: plugin_listing.Fingerprint("d", True)
    )
    monkeypatch.setattr(plugin_listing, "cache_path", lambda: path)
    monkeypatch.setattr(plugin_listing, "load_listing", load)
    plugin_listing.plugin_listing()
    assert plugin_listing.plugin_listing().cached_at is not None and len(loads) == 1
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    listing = plugin_listing.plugin_listing()  # no KeyError, no TypeError
    assert listing.cached_at is None and listing.rows == [GOOD_ROW] and len(loads) == 2
    assert plugin_listing.plugin_listing().cached_at is not None  # rewritten
    assert len(loads) == 2


# -- user-supplied names: terminal control characters escaped ------------------------------------


def test_shown_name_escapes_control_characters():
    assert shown_name("loss") == "'loss'"
    assert shown_name(f"lo{ESCAPE}ss") == repr(f"lo{ESCAPE}ss")
    assert "\x1b" not in shown_name(f"lo{ESCAPE}ss") and "\\x1b[31m" in shown_name(f"a{ESCAPE}")
    assert escape_controls("line 1\nline\x072") == "line 1\nline\\x072"


def test_an_unknown_quantity_name_with_escape_codes_is_escaped():
    message = str(UnknownQuantityError(f"lo{ESCAPE}ss", ["loss"]))
    assert "\x1b" not in message and "Unknown quantity 'lo\\x1b[31mss'" in message


def test_config_errors_escape_names_in_paths_and_messages():
    message = str(ConfigError([(f"quantities.{ESCAPE}", f"bad '{ESCAPE}'")], "f.toml"))
    assert "\x1b" not in message and "quantities.\\x1b[31m: bad '\\x1b[31m'" in message


def test_cli_validate_never_prints_escape_codes_of_a_name(tmp_path, capsys):
    path = tmp_path / "cockpit.json"
    path.write_text(
        json.dumps({"quantities": [f"lo{ESCAPE}ss", {"name": "loss", "label": ESCAPE}], ESCAPE: 1})
    )
    assert main(["validate", str(path)]) == 1
    captured = capsys.readouterr()
    assert "\x1b" not in captured.err + captured.out
    assert "Unknown quantity 'lo\\x1b[31mss'" in captured.err


def test_cli_unknown_preset_in_plot_or_diagnose_is_escaped(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_text("")
    assert main(["diagnose", str(log), "--only", f"no{ESCAPE}pe"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "'no\\x1b[31mpe'" in err
