"""Every value a quantity returns is logged faithfully or as a documented placeholder (issue 17)."""

import math
import warnings

import numpy as np
import pytest
import torch

from cockpit_core.engine.normalize import serialization_notes, to_serializable
from cockpit_core.log import (
    MAX_VALUE_DEPTH,
    Placeholder,
    clean_value,
    dumps,
    loads,
    read_records,
    read_run,
    unserializable_notes,
)
from cockpit_core.testing import run_cockpit, tiny_mlp

pytestmark = pytest.mark.filterwarnings(
    "ignore:(ComplexHalf|Sparse CSR|torch.quantize_per_tensor).*:UserWarning"
)


def roundtrip(value):
    """What the log reads back for ``value`` (cleaned as run_tasks does, then written)."""
    return loads(dumps({"v": to_serializable(value)}))["v"]


def _array(value, dtype):
    assert isinstance(value, np.ndarray), value
    assert value.dtype == np.dtype(dtype)
    return value


# -- faithful mappings ---------------------------------------------------------------------

NAN = float("nan")
TENSOR_CASES = {  # id: (build the tensor, dtype read back, values read back)
    "bfloat16": (
        lambda: torch.tensor([1.5, -2.25, 2.0**127], dtype=torch.bfloat16),
        "float32",
        [1.5, -2.25, 2.0**127],
    ),
    "float8_e4m3fn": (
        lambda: torch.tensor([0.5, -448.0, 2.0**-6]).to(torch.float8_e4m3fn),
        "float32",
        [0.5, -448.0, 2.0**-6],
    ),
    "float8_e5m2": (
        lambda: torch.tensor([0.5, 57344.0]).to(torch.float8_e5m2),
        "float32",
        [0.5, 57344.0],
    ),
    "float16": (
        lambda: torch.tensor([65504.0, 2.0**-24, NAN], dtype=torch.float16),
        "float16",
        [65504.0, 2.0**-24, NAN],
    ),
    "complex64": (
        lambda: torch.tensor([1 + 2j, -0.5j], dtype=torch.complex64),
        "complex64",
        [1 + 2j, -0.5j],
    ),
    "complex32": (lambda: torch.tensor([1 + 2j]).to(torch.complex32), "complex64", [1 + 2j]),
    "conj_complex128": (
        lambda: torch.tensor([1 + 2j], dtype=torch.complex128).conj(),
        "complex128",
        [1 - 2j],
    ),
    "bool": (lambda: torch.tensor([True, False]), "bool", [True, False]),
    "int64": (lambda: torch.tensor([-(2**63), 2**63 - 1]), "int64", [-(2**63), 2**63 - 1]),
    "uint64": (lambda: torch.tensor([2**64 - 1], dtype=torch.uint64), "uint64", [2**64 - 1]),
    "uint16": (lambda: torch.tensor([65535], dtype=torch.uint16), "uint16", [65535]),
    "int8": (lambda: torch.tensor([-128, 127], dtype=torch.int8), "int8", [-128, 127]),
    "sparse_coo": (lambda: torch.eye(3).to_sparse(), "float32", np.eye(3)),
    "sparse_csr": (lambda: torch.eye(2, dtype=torch.float64).to_sparse_csr(), "float64", np.eye(2)),
    "requires_grad": (
        lambda: torch.ones(2, 3, requires_grad=True) * 2,
        "float32",
        np.full((2, 3), 2.0),
    ),
    "empty": (lambda: torch.zeros(2, 0, 3), "float32", np.zeros((2, 0, 3))),
    "quantized": (
        lambda: torch.quantize_per_tensor(torch.tensor([1.0, 2.5]), 0.5, 0, torch.qint8),
        "float32",
        [1.0, 2.5],
    ),
}


@pytest.mark.parametrize("case", sorted(TENSOR_CASES))
def test_tensors_of_every_dtype_and_layout_are_written_faithfully(case):
    build, dtype, expected = TENSOR_CASES[case]
    tensor = build()
    back = _array(roundtrip(tensor), dtype)
    expected = np.asarray(expected, dtype=dtype)
    assert back.shape == expected.shape
    np.testing.assert_array_equal(back, expected)
    assert serialization_notes(to_serializable(tensor)) == []


def test_zero_dim_tensors_and_numpy_scalars_become_python_numbers():
    assert roundtrip(torch.tensor(2.5, dtype=torch.bfloat16)) == 2.5
    assert roundtrip(torch.tensor(True)) is True
    assert roundtrip(np.float32(1.5)) == 1.5 and type(roundtrip(np.float32(1.5))) is float
    assert roundtrip(np.int64(-3)) == -3 and type(roundtrip(np.int64(-3))) is int
    assert roundtrip(np.uint64(2**64 - 1)) == 2**64 - 1
    assert roundtrip(np.complex64(1 + 2j)) == 1 + 2j
    assert roundtrip(np.bool_(False)) is False


@pytest.mark.parametrize(
    "number",
    [2**64, -(2**63) - 1, 10**5000, -(3**20000)],
    ids=["2**64", "-2**63-1", "1e5000", "-3**20000"],
)
def test_ints_beyond_64_bits_are_exact(number):
    line = dumps({"v": number})
    assert '"__int__"' in line
    back = loads(line)["v"]
    assert type(back) is int and back == number


def test_ints_of_more_than_a_million_bits_are_placeholders():
    value = to_serializable({"n": 1 << (2**20 + 1)})
    assert value["n"] == "<unserializable: int of 1048578 bits>"
    assert serialization_notes(value) == [
        "value['n'] was written as '<unserializable: int of 1048578 bits>'"
    ]


def test_nan_and_inf_survive_everywhere():
    back = roundtrip({"f": [math.nan, math.inf, -math.inf], "a": np.array([np.nan, -np.inf])})
    assert math.isnan(back["f"][0]) and back["f"][1:] == [math.inf, -math.inf]
    np.testing.assert_array_equal(back["a"], [np.nan, -np.inf])


def test_longdouble_values_are_written_as_float64_and_rounding_is_reported():
    exact = np.array([0.5, 1.0, np.nan], dtype=np.longdouble)  # float64 holds these exactly
    assert serialization_notes(to_serializable(exact)) == []
    np.testing.assert_array_equal(_array(roundtrip(exact), "float64"), [0.5, 1.0, np.nan])
    assert roundtrip(np.longdouble(2.5)) == 2.5
    third = np.array([1, 2], dtype=np.longdouble) / 3
    assert roundtrip(third).dtype == np.float64
    if np.finfo(np.longdouble).eps < np.finfo(np.float64).eps:  # x86: 80-bit long double
        assert serialization_notes(to_serializable({"x": third})) == [
            f"value['x'] ({third.dtype}) was rounded to float64"
        ]
        huge = np.array([np.longdouble("1e4000"), 1], dtype=np.longdouble)
        text = f"<unserializable: {huge.dtype} array of shape [2] with values beyond the float64 range>"
        assert roundtrip(huge) == text
        assert serialization_notes(to_serializable(huge)) == [f"value was written as '{text}'"]


def test_marker_like_keys_round_trip_as_data():
    value = {
        "__x__": 1,
        "__ndarray__": {"dtype": "object", "shape": [1]},
        "__instance_type__": ["os", "system"],
        "~__x__": 2,
        "~~__complex__": 3,
        "__": 4,
        "~": 5,
        "nested": [{"__int__": "0x10"}],
    }
    line = dumps(value)
    assert '"~__x__":1' in line and '"~~__x__":2' in line and '"~~~__complex__":3' in line
    assert loads(line) == value


def test_non_string_keys_become_strings_and_collisions_are_reported():
    value = to_serializable({1: "a", (2, 3): "b", None: "c", 1.5: "d"})
    assert value == {"1": "a", "(2, 3)": "b", "None": "c", "1.5": "d"}
    clash = to_serializable({1: "int", "1": "str"})
    assert list(clash) == [
        "1",
        "<unserializable: key '1' (str), which collides with another key written as '1'>",
    ]
    assert serialization_notes(clash) == [f"a key of value was written as '{list(clash)[1]}'"]
    assert roundtrip({1: "int", "1": "str"}) == dict(clash)


def test_tuples_and_sets_become_lists():
    assert roundtrip((1, (2.5, "x"))) == [1, [2.5, "x"]]
    assert roundtrip({3}) == [3]


# -- placeholders --------------------------------------------------------------------------


def _cyclic_list():
    x = [1, 2]
    x.append(x)
    return x


def _cyclic_dict():
    x = {"a": 1}
    x["me"] = {"again": x}
    return x


def _deep(n):
    value = "leaf"
    for _ in range(n):
        value = [value]
    return value


class Odd:
    def __repr__(self):
        return "Odd()"


class BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


PLACEHOLDERS = [  # (value, where in it, placeholder text)
    (torch.empty(3, device="meta"), (), "meta tensor of shape [3]"),
    ({"m": torch.empty(2, 4, device="meta")}, ("m",), "meta tensor of shape [2, 4]"),
    (_cyclic_list(), (2,), "a list that contains itself"),
    (_cyclic_dict(), ("me", "again"), "a dict that contains itself"),
    (Odd(), (), "Odd object Odd()"),
    (BadRepr(), (), "BadRepr object (repr failed: RuntimeError)"),
    (b"abc", (), "bytes of length 3"),
    (np.datetime64("2020-01-01"), (), "numpy datetime64[D] scalar np.datetime64('2020-01-01')"),
    (np.array(["2020"], dtype="datetime64[Y]"), (), "array of dtype datetime64[Y] and shape [1]"),
    (np.ma.masked_array([1, 2], mask=[0, 1]), (), "masked array of dtype int64 and shape [2]"),
]


def _at(value, keys):
    for k in keys:
        value = value[k]
    return value


@pytest.mark.parametrize("value, keys, reason", PLACEHOLDERS, ids=[p[2][:30] for p in PLACEHOLDERS])
def test_what_cannot_be_logged_becomes_a_documented_placeholder(value, keys, reason):
    text = f"<unserializable: {reason}>"
    clean = to_serializable(value)
    assert isinstance(_at(clean, keys), Placeholder) and _at(clean, keys) == text
    where = "value" + "".join(f"[{k!r}]" for k in keys)
    assert serialization_notes(clean) == [f"{where} was written as '{text}'"]
    assert _at(roundtrip(value), keys) == text


def test_nesting_deeper_than_the_limit_is_cut_with_a_placeholder():
    value = to_serializable(_deep(100_000))
    depth = 0
    while isinstance(value, list):
        value, depth = value[0], depth + 1
    assert depth == MAX_VALUE_DEPTH
    assert value == f"<unserializable: nesting deeper than {MAX_VALUE_DEPTH} levels>"
    assert roundtrip(_deep(MAX_VALUE_DEPTH - 1)) == _deep(MAX_VALUE_DEPTH - 1)


def test_cleaning_is_idempotent_and_never_raises():
    value = {"t": torch.ones(2), "m": torch.empty(1, device="meta"), "c": _cyclic_list()}
    once = clean_value(value)
    twice = clean_value(once)
    assert unserializable_notes(once) == unserializable_notes(twice)
    assert dumps(once) == dumps(twice)


# -- through a real training run -------------------------------------------------------------


ODD_VALUE = {
    "meta": torch.empty(3, device="meta"),
    "bf16": torch.tensor([1.5], dtype=torch.bfloat16),
    "f8": torch.tensor([2.0]).to(torch.float8_e4m3fn),
    "sparse": torch.eye(2).to_sparse(),
    "cycle": _cyclic_list(),
    "big": 10**5000,
    "ld": np.array([1, 2], dtype=np.longdouble),
    "__x__": {"__ndarray__": 1},
}


def test_odd_values_in_training_are_logged_with_an_error_record(tmp_path, returning):
    log = tmp_path / "log.jsonl"
    registry = returning(lambda step: ODD_VALUE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_cockpit(tiny_mlp(), ["odd"], steps=3, registry=registry, log=log)
    cp = result.cockpit
    assert cp._log in cp.sinks  # the log writer was not removed
    cp.close()
    meta = "value['meta'] was written as '<unserializable: meta tensor of shape [3]>'"
    cycle = "value['cycle'][2] was written as '<unserializable: a list that contains itself>'"
    expected = f"UnserializableValue: {meta}; {cycle}"
    assert [(e["step"], e["phase"], e["error"]) for e in cp.errors] == [
        (s, "serialize", expected) for s in range(3)
    ]
    messages = [str(w.message) for w in caught if "cannot be logged" in str(w.message)]
    assert messages == [  # once per quantity
        f"cockpit: The value of quantity 'odd' at step 0 cannot be logged as it is ({meta}; "
        f"{cycle}); training continues. The error (phase 'serialize') is in cp.errors and the "
        "log; see docs/log_format.md for what can be logged."
    ]
    run = read_run(log)
    assert sorted(run.output) == [0, 1, 2]
    for step in range(3):
        got = run.output[step]["odd"]
        assert got["meta"] == "<unserializable: meta tensor of shape [3]>"
        np.testing.assert_array_equal(_array(got["bf16"], "float32"), [1.5])
        np.testing.assert_array_equal(_array(got["f8"], "float32"), [2.0])
        np.testing.assert_array_equal(_array(got["sparse"], "float32"), np.eye(2))
        assert got["cycle"] == [1, 2, "<unserializable: a list that contains itself>"]
        assert got["big"] == 10**5000
        np.testing.assert_array_equal(_array(got["ld"], "float64"), [1.0, 2.0])
        assert got["__x__"] == {"__ndarray__": 1}
    assert [(e["step"], e["error"]) for e in run.errors] == [(s, expected) for s in range(3)]
    kinds = [r["kind"] for r in read_records(log)]
    # a step's cost record is written when the next step enters (the last one at close)
    assert kinds == ["header"] + ["values", "error", "cost"] * 3
