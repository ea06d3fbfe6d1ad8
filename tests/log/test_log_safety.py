"""Loading a log never imports or runs anything named in the file (issue 5)."""

import json
import subprocess
import sys
import textwrap

import pytest

from cockpit_core.log import UnsafeLogError, read_log, read_records

HEADER = {"kind": "header", "cockpit_core": "0.1.0", "quantities": [], "params": []}


def _evil_module(tmp_path, name):
    """A module whose import writes a marker file and runs a shell command."""
    marker = tmp_path / f"{name}.imported"
    shell_marker = tmp_path / f"{name}.shell"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            import os, pathlib
            pathlib.Path({str(marker)!r}).write_text("imported")
            os.system("touch {shell_marker}")

            class Evil:
                def __init__(self, *args, **kwargs):
                    pathlib.Path({str(marker)!r}).write_text("instantiated")
                def __setstate__(self, state):
                    pathlib.Path({str(marker)!r}).write_text("set state")
            """
        )
    )
    return marker, shell_marker


def _write_jsonl(path, entry):
    lines = [HEADER, {"kind": "values", "step": 0, "values": {"loss": 1.0}}]
    lines.append({"kind": "values", "step": 1, "values": {"loss": entry}})
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")


CRAFTED = {
    "instance": lambda mod: {"__instance_type__": [mod, "Evil"], "attributes": {}},
    "class_in_numpy_slot": lambda mod: {"__ndarray__": [1], "dtype": "object", "shape": [1]},
    "enum": lambda mod: {"__enum__": {"__enum_instance_type__": [mod, "Evil"], "name": "X"}},
    "pathlib": lambda mod: {"__pathlib__": "/etc/passwd"},
    "set": lambda mod: {"__set__": [1, 2]},
    "date": lambda mod: {"__datetime__": None, "year": 2020, "month": 1, "day": 1},
    "os_system_class": lambda mod: {"__instance_type__": ["os", "system"], "attributes": {}},
}


@pytest.mark.parametrize("kind", sorted(CRAFTED))
@pytest.mark.parametrize("form", ["jsonl", "json"])
def test_crafted_entries_are_rejected_and_nothing_is_imported(tmp_path, monkeypatch, kind, form):
    module = f"cockpit_evil_{kind}_{form}"
    marker, shell_marker = _evil_module(tmp_path, module)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = CRAFTED[kind](module)
    if form == "jsonl":
        path = tmp_path / "log.jsonl"
        _write_jsonl(path, entry)
    else:
        path = tmp_path / "output.json"
        path.write_text(json.dumps({"header": {}, "output": {"0": {"loss": entry}}}))
    with pytest.raises(UnsafeLogError) as err:
        read_log(path)
    assert "Nothing" in str(err.value) or "refusing" in str(err.value)
    assert not marker.exists() and not shell_marker.exists()
    assert module not in sys.modules


def test_the_crafted_file_is_really_dangerous_with_plain_json_tricks(tmp_path):
    """Control: the default json-tricks loader does import the module (run in a subprocess)."""
    module = "cockpit_evil_control"
    marker, _ = _evil_module(tmp_path, module)
    path = tmp_path / "log.json"
    path.write_text(json.dumps({"v": CRAFTED["instance"](module)}))
    code = f"import sys, json_tricks; sys.path.insert(0, {str(tmp_path)!r}); json_tricks.load(open({str(path)!r}))"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert marker.exists(), "json-tricks did not import the module: the control is void"


def test_error_names_the_marker_and_reassures(tmp_path):
    path = tmp_path / "log.jsonl"
    _write_jsonl(path, {"__instance_type__": ["x", "Y"], "attributes": {}})
    with pytest.raises(UnsafeLogError, match="__instance_type__.*Nothing from it was imported"):
        read_records(path)


@pytest.mark.parametrize("dtype", ["object", "O", "<U5", "V8", "datetime64[s]", None, 3])
def test_only_numeric_dtypes_are_accepted(tmp_path, dtype):
    path = tmp_path / "log.jsonl"
    _write_jsonl(path, {"__ndarray__": [1], "dtype": dtype, "shape": [1]})
    with pytest.raises(UnsafeLogError, match="dtype"):
        read_log(path)


def test_extra_keys_in_an_array_entry_are_rejected(tmp_path):
    path = tmp_path / "log.jsonl"
    _write_jsonl(path, {"__ndarray__": [1.0], "dtype": "float64", "shape": [1], "cls": "os"})
    with pytest.raises(UnsafeLogError, match="unexpected keys"):
        read_log(path)
