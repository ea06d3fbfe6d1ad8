"""Values survive the log: NaN, inf, numpy arrays of every numeric dtype, nesting (issue 5)."""

import json
import math
import warnings

import numpy as np
import pytest
import torch

from cockpit_core import Quantity, Registry, hookimpl
from cockpit_core.log import (
    LogFormatError,
    LogWriter,
    dumps,
    loads,
    read_log,
    read_records,
    read_run,
)
from cockpit_core.testing import run_cockpit, tiny_mlp

VALUE = {
    "nan": float("nan"),
    "inf": float("inf"),
    "ninf": -float("inf"),
    "int": 3,
    "big": 2**62,
    "text": "héllo\nworld",
    "none": None,
    "flag": True,
    "float32": np.array([1.5, np.nan, np.inf], dtype=np.float32),
    "float64_2d": np.arange(6, dtype=np.float64).reshape(2, 3) / 7,
    "int64": np.array([-(2**40), 0, 7], dtype=np.int64),
    "uint8": np.array([0, 255], dtype=np.uint8),
    "bool": np.array([True, False]),
    "scalar0d": 2.5,  # 0-d arrays are written as plain numbers (checked below)
    "empty": np.zeros((2, 0)),
    "complex": np.array([1 + 2j]),
    "nested": {"total": 1.0, "per_param": np.array([0.5, 0.25]), "list": [1, [2.0, np.float32(3)]]},
}


def _assert_same(a, b):
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(a, b)  # exact: NaN == NaN here
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b and type(a) is type(b) or (isinstance(a, np.generic) and a.item() == b)


def test_every_value_type_round_trips_through_a_line():
    line = dumps({"kind": "values", "step": 0, "values": VALUE})
    assert "\n" not in line
    _assert_same(VALUE, loads(line)["values"])


def test_zero_dim_arrays_and_numpy_scalars_come_back_as_python_numbers():
    back = loads(dumps({"a": np.array(2.5), "b": np.float32(1.5), "c": np.int64(4)}))
    assert back == {"a": 2.5, "b": 1.5, "c": 4}
    assert type(back["a"]) is float and type(back["c"]) is int


def test_jsonl_and_consolidated_json_read_back_identically(tmp_path):
    class Everything(Quantity):
        name = "everything"

        def compute(self, ctx):
            return VALUE

    class plugin:  # noqa: N801 - a plugin namespace
        @staticmethod
        @hookimpl
        def register_quantities(register):
            register(Everything)

    registry = Registry()
    registry.add_plugin(plugin, name="everything_plugin")
    result = run_cockpit(
        tiny_mlp(), ["everything"], steps=3, registry=registry, log=tmp_path / "log.jsonl"
    )
    cp = result.cockpit
    cp.close()
    cp.write(tmp_path / "output.json")
    from_jsonl = read_log(tmp_path / "log.jsonl")
    from_json = read_log(tmp_path / "output.json")
    assert list(from_jsonl) == list(from_json) == [0, 1, 2]
    for step in from_jsonl:
        _assert_same(VALUE, from_jsonl[step]["everything"])
        _assert_same(from_jsonl[step], from_json[step])
    run = read_run(tmp_path / "log.jsonl")
    assert run.header["quantities"][0]["name"] == "everything"
    assert run.header["log_format"] == 2
    assert run.header["run"] == 1 and run.headers == [run.header]
    assert read_run(tmp_path / "output.json").header["params"] == run.header["params"]


def test_a_pretty_printed_consolidated_file_is_read(tmp_path):
    path = tmp_path / "pretty.json"
    path.write_text(
        json.dumps({"header": {}, "output": {"2": {"loss": 1.0}, "1": {"loss": 2.0}}}, indent=2)
    )
    assert read_log(path) == {1: {"loss": 2.0}, 2: {"loss": 1.0}}


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    writer({"kind": "header", "quantities": []})
    for step in range(5):
        writer({"kind": "values", "step": step, "values": {"loss": float(step), "a": np.ones(3)}})
    writer.close()
    full = path.read_bytes()
    path.write_bytes(full[:-1])  # only the final newline is missing: the record is complete
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(read_log(path)) == [0, 1, 2, 3, 4]
    for cut in (2, 7, 30):
        path.write_bytes(full[:-cut])
        with pytest.warns(UserWarning, match="torn last line"):
            output = read_log(path)
        assert sorted(output) == [0, 1, 2, 3]
    # a multi-byte UTF-8 character cut in half is torn too
    path.write_bytes(full + '{"kind":"values","step":9,"values":{"s":"é'.encode()[:-1])
    with pytest.warns(UserWarning, match="torn last line"):
        assert sorted(read_log(path)) == [0, 1, 2, 3, 4]


def test_damage_before_the_last_line_is_an_error(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(
        '{"kind":"header"}\n{"kind":"values","st\n{"kind":"values","step":1,"values":{}}\n'
    )
    with pytest.raises(LogFormatError, match="line 2"):
        read_records(path)


def test_files_that_are_not_logs_get_clear_errors(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(LogFormatError, match="empty"):
        read_log(tmp_path / "empty.jsonl")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(LogFormatError, match="not a cockpit log"):
        read_log(tmp_path / "list.json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(LogFormatError, match="without 'output'"):
        read_log(tmp_path / "other.json")
    with pytest.raises(FileNotFoundError):
        read_log(tmp_path / "missing.jsonl")


def test_fsync_interval(tmp_path, monkeypatch):
    import cockpit_core.log.write as log_write

    calls = []
    clock = [0.0]
    monkeypatch.setattr(log_write.os, "fsync", lambda fd: calls.append(fd))
    monkeypatch.setattr(log_write.time, "monotonic", lambda: clock[0])

    writer = LogWriter(tmp_path / "a.jsonl", fsync_every=5.0)
    for t in (1.0, 2.0, 5.5, 6.0, 10.0, 10.6):  # syncs at 5.5 and 10.6 (>= 5 s after 5.5)
        clock[0] = t
        writer({"kind": "values", "step": int(t * 10), "values": {}})
    assert len(calls) == 2
    writer.close()
    assert len(calls) == 3  # close always syncs

    calls.clear()
    writer = LogWriter(tmp_path / "b.jsonl", fsync_every=0)
    for step in range(4):
        writer({"kind": "values", "step": step, "values": {}})
    assert len(calls) == 4

    calls.clear()
    writer = LogWriter(tmp_path / "c.jsonl", fsync_every=None)
    writer({"kind": "values", "step": 0, "values": {}})
    writer.close()
    assert calls == []
    with pytest.raises(ValueError, match="fsync_every"):
        LogWriter(tmp_path / "d.jsonl", fsync_every=-1)


def test_each_record_is_on_disk_before_the_writer_returns(tmp_path):
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path, fsync_every=None)
    writer({"kind": "values", "step": 0, "values": {"loss": 1.0}})
    assert read_log(path) == {0: {"loss": 1.0}}  # flushed, though not closed
    writer.close()


def test_odd_values_are_logged_as_placeholders_and_tensors_as_arrays(tmp_path):
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer({"kind": "values", "step": 0, "values": {"obj": object(), "t": torch.ones(2)}})
        writer({"kind": "values", "step": 1, "values": {"obj": object()}})
    writer.close()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1  # once per type
    assert messages[0].startswith(
        "cockpit log: a value in a 'values' record cannot be logged as it is; it was written "
        "as the placeholder string '<unserializable: object object <object object at 0x"
    )
    out = read_log(path)
    assert out[0]["obj"].startswith("<unserializable: object object <object object at")
    np.testing.assert_array_equal(out[0]["t"], np.ones(2, dtype=np.float32))


def test_cockpit_log_fsync_option_reaches_the_writer(tmp_path):
    result = run_cockpit(
        tiny_mlp(), ["loss"], steps=1, log=tmp_path / "l.jsonl", log_fsync_every=None
    )
    assert result.cockpit._log.fsync_every is None
    result.cockpit.close()
