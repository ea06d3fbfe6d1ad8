"""The reader is bounded and total: crafted files give LogFormatError with file and line (issue 17)."""

import base64
import json
import tracemalloc
import warnings
import zlib

import json_tricks
import numpy as np
import pytest

import cockpit_core.log.format as log_format
from cockpit_core.log import (
    MAX_ARRAY_ELEMENTS,
    MAX_DECODED_BYTES,
    MAX_DECODED_RATIO,
    LogFormatError,
    LogWriter,
    UnsafeLogError,
    loads,
    read_log,
    read_records,
    read_run,
)

HEADER = '{"kind":"header","quantities":[]}'
GOOD = '{"kind":"values","step":0,"values":{"loss":1.0}}'


def write_log(path, bad_line):
    """A log whose line 3 is ``bad_line`` between two good records."""
    path.write_text(f"{HEADER}\n{GOOD}\n{bad_line}\n" + GOOD.replace('"step":0', '"step":1'))
    return path


def bomb_entry(bomb, shape, inflated_mib=2300, dtype="float64"):
    return {"__ndarray__": "b64.gz:" + bomb(inflated_mib), "dtype": dtype, "shape": shape}


def peak_of(fn):
    """Peak bytes traced by ``tracemalloc`` while ``fn`` runs, and its exception."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - returned to the test
            return tracemalloc.get_traced_memory()[1], err
        return tracemalloc.get_traced_memory()[1], None
    finally:
        tracemalloc.stop()


# -- decompression bombs and declared sizes ---------------------------------------------------


def test_a_compressed_bomb_is_never_inflated_beyond_its_declared_size(tmp_path, bomb):
    entry = bomb_entry(bomb, [10])  # 2.3 GiB of zeros declared as 10 float64 (80 bytes)
    line = json.dumps({"kind": "values", "step": 2, "values": {"w": entry}})
    assert len(line) < 3_500_000
    path = write_log(tmp_path / "log.jsonl", line)
    peak, err = peak_of(lambda: read_run(path))
    assert isinstance(err, LogFormatError)
    assert str(err) == (
        f"{path}, line 3: a compressed numpy array entry inflates to more than the 80 bytes "
        "its shape [10] and dtype float64 declare; it was not inflated further (a "
        "decompression bomb?)."
    )
    assert peak < 4 * len(line) + (8 << 20)  # the line and its base64 decoding, not 2.3 GB


def test_a_declared_shape_beyond_the_limit_is_refused_before_allocating(tmp_path, bomb):
    entry = bomb_entry(bomb, [2**31], 8)
    line = json.dumps({"kind": "values", "step": 2, "values": {"w": entry}})
    path = write_log(tmp_path / "log.jsonl", line)
    peak, err = peak_of(lambda: read_run(path))
    assert str(err) == (
        f"{path}, line 3: a numpy array entry of shape [2147483648] declares 2147483648 "
        f"elements, more than the limit of {MAX_ARRAY_ELEMENTS} (max_array_elements); nothing "
        "was allocated."
    )
    assert peak < 4 * len(line) + (4 << 20)


def test_the_element_limit_can_be_lowered(tmp_path):
    entry = {"__ndarray__": list(range(20)), "dtype": "int64", "shape": [20]}
    path = write_log(
        tmp_path / "log.jsonl", json.dumps({"kind": "values", "step": 2, "values": {"w": entry}})
    )
    assert read_log(path)[2]["w"].shape == (20,)
    with pytest.raises(LogFormatError, match="declares 20 elements, more than the limit of 10"):
        read_log(path, max_array_elements=10)


def test_legitimate_compact_json_tricks_arrays_are_read(tmp_path):
    arrays = {"z": np.zeros(1000), "r": np.arange(12, dtype=np.int32).reshape(3, 4)}
    text = json_tricks.dumps(arrays, properties={"ndarray_compact": True})
    assert "b64.gz:" in text and "b64:" in text
    back = loads(text)
    for key, array in arrays.items():
        assert back[key].dtype == array.dtype
        np.testing.assert_array_equal(back[key], array)
    zlib_form = {"__ndarray__": "b64.gz:" + base64.b64encode(zlib.compress(bytes(16))).decode()}
    zlib_form.update(dtype="uint8", shape=[16])
    np.testing.assert_array_equal(loads(json.dumps(zlib_form)), np.zeros(16, dtype=np.uint8))


# -- the decoded-bytes budget of a read -------------------------------------------------------

BUDGET_MESSAGE = (
    "a numpy array entry of shape [1048576] and dtype float64 needs 8388608 bytes, more than "
    "the {left} that the arrays of this read may still take (max_decoded_bytes = {base} plus "
    "8 bytes per byte of text read); nothing was allocated (a decompression bomb?)."
)


def test_many_compressed_arrays_in_one_line_stay_within_the_decoded_bytes_budget(tmp_path, bomb):
    arrays = {f"w{i}": bomb_entry(bomb, [2**20], inflated_mib=8) for i in range(32)}
    line = json.dumps({"kind": "values", "step": 2, "values": arrays})
    path = write_log(tmp_path / "log.jsonl", line)
    budget = MAX_DECODED_BYTES + MAX_DECODED_RATIO * len(f"{HEADER}\n{GOOD}\n{line}\n")
    assert 32 * (8 << 20) > 10 * budget  # all 32 arrays would take 256 MiB
    peak, err = peak_of(lambda: read_run(path))
    left = budget - 2 * (8 << 20)  # w0 and w1 fit, w2 does not
    assert str(err) == f"{path}, line 3: " + BUDGET_MESSAGE.format(left=left, base=2**24)
    assert peak < budget + (8 << 20) + 4 * len(line)  # + the array being inflated, the line


def test_the_budget_spans_the_whole_file_and_can_be_raised(tmp_path, bomb):
    entry = bomb_entry(bomb, [2**20], inflated_mib=8)
    lines = [json.dumps({"kind": "values", "step": s, "values": {"w": entry}}) for s in range(4)]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    left = MAX_DECODED_BYTES + MAX_DECODED_RATIO * 3 * (len(lines[0]) + 1) - 2 * (8 << 20)
    for reader in (read_run, read_records):
        with pytest.raises(LogFormatError) as err:
            reader(path)
        assert str(err.value) == f"{path}, line 3: " + BUDGET_MESSAGE.format(left=left, base=2**24)
    assert sorted(read_run(path, max_decoded_bytes=32 << 20).output) == [0, 1, 2, 3]
    assert loads(lines[0])["values"]["w"].nbytes == 8 << 20
    with pytest.raises(LogFormatError) as err:
        loads(lines[0], max_decoded_bytes=0)
    assert str(err.value) == BUDGET_MESSAGE.format(left=MAX_DECODED_RATIO * len(lines[0]), base=0)


def test_what_cockpit_writes_decodes_within_the_ratio_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(log_format, "MAX_DECODED_BYTES", 0)  # no allowance: only the ratio
    hist = np.zeros((40, 50), np.int64)  # the densest arrays cockpit writes: 2-D histograms
    per_param = np.zeros((3, 40, 50), np.int64)  # of int64 counts, mostly 0 ("0," per 8 bytes)
    others = [np.zeros(3, np.complex128), np.zeros(7, bool), np.zeros(2, np.uint64)]
    values = {"grad_hist_2d": {"hist": hist, "per_param": per_param}, "others": others}
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    writer({"kind": "values", "step": 0, "values": values})
    writer.close()
    decoded = sum(a.nbytes for a in (hist, per_param, *others))
    assert 3.5 < decoded / path.stat().st_size <= MAX_DECODED_RATIO / 2
    back = read_run(path).output[0]
    np.testing.assert_array_equal(back["grad_hist_2d"]["per_param"], per_param)
    assert [a.dtype for a in back["others"]] == [a.dtype for a in others]


# -- every malformed entry is a LogFormatError naming file and line ---------------------------

CRAFTED = {  # bad line 3 -> message after "{path}, line 3: "
    "array without shape": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":[1,2],"dtype":"int64"}}}',
        "a numpy array entry has no 'shape'.",
    ),
    "negative shape": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":[],"dtype":"int64","shape":[-1]}}}',
        "a numpy array entry has the shape [-1]; a shape is a list of at most 64 non-negative "
        "integers.",
    ),
    "shape mismatch": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":[1,2,3],"dtype":"int64","shape":[2]}}}',
        "a numpy array entry declares shape [2] but holds data of shape [3].",
    ),
    "ragged": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":[[1],[1,2]],"dtype":"int64","shape":[2,2]}}}',
        "a numpy array entry holds nested lists of unequal lengths or other things than numbers.",
    ),
    "floats in an int array": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":[1.5],"dtype":"int8","shape":[1]}}}',
        "a numpy array entry of dtype int8 holds values of another kind (float64).",
    ),
    "strings in a float array": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":["1e5"],"dtype":"float64","shape":[1]}}}',
        "a numpy array entry of dtype float64 holds values of another kind (<U3).",
    ),
    "int overflowing its dtype": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":[300],"dtype":"int8","shape":[1]}}}',
        "a numpy array entry of dtype int8 holds integers outside its range.",
    ),
    "int overflowing int64 in an array": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":[-1, 18446744073709551616],"dtype":"int64","shape":[2]}}}',
        "a numpy array entry of dtype int64 holds values of another kind (object).",
    ),
    "overflowing integer literal": (
        '{"kind":"values","step":2,"values":{"n":' + "9" * 5000 + "}}",
        "an integer literal with 5000 digits (cockpit writes at most 20; larger integers are "
        "'__int__' entries).",
    ),
    "overflowing __int__": (
        '{"kind":"values","step":2,"values":{"n":{"__int__":"0x' + "f" * 300_000 + '"}}}',
        "an int entry must hold a hexadecimal string of at most 1048576 bits.",
    ),
    "step Infinity": (
        '{"kind":"values","step":Infinity,"values":{}}',
        "'step' must be an integer, got inf.",
    ),
    "step 1e999": (
        '{"kind":"values","step":1e999,"values":{}}',
        "'step' must be an integer, got inf.",
    ),
    "step as text": (
        '{"kind":"values","step":"2","values":{}}',
        "'step' must be an integer, got '2'.",
    ),
    "step true": (
        '{"kind":"values","step":true,"values":{}}',
        "'step' must be an integer, got True.",
    ),
    "values not an object": (
        '{"kind":"values","step":2,"values":[1]}',
        "'values' must be a JSON object.",
    ),
    "100k-deep nesting": (
        '{"kind":"values","step":2,"values":{"a":' + "[" * 100_000 + "]" * 100_000 + "}}",
        "nesting deeper than the JSON parser allows (Python's recursion limit); cockpit writes "
        "at most 64 levels of nested values.",
    ),
    "bad complex": (
        '{"kind":"values","step":2,"values":{"c":{"__complex__":[1]}}}',
        "a complex entry must hold [real, imag], two numbers.",
    ),
    "bad base64": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":"b64:%%%","dtype":"uint8","shape":[2]}}}',
        "a numpy array entry holds invalid base64 data.",
    ),
    "base64 longer than declared": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":"b64:AAAAAAAA","dtype":"uint8","shape":[2]}}}',
        "a numpy array entry holds 8 base64 characters, more than the 2 bytes its shape [2] "
        "and dtype uint8 need.",
    ),
    "bad gzip": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":"b64.gz:AAAA","dtype":"uint8","shape":[2]}}}',
        "a numpy array entry holds invalid compressed data.",
    ),
    "unknown endian": (
        '{"kind":"values","step":2,"values":{"w":{"__ndarray__":"b64:AAA=","dtype":"uint8","shape":[2],"endian":"middle"}}}',
        "a numpy array entry has an unknown 'endian' 'middle'.",
    ),
    "not an object": ("[1, 2]", None),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_lines_give_log_format_error_with_file_and_line(tmp_path, case):
    line, message = CRAFTED[case]
    path = write_log(tmp_path / "log.jsonl", line)
    for reader in (read_run, read_records, read_log):
        with pytest.raises(LogFormatError) as err:
            reader(path)
        expected = (
            f"{path}, line 3 is not a JSON object."
            if message is None
            else f"{path}, line 3: {message}"
        )
        assert str(err.value) == expected


@pytest.mark.parametrize(
    "dtype", ["float128", "object", "O", "<f8", "datetime64[s]", "complex256", None, [1]]
)
def test_wrong_dtypes_are_refused_as_unsafe(tmp_path, dtype):
    entry = {"__ndarray__": [1], "dtype": dtype, "shape": [1]}
    path = write_log(
        tmp_path / "log.jsonl", json.dumps({"kind": "values", "step": 2, "values": {"w": entry}})
    )
    with pytest.raises(UnsafeLogError) as err:
        read_run(path)
    assert str(err.value).startswith(f"{path}, line 3: refusing numpy dtype {dtype!r}")
    assert isinstance(err.value, LogFormatError)


def test_a_line_longer_than_the_limit_is_refused(tmp_path):
    path = write_log(
        tmp_path / "log.jsonl", '{"kind":"values","step":2,"values":{"s":"' + "x" * 500 + '"}}'
    )
    assert sorted(read_log(path)) == [0, 1, 2]
    with pytest.raises(LogFormatError) as err:
        read_log(path, max_line_bytes=200)
    assert str(err.value) == (
        f"{path}, line 3 is longer than the limit of 200 bytes; pass a larger max_line_bytes "
        "to read it anyway."
    )


# -- consolidated files ----------------------------------------------------------------------

CONSOLIDATED = {
    "truncated": (
        '{"header": {}, "output": {"0": {"loss": 1.0}, "1": {"lo',
        "line 1: not valid JSON (Unterminated string starting at); a file cut short, or not a "
        "cockpit log.",
    ),
    "step key not a number": (
        '{"header": {}, "output": {"x": {}}}',
        "'output' must map step numbers to values.",
    ),
    "huge step key": (
        '{"output": {"' + "1" * 5000 + '": {}}}',
        "'output' must map step numbers to values.",
    ),
    "values not an object": ('{"output": {"1": 5}}', "'output' must map step numbers to values."),
    "errors not a list": (
        '{"output": {}, "errors": 3}',
        "'header' must be an object, 'errors' and 'skipped' lists of objects.",
    ),
    "deep": (
        '{"output": {"0": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}}",
        "line 1: nesting deeper than the JSON parser allows (Python's recursion limit); cockpit "
        "writes at most 64 levels of nested values.",
    ),
    "bad array, pretty-printed": (
        '{\n "output": {"0": {"w": {"__ndarray__": [1], "dtype": "int64"}}}\n}',
        "lines 1-3: a numpy array entry has no 'shape'.",
    ),
    "bad array after blank lines": (
        '\n\n{"output": {"0": {"w": {"__ndarray__": [1], "dtype": "int64"}}}}\n',
        "line 3: a numpy array entry has no 'shape'.",
    ),
}


@pytest.mark.parametrize("case", sorted(CONSOLIDATED))
def test_malformed_consolidated_files_give_log_format_error(tmp_path, case):
    text, message = CONSOLIDATED[case]
    path = tmp_path / "output.json"
    path.write_text(text)
    with pytest.raises(LogFormatError) as err:
        read_run(path)
    sep = ", " if message.startswith("line") else ": "
    if case == "truncated":  # json's message names the column; compare the start and end
        assert str(err.value).startswith(f"{path}, line 1: not valid JSON (Unterminated string")
        assert str(err.value).endswith("; a file cut short, or not a cockpit log.")
    else:
        assert str(err.value) == f"{path}{sep}{message}"


NOT_A_LOG = {  # the file as a whole -> message after "{path} is not a cockpit log: the file "
    "empty": (b"", "is empty or blank."),
    "blank": (b"\n \n\t\n", "is empty or blank."),
    "not UTF-8": (b'{"output": {"0": {"s": "\xff"}}}\n', "is not UTF-8 text."),
    "notes": (b"\nsome notes\n", "does not start with a JSON object."),
    "a single array entry": (
        b'{"__ndarray__": [1], "dtype": "int64", "shape": [1]}\n',
        "holds a single number or array entry, not a JSON object.",
    ),
    "a config file": (
        b'{"quantities": ["loss"]}',
        "is a JSON object without 'output' (write a log with Cockpit(..., "
        "log='run/log.jsonl') or cp.write('run/output.json')).",
    ),
}


@pytest.mark.parametrize("case", sorted(NOT_A_LOG))
def test_a_file_that_is_not_a_log_is_refused_as_a_whole(tmp_path, case):
    content, message = NOT_A_LOG[case]
    path = tmp_path / "file.json"
    path.write_bytes(content)
    for reader in (read_run, read_log):
        with pytest.raises(LogFormatError) as err:
            reader(path)
        assert str(err.value) == f"{path} is not a cockpit log: the file {message}"


def test_a_torn_only_line_of_a_log_is_an_empty_run_with_a_warning(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"kind":"header","quant')
    with pytest.warns(UserWarning, match="torn last line"):
        assert read_run(path).output == {}


# -- old logs still read ---------------------------------------------------------------------


def test_logs_in_the_version_1_layout_still_read(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(
        '{"kind":"header","cockpit_core":"0.1.0","quantities":[],"params":[],"log_format":1}\n'
        '{"kind":"values","step":0,"values":{"g":{"total":0.5,"per_param":{"__ndarray__":'
        '[[0.25,0.5],[1.0,NaN]],"dtype":"float64","shape":[2,2],"Corder":true}},'
        '"c":{"__complex__":[1.0,2.0]},"ca":{"__ndarray__":[{"__complex__":[1.0,-1.0]}],'
        '"dtype":"complex128","shape":[1]},"big":4611686018427387904}}\n'
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = read_run(path)
    assert run.header["log_format"] == 1 and run.headers == [run.header]
    values = run.output[0]
    np.testing.assert_array_equal(values["g"]["per_param"], [[0.25, 0.5], [1.0, np.nan]])
    assert values["c"] == 1 + 2j and values["big"] == 2**62
    np.testing.assert_array_equal(values["ca"], np.array([1 - 1j]))


def test_arrays_are_written_as_checkable_lists(tmp_path):
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    writer({"kind": "values", "step": 0, "values": {"a": np.arange(4.0).reshape(2, 2)}})
    writer.close()
    assert (
        '{"__ndarray__":[[0.0,1.0],[2.0,3.0]],"dtype":"float64","shape":[2,2]}' in path.read_text()
    )
