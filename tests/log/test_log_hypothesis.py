"""Property-based tests: any returned value survives training and the log; the reader is total.

(a) Random return values (nested containers, tensors of every dtype and layout, numpy
scalars and arrays including ``np.longdouble``, huge ints, NaN, marker-like and non-string
keys, cycles, deep nesting) go through a quantity in a real training run; the log read back
holds every step, each value faithful or the documented placeholder, and one ``serialize``
error per step whose value needed a placeholder or rounding (issue 17).

(b) The reader, fed random bytes, random JSON and mutated valid logs, only ever returns
values or raises ``LogFormatError`` naming a line of the file (or saying that the file as a
whole is not a log); a decompression bomb of any declared shape stays within a memory bound.
"""

import copy
import json
import math
import re
import tracemalloc
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cockpit_core.log import (
    MAX_ARRAY_ELEMENTS,
    MAX_VALUE_DEPTH,
    LogData,
    LogFormatError,
    LogWriter,
    read_records,
    read_run,
)
from cockpit_core.testing import run_cockpit, tiny_mlp

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch betas, cockpit notes

# -- (a) random return values through training --------------------------------------------

LOW_PRECISION = {torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2}
LOGGED_DTYPE = {  # the documented mapping of tensor dtypes (others keep their dtype)
    torch.bfloat16: "float32",
    torch.float8_e4m3fn: "float32",
    torch.float8_e5m2: "float32",
    torch.complex32: "complex64",
}
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    *sorted(LOW_PRECISION, key=str),
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
]
LAYOUTS = ["strided", "sparse_coo", "sparse_csr", "meta", "requires_grad", "conj", "transposed"]
NUMPY_DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    np.longdouble,
    np.clongdouble,
]
ODD_KEYS = ["__x__", "__ndarray__", "__complex__", "__int__", "~__x__", "~~__int__", "dtype", "__"]
HUGE_INTS = [2**64, -(2**63) - 1, 10**400, 10**4000, -(3**8000)]  # repr-able by hypothesis
PH = "<unserializable: "


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(LAYOUTS))
    if layout == "sparse_csr":
        shape = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    else:
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
    n = math.prod(shape)
    numbers = draw(st.lists(st.integers(-120, 120), min_size=n, max_size=n))
    if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        numbers = [abs(x) for x in numbers]
    t = torch.tensor(numbers, dtype=torch.float64).reshape(shape) / draw(st.sampled_from([1, 4]))
    t = t.to(dtype)
    try:
        if layout == "sparse_coo":
            t = t.to_sparse()
        elif layout == "sparse_csr":
            t = t.to_sparse_csr()
        elif layout == "meta":
            t = t.to("meta")
        elif layout == "requires_grad":
            t = t.requires_grad_() * 1
        elif layout == "conj" and t.is_complex() and dtype != torch.complex32:
            t = t.conj()
        elif layout == "transposed" and t.ndim >= 2:
            t = t.transpose(0, 1)
    except (RuntimeError, TypeError, NotImplementedError):
        pass  # a layout this dtype does not support: keep the plain tensor
    return t


@st.composite
def numpy_values(draw):
    dtype = draw(st.sampled_from(NUMPY_DTYPES))
    floats = st.floats(allow_nan=True, allow_infinity=True, width=16)
    if np.dtype(dtype).kind in "iub":
        info = np.iinfo(dtype) if np.dtype(dtype).kind != "b" else None
        lo, hi = (0, 1) if info is None else (max(info.min, -1000), min(info.max, 1000))
        element = st.integers(lo, hi)
    elif dtype in (np.longdouble, np.clongdouble):
        element = st.one_of(floats, st.sampled_from(["1e4000", "-1e-4000", "0.1"]))
    else:
        element = floats
    if draw(st.booleans()):  # a scalar
        x = draw(element)
        return dtype(x) if not isinstance(x, str) else dtype(np.longdouble(x))
    shape = draw(st.lists(st.integers(0, 3), max_size=2))
    items = draw(st.lists(element, min_size=math.prod(shape), max_size=math.prod(shape)))
    if dtype in (np.longdouble, np.clongdouble):
        items = [np.longdouble(x) for x in items]
    with np.errstate(all="ignore"):
        return np.array(items, dtype=dtype).reshape(shape)


def deep(n):
    value = 0
    for _ in range(n):
        value = [value]
    return value


def cyclic(value):
    box = [value]
    box.append(box)
    return box


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from(HUGE_INTS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    tensors(),
    numpy_values(),
    st.just(deep(MAX_VALUE_DEPTH + 5)),
)
keys = st.one_of(st.text(max_size=3), st.sampled_from(ODD_KEYS), st.integers(-2, 2), st.booleans())
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(keys, inner, max_size=3).filter(
            lambda d: len({str(k) for k in d}) == len(d)
        ),
        inner.map(cyclic),
    ),
    max_leaves=6,
)


class Expect:
    """The documented mapping, written independently of the implementation."""

    def __init__(self):
        self.lossy = False

    def placeholder(self, reason):
        self.lossy = True
        return PH + reason + ">"

    def __call__(self, v, depth=0, active=()):
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if isinstance(v, (np.ndarray, np.generic)):
            return self.numpy(v)
        if isinstance(v, bool) or v is None or isinstance(v, (float, str)):
            return v
        if isinstance(v, int):
            return (
                v if v.bit_length() <= 2**20 else self.placeholder(f"int of {v.bit_length()} bits")
            )
        if depth >= MAX_VALUE_DEPTH:
            return self.placeholder(f"nesting deeper than {MAX_VALUE_DEPTH} levels")
        if id(v) in active:
            return self.placeholder(f"a {type(v).__name__} that contains itself")
        inner = (*active, id(v))
        if isinstance(v, dict):
            return {str(k): self(x, depth + 1, inner) for k, x in v.items()}
        return [self(x, depth + 1, inner) for x in v]

    def tensor(self, t):
        if t.is_meta:
            return self.placeholder(f"meta tensor of shape {list(t.shape)}")
        try:
            wide = t.detach().to(torch.complex128 if t.is_complex() else torch.float64)
            wide = wide.to_dense() if wide.layout != torch.strided else wide
        except (RuntimeError, NotImplementedError):  # torch cannot convert it either
            return self.placeholder("")[:-1]  # compared by prefix
        wide = wide.resolve_conj()
        dtype = LOGGED_DTYPE.get(t.dtype, str(t.dtype).removeprefix("torch."))
        array = wide.numpy().astype(dtype)
        return array[()].item() if array.ndim == 0 else array

    def numpy(self, x):
        array = np.asarray(x)
        if array.dtype in (np.longdouble, np.clongdouble):
            target = np.complex128 if array.dtype.kind == "c" else np.float64
            with np.errstate(all="ignore"):
                wide = array.astype(target)
            if np.any(np.isfinite(array) & ~np.isfinite(wide)):
                what = "scalar" if array.ndim == 0 else f"array of shape {list(array.shape)}"
                return self.placeholder(
                    f"{array.dtype} {what} with values beyond the float64 range"
                )
            if not np.array_equal(wide.astype(array.dtype), array, equal_nan=True):
                self.lossy = True  # rounded to float64: written, with an error record
            array = wide
        return array[()].item() if array.ndim == 0 else array


def _r(x):
    """A short repr that works for ints beyond str()'s digit limit."""
    if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 64:
        return f"int of {x.bit_length()} bits"
    try:
        return repr(x)[:200]
    except ValueError:
        return f"<{type(x).__name__}>"


def same(expected, got, where="value"):
    """Deep comparison of a value read back with what ``Expect`` says was written.

    Dicts (keys and their order) and lists are compared element by element, so a difference
    anywhere fails; arrays by dtype, shape and values (NaN equals NaN); placeholders (cycles,
    nesting, big ints, meta tensors, ...) as exact strings, except ``PH`` alone (a tensor that
    torch cannot convert either), which any placeholder matches.
    """

    def check(ok):
        assert ok, f"{where}: expected {_r(expected)}, got {_r(got)}"

    if isinstance(expected, np.ndarray):
        check(isinstance(got, np.ndarray) and got.dtype == expected.dtype)
        check(got.shape == expected.shape and np.array_equal(got, expected, equal_nan=True))
    elif isinstance(expected, dict):
        check(isinstance(got, dict) and list(got) == list(expected))
        for key, value in expected.items():
            same(value, got[key], f"{where}[{key!r}]")
    elif isinstance(expected, list):
        check(isinstance(got, list) and len(got) == len(expected))
        for i, (a, b) in enumerate(zip(expected, got)):
            same(a, b, f"{where}[{i}]")
    elif isinstance(expected, float) and math.isnan(expected):
        check(isinstance(got, float) and math.isnan(got))
    elif isinstance(expected, complex):
        check(type(got) is complex and np.array_equal(got, expected, equal_nan=True))
    elif expected == PH:  # a placeholder of any reason
        check(isinstance(got, str) and got.startswith(PH))
    else:
        check(type(got) is type(expected) and got == expected)


LONG = {"v": [list(range(300)), [0.5] * 300 + [{"a": np.arange(3.0)}], PH + "x>"]}
CHANGES = {
    "an int at the end of a long list": (
        lambda v: v[0].__setitem__(299, 300),
        "value['v'][0][299]: expected 299, got 300",
    ),
    "an array element deep inside": (
        lambda v: v[1][300]["a"].__setitem__(2, 7.0),
        "value['v'][1][300]['a']: expected array([0., 1., 2.]), got array([0., 1., 7.])",
    ),
    "another placeholder": (
        lambda v: v.__setitem__(2, PH + "y>"),
        "value['v'][2]: expected '<unserializable: x>', got '<unserializable: y>'",
    ),
}


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_same_finds_a_difference_deep_in_a_long_value(case):
    change, message = CHANGES[case]
    assert len(repr(LONG)) > 2000  # far beyond the 200 characters of _r
    same(LONG, copy.deepcopy(LONG))
    got = copy.deepcopy(LONG)
    change(got["v"])
    with pytest.raises(AssertionError) as err:
        same(LONG, got)
    assert str(err.value).startswith(message)


def test_the_bare_placeholder_prefix_matches_any_placeholder_only():
    same([PH], [PH + "tensor of dtype torch.uint16 and shape [2]>"])
    with pytest.raises(AssertionError) as err:
        same([PH], ["tensor"])
    assert str(err.value).startswith("value[0]: expected '<unserializable: ', got 'tensor'")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(drawn=st.lists(values, min_size=2, max_size=2))
def test_any_returned_value_is_logged_faithfully_or_as_a_placeholder(tmp_path, returning, drawn):
    log = tmp_path / "log.jsonl"
    log.unlink(missing_ok=True)
    registry = returning(lambda step: {"v": drawn[step]})  # None alone would record nothing
    result = run_cockpit(tiny_mlp(), ["odd"], steps=2, registry=registry, log=log)
    cp = result.cockpit
    assert cp._log in cp.sinks
    cp.close()
    run = read_run(log)
    assert sorted(run.output) == [0, 1]  # training went on and every step was recorded
    lossy_steps = set()
    for step, value in enumerate(drawn):
        expect = Expect()
        same(expect({"v": value}), run.output[step]["odd"])
        if expect.lossy:
            lossy_steps.add(step)
    errors = [e for e in run.errors if e["phase"] == "serialize"]
    assert {e["step"] for e in errors} == lossy_steps
    assert (
        len(errors) == len(lossy_steps) == len([e for e in cp.errors if e["phase"] == "serialize"])
    )


# -- (b) the reader never fails otherwise than with LogFormatError -------------------------


def _valid_log_bytes():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "log.jsonl"
        writer = LogWriter(path, fsync_every=None)
        writer({"kind": "header", "quantities": [{"name": "a", "key": "a"}]})
        writer({"kind": "values", "step": 0, "values": {"a": np.arange(6.0).reshape(2, 3)}})
        writer({"kind": "values", "step": 1, "values": {"a": {"__x__": [1 + 2j, 10**30, None]}}})
        writer({"kind": "values", "step": 2, "values": {"a": np.array([1 + 1j, np.nan])}})
        writer({"kind": "error", "step": 2, "quantity": "a", "phase": "single", "error": "E"})
        writer({"kind": "skipped", "step": 3, "quantities": ["a"], "reason": "nan"})
        writer.close()
        return path.read_bytes()


VALID = _valid_log_bytes()
TOKENS = [
    b"Infinity",
    b"-Infinity",
    b"NaN",
    b"1e999",
    b"9" * 400,
    b"[" * 2000,
    b"]",
    b"{",
    b"}",
    b'"__ndarray__"',
    b'"__int__"',
    b'"__complex__"',
    b'"__instance_type__"',
    b'"shape"',
    b'"dtype":"object"',
    b'"b64.gz:H4sI',
    b"\n",
    b"\xff\xfe",
    b",",
    b":",
    b'"',
    b"\\u0000",
    b"-",
    b"0x",
]


WHOLE_FILE = (  # the messages about a file as a whole, which name no line
    " is not a cockpit log: the file ",
    ": 'output' must map step numbers to values.",
    ": 'header' must be an object, 'errors' and 'skipped' lists of objects.",
)


def _check_message(err, path, data):
    """The message names the file, then a line of it that exists or the file as a whole."""
    message = str(err)
    assert message.startswith(f"{path}"), message
    rest = message[len(str(path)) :]
    where = re.match(r", lines? (?:1-)?(\d+)[: ]", rest)
    if where:
        assert 1 <= int(where[1]) <= data.count(b"\n") + 1, message
    else:
        assert rest.startswith(WHOLE_FILE), message


def _read_or_format_error(data, tmp_path):
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for reader in (read_run, read_records):
            try:
                result = reader(path)
            except LogFormatError as err:
                _check_message(err, path, data)
                continue
            if reader is read_run:
                assert isinstance(result, LogData)
                assert all(type(s) is int and isinstance(v, dict) for s, v in result.output.items())
            else:
                assert all(isinstance(r, dict) for r in result)


FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes_give_values_or_log_format_error(tmp_path, data):
    _read_or_format_error(data, tmp_path)


json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([float("nan"), float("inf"), 1e308, -0.0]),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(["b64:AAAA", "b64.gz:H4sIAAAAAAAC/2NgGAWjYBSMglEwCkbBKBgFAAAA//8=", "0x1f"]),
    st.sampled_from(["float64", "int8", "bool", "complex128", "object", "uint64"]),
)
json_keys = st.one_of(
    st.text(max_size=4),
    st.sampled_from(
        ["__ndarray__", "dtype", "shape", "Corder", "endian", "__complex__", "__int__", "~__a__"]
        + ["kind", "step", "values", "header", "output", "errors", "skipped", "__set__"]
    ),
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_keys, inner, max_size=4),
    max_leaves=12,
)
records = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"kind": st.sampled_from(["header", "values", "error", "skipped", "x"])},
        optional={"step": json_values, "values": json_values, "run": json_values},
    ),
)


@FUZZ
@given(lines=st.lists(records, min_size=1, max_size=4), pretty=st.booleans())
def test_random_json_gives_values_or_log_format_error(tmp_path, lines, pretty):
    if pretty:
        text = json.dumps({"output": lines[0], "header": lines[-1]}, indent=1, allow_nan=True)
    else:
        text = "\n".join(json.dumps(r, allow_nan=True) for r in lines)
    _read_or_format_error(text.encode(), tmp_path)


mutation = st.tuples(
    st.sampled_from(["insert", "delete", "replace", "truncate"]),
    st.integers(0, len(VALID)),
    st.integers(1, 40),
    st.sampled_from(TOKENS),
)


@FUZZ
@given(mutations=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_valid_logs_give_values_or_log_format_error(tmp_path, mutations):
    data = VALID
    for op, at, length, token in mutations:
        at = min(at, len(data))
        if op == "insert":
            data = data[:at] + token + data[at:]
        elif op == "delete":
            data = data[:at] + data[at + length :]
        elif op == "replace":
            data = data[:at] + token + data[at + len(token) :]
        else:
            data = data[:at]
    _read_or_format_error(data, tmp_path)


# -- decompression bombs: peak memory bounded whatever the declared shape -----------------


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    size=st.sampled_from([(1, "gzip"), (64, "zlib"), (2300, "gzip"), (2300, "zlib")]),
    shape=st.one_of(
        st.lists(st.integers(0, 2**10), max_size=2),
        st.lists(st.sampled_from([2**20, 2**31, 10**30]), min_size=1, max_size=2),
    ),
    dtype=st.sampled_from(["uint8", "float64", "complex128", "bool"]),
)
def test_a_bomb_of_any_declared_shape_stays_within_a_memory_bound(
    tmp_path, bomb, size, shape, dtype
):
    declared = math.prod(shape) * np.dtype(dtype).itemsize
    if math.prod(shape) > MAX_ARRAY_ELEMENTS:
        declared = 0  # refused before anything is decoded
    entry = {"__ndarray__": "b64.gz:" + bomb(*size), "dtype": dtype, "shape": shape}
    line = json.dumps({"kind": "values", "step": 0, "values": {"w": entry}})
    path = tmp_path / "bomb.jsonl"
    path.write_text(line + "\n")
    tracemalloc.start()
    try:
        try:
            output = read_run(path).output
            assert output[0]["w"].nbytes == declared  # a real array, of its declared size
        except LogFormatError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * len(line) + 3 * declared + (8 << 20)  # not the inflated size
