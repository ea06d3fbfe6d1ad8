"""The streaming log: one JSON record per line, flushed as it is written.

A log file (``.jsonl``) holds runs. Each run starts with a ``header`` record (versions,
config, parameters, ``run`` number), then ``values`` records (``{"kind": "values", "step":
s, "values": {name: value}}``) and ``error``/``skipped`` records. A new :class:`LogWriter`
on an existing log appends a new run (after cutting off a torn last line) and never
truncates it; readers let later runs override the steps they record again.

Values are encoded in json-tricks' layout (numpy arrays as ``__ndarray__`` entries with
``dtype`` and ``shape``, complex numbers as ``__complex__``), plus ``__int__`` for integers
beyond 64 bits. Every value can be written: :func:`clean_value` turns anything into
loggable data and replaces what cannot be logged faithfully by a :class:`Placeholder`
string (``"<unserializable: why>"``). Dict keys that look like markers (``"__x__"``) are
escaped with a ``~`` on writing and unescaped on reading.

Each record is flushed to the operating system as soon as it is written and ``fsync``-ed
at most every ``fsync_every`` seconds, so a killed run keeps every complete line. If the
disk is full, unwritten records wait in a bounded buffer and are retried.

Reading never executes code and is bounded: the only decoding hook accepts numeric numpy
arrays, complex numbers and big integers and rejects every other ``__marker__`` entry with
:class:`UnsafeLogError`; a line may hold at most :data:`MAX_LINE_BYTES` bytes, an array at
most :data:`MAX_ARRAY_ELEMENTS` elements (checked before anything is allocated, and
compressed payloads are never inflated beyond their declared size); every malformed input
raises :class:`LogFormatError` naming the file and line. See ``docs/log_format.md``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import json
import math
import os
import re
import stat
import sys
import tempfile
import time
import warnings
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from cockpit_core.errors import CockpitError, CockpitWarning

LOG_FORMAT_VERSION = 2
"""Version of the record layout; written into each header as ``log_format``.

1: the original layout. 2: adds ``run`` to headers (several runs per file), ``~``-escaped
marker-like keys and ``__int__`` entries. Readers read both.
"""

MAX_ARRAY_ELEMENTS = 2**26
"""Most elements one array may have: larger arrays are written as placeholders, and the
reader refuses larger declared shapes before allocating anything."""

MAX_LINE_BYTES = 2**30
"""Most bytes of one JSON Lines record or of a whole consolidated file (1 GiB)."""

MAX_VALUE_DEPTH = 64
"""Most levels of nested dicts/lists in a value; deeper parts become placeholders."""

MAX_INT_BITS = 2**20
"""Largest Python int (in bits) written exactly (as ``__int__``); larger ones are placeholders."""

MAX_PENDING_BYTES = 2**26
"""Default bound of the buffer that holds records the writer could not write (64 MiB)."""

PLACEHOLDER_PREFIX = "<unserializable: "
"""Every placeholder string starts with this."""

_SAFE_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 "
    "complex64 complex128".split()
)
_ALLOWED_MARKERS = frozenset({"__ndarray__", "__complex__", "__int__"})
_NDARRAY_KEYS = frozenset({"__ndarray__", "dtype", "shape", "Corder", "endian"})
_LONG = (np.dtype(np.longdouble), np.dtype(np.clongdouble))
_RECORD_DEPTH = 4  # levels of a record above its values
_PLAIN = frozenset({float, str, bool, type(None)})  # kept as they are, without a call
_MAX_INT_DIGITS = 300  # integer literals the reader accepts (cockpit writes at most 20)
_RECORD_START = re.compile(rb'\s*\{\s*"kind"\s*:')
_HEADER_START = re.compile(rb'\s*\{\s*"kind"\s*:\s*"header"')
_INT_HEX = re.compile(r"-?0x[0-9a-f]+\Z")
_KINDS = {  # dtype kind of the array -> kinds of the decoded JSON numbers it accepts
    "b": "b",
    "i": "biu",
    "u": "biu",
    "f": "biuf",
    "c": "biufc",
}


class LogFormatError(CockpitError, ValueError):
    """A file is not a cockpit log, or is damaged somewhere other than its last line."""


class UnsafeLogError(LogFormatError):
    """A log file contains an entry that would import or build arbitrary objects."""


class Placeholder(str):
    """The string written instead of a value that cannot be logged faithfully.

    Its text is ``"<unserializable: why>"``; it reads back as a plain string. The Cockpit
    records an ``error`` record (phase ``serialize``) for every value that holds one.
    """

    __slots__ = ()


def placeholder(reason: str) -> Placeholder:
    """The placeholder ``"<unserializable: {reason}>"``."""
    return Placeholder(f"{PLACEHOLDER_PREFIX}{reason}>")


# -- cleaning: any value -> loggable data ---------------------------------------------------


def _short_repr(value: Any, limit: int = 80) -> str:
    try:
        text = repr(value)
    except Exception as err:  # noqa: BLE001 - a broken __repr__ must not stop the log
        text = f"(repr failed: {type(err).__name__})"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shape(shape: Any) -> str:
    return str([int(n) for n in shape])


class _Cleaner:
    """One pass of :func:`clean_value`; ``notes`` collects ``(category, placeholder)``."""

    def __init__(self, max_depth: int = MAX_VALUE_DEPTH) -> None:
        self.max_depth = max_depth
        self.notes: list[tuple[str, str]] = []
        self._active: set[int] = set()

    def _placeholder(self, category: str, reason: str) -> Placeholder:
        p = placeholder(reason)
        self.notes.append((category, p))
        return p

    def clean(self, value: Any, depth: int = 0) -> Any:
        try:
            return self._clean(value, depth)
        except Exception as err:  # noqa: BLE001 - the log must never fail on a value
            name = type(value).__name__
            return self._placeholder(
                name, f"{name} that failed to convert ({type(err).__name__}: {_short_repr(err)})"
            )

    def _clean(self, value: Any, depth: int) -> Any:
        kind = type(value)
        if value is None or kind in (bool, str, float, Placeholder):
            return value
        if kind is int:
            return self._int(value)
        if isinstance(value, np.generic):
            return self._numpy_scalar(value, depth)
        if isinstance(value, bool):
            return bool(value)
        if isinstance(value, int):
            return self._int(int(value))
        if isinstance(value, float):
            return float(value)
        if isinstance(value, complex):
            return complex(value)
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, np.ndarray):
            return self._array(value, depth)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            return self._tensor(value, torch, depth)
        if isinstance(value, (Mapping, list, tuple, set, frozenset)):
            if depth >= self.max_depth:
                return self._placeholder("nesting", f"nesting deeper than {self.max_depth} levels")
            if id(value) in self._active:
                return self._placeholder("cycle", f"a {kind.__name__} that contains itself")
            self._active.add(id(value))
            try:
                if isinstance(value, Mapping):
                    return self._dict(value, depth)
                return [v if type(v) in _PLAIN else self.clean(v, depth + 1) for v in value]
            finally:
                self._active.discard(id(value))
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self._placeholder("bytes", f"{kind.__name__} of length {len(value)}")
        return self._placeholder(
            f"type {kind.__qualname__}", f"{kind.__qualname__} object {_short_repr(value)}"
        )

    def _int(self, value: int) -> Any:
        if value.bit_length() <= MAX_INT_BITS:
            return value
        return self._placeholder("int", f"int of {value.bit_length()} bits")

    def _key(self, key: Any, out: dict) -> str:
        if type(key) is str or type(key) is Placeholder:
            name = key
        elif isinstance(key, str):
            name = str.__str__(key)
        else:
            try:
                name = str(key)
            except Exception:  # noqa: BLE001 - e.g. an int too large for str()
                name = self._placeholder("key", f"key of type {type(key).__name__}")
        if name in out:
            reason = (
                f"key {_short_repr(key)} ({type(key).__name__}), which collides with another "
                f"key written as {_short_repr(name)}"
            )
            name = self._placeholder("key", reason)
            i = 2
            while name in out:
                name, i = placeholder(f"{reason} (#{i})"), i + 1
        return name

    def _dict(self, value: Mapping, depth: int) -> dict:
        out: dict[str, Any] = {}
        for key, item in list(value.items()):
            item = item if type(item) in _PLAIN else self.clean(item, depth + 1)
            out[self._key(key, out)] = item
        return out

    def _numpy_scalar(self, value: np.generic, depth: int) -> Any:
        if value.dtype.kind in "mMV":  # datetime, timedelta, structured
            return self._placeholder(
                f"numpy {value.dtype}", f"numpy {value.dtype} scalar {_short_repr(value)}"
            )
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.integer):
            return int(value)
        if value.dtype in _LONG:
            return value  # written as float64/complex128 (see unserializable_notes)
        if isinstance(value, np.floating):
            return float(value)
        if isinstance(value, np.complexfloating):
            return complex(value)
        if isinstance(value, np.str_):
            return str.__str__(value)
        if isinstance(value, np.bytes_):
            return self._placeholder("bytes", f"bytes of length {len(value)}")
        return self._placeholder(
            f"numpy {value.dtype}", f"numpy {value.dtype} scalar {_short_repr(value)}"
        )

    def _array(self, value: np.ndarray, depth: int) -> Any:
        what = f"array of dtype {value.dtype} and shape {_shape(value.shape)}"
        if isinstance(value, np.ma.MaskedArray):
            return self._placeholder("masked array", f"masked {what}")
        value = np.asarray(value)
        if value.size > MAX_ARRAY_ELEMENTS:
            return self._placeholder(
                "size", f"{what} with {value.size} elements (the limit is {MAX_ARRAY_ELEMENTS})"
            )
        if value.ndim == 0:
            return self.clean(value[()], depth)
        if value.dtype.name in _SAFE_DTYPES or value.dtype in _LONG:
            return value
        if value.dtype.kind in "OU":
            return self.clean(value.tolist(), depth)
        return self._placeholder(f"numpy {value.dtype}", what)

    def _tensor(self, value: Any, torch: Any, depth: int) -> Any:
        shape = _shape(value.shape)
        if value.is_meta:
            return self._placeholder("meta tensor", f"meta tensor of shape {shape}")
        if getattr(value, "is_nested", False):
            return self._placeholder("nested tensor", "nested tensor")
        if value.numel() > MAX_ARRAY_ELEMENTS:
            return self._placeholder(
                "size",
                f"tensor of shape {shape} with {value.numel()} elements "
                f"(the limit is {MAX_ARRAY_ELEMENTS})",
            )
        t = value.detach()
        if t.is_quantized:
            t = t.dequantize()
        if t.dtype == torch.complex32:
            t = t.to(torch.complex64)
        elif t.dtype.is_floating_point and t.dtype.itemsize < 4 and t.dtype != torch.float16:
            t = t.to(torch.float32)  # bfloat16, float8: float32 holds every value exactly
        if t.layout != torch.strided:
            t = t.to_dense()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.resolve_conj().resolve_neg()
        try:
            array = t.numpy()
        except (TypeError, RuntimeError):
            return self._placeholder(
                f"tensor {t.dtype}", f"tensor of dtype {t.dtype} and shape {shape}"
            )
        if (t.dtype, t.layout, t.device) == (value.dtype, value.layout, value.device):
            array = array.copy()  # not a view of the tensor, which may change later
        return self.clean(array[()], depth) if array.ndim == 0 else self._array(array, depth)


def clean_value(value: Any) -> Any:
    """A loggable copy of ``value``; never raises (``docs/log_format.md`` lists the mapping).

    The result holds only ``None``, bools, ints, floats, complex numbers, strings, dicts
    with string keys, lists, numpy arrays of numeric dtypes and ``np.longdouble`` scalars
    and arrays (written as float64). Tensors become numpy arrays (bfloat16 and float8 as
    float32, complex32 as complex64, sparse as dense, 0-d ones as numbers), tuples and sets
    lists, non-string keys ``str(key)``. What cannot be logged faithfully (meta tensors,
    cycles, nesting deeper than :data:`MAX_VALUE_DEPTH`, arbitrary objects, ...) becomes a
    :class:`Placeholder`; :func:`unserializable_notes` lists them.
    """
    return _Cleaner().clean(value)


def _from_longdouble(value: Any) -> tuple[Any, bool]:
    """``value`` (extended precision) as float64/complex128, and whether that is exact.

    Values beyond the float64 range give a placeholder instead.
    """
    array = np.asarray(value)
    target = np.complex128 if array.dtype.kind == "c" else np.float64
    with np.errstate(all="ignore"):
        converted = array.astype(target)
        if np.any(np.isfinite(array) & ~np.isfinite(converted)):
            what = "scalar" if array.ndim == 0 else f"array of shape {_shape(array.shape)}"
            return placeholder(f"{array.dtype} {what} with values beyond the float64 range"), False
        exact = bool(np.array_equal(converted.astype(array.dtype), array, equal_nan=True))
    return (converted[()].item() if array.ndim == 0 else converted), exact


def _where(root: str, keys: tuple) -> str:
    path = root + "".join(f"[{k!r}]" for k in keys)
    return path if len(path) <= 120 else f"{path[:60]}...{path[-50:]}"


def unserializable_notes(value: Any, where: str = "value") -> list[str]:
    """What of a cleaned value (see :func:`clean_value`) is not logged faithfully.

    One line per placeholder (``"value['a'][0] was written as '<unserializable: ...>'"``)
    and per ``np.longdouble`` value that float64 rounds or cannot hold.
    """
    notes: list[str] = []
    stack: list[tuple[tuple, Any]] = [((), value)]
    seen: set[int] = set()
    while stack:
        keys, v = stack.pop()
        if isinstance(v, Placeholder):
            notes.append(f"{_where(where, keys)} was written as '{v}'")
        elif isinstance(v, (dict, list)):
            if id(v) in seen:
                continue
            seen.add(id(v))
            children = []
            for k, x in v.items() if isinstance(v, dict) else enumerate(v):
                if isinstance(k, Placeholder):
                    notes.append(f"a key of {_where(where, keys)} was written as '{k}'")
                if isinstance(x, (str, dict, list, np.ndarray, np.generic)):
                    children.append((keys + (k,), x))
            stack.extend(reversed(children))
        elif isinstance(v, (np.ndarray, np.generic)) and v.dtype in _LONG:
            converted, exact = _from_longdouble(v)
            if isinstance(converted, Placeholder):
                notes.append(f"{_where(where, keys)} was written as '{converted}'")
            elif not exact:
                target = np.asarray(converted).dtype
                notes.append(f"{_where(where, keys)} ({v.dtype}) was rounded to {target}")
    return notes


# -- encoding -----------------------------------------------------------------------------


def _is_marker(key: str) -> bool:
    return len(key) >= 4 and key.startswith("__") and key.endswith("__")


def _escape(key: str) -> str:
    """Marker-like keys (``~*__x__``) get one more leading ``~``; others stay."""
    return "~" + key if _is_marker(key.lstrip("~")) else key


def _unescape(key: str) -> str:
    if key.startswith("~") and _is_marker(key.lstrip("~")):
        return key[1:]
    return key


def _complex_json(data: Any) -> Any:
    if isinstance(data, list):
        return [_complex_json(x) for x in data]
    return {"__complex__": [data.real, data.imag]}


def _array_json(array: np.ndarray) -> Any:
    if array.dtype in _LONG:
        array, _ = _from_longdouble(array)
        if isinstance(array, Placeholder):
            return array
    data = array.tolist()
    if array.dtype.kind == "c":
        data = _complex_json(data)
    return {"__ndarray__": data, "dtype": array.dtype.name, "shape": list(array.shape)}


def _to_json(value: Any) -> Any:
    """A cleaned value as JSON data (arrays, complex numbers, big ints as marker entries)."""
    if isinstance(value, dict):
        return {_escape(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return _array_json(value)
    if isinstance(value, np.generic):  # np.longdouble / np.clongdouble
        converted, _ = _from_longdouble(value)
        return _to_json(converted)
    if isinstance(value, complex):
        return {"__complex__": [value.real, value.imag]}
    if type(value) is int and not -(2**63) <= value < 2**64:
        return {"__int__": hex(value)}
    return value


def _encode(value: Any) -> tuple[str, list[tuple[str, str]]]:
    """One JSON line for ``value`` and the placeholders made on the way; never raises.

    Records nest values a few levels deep (``values`` -> key, or ``output`` -> step -> key),
    so values cleaned by :func:`clean_value` are not cut again here.
    """
    cleaner = _Cleaner(MAX_VALUE_DEPTH + _RECORD_DEPTH)
    try:
        text = json.dumps(_to_json(cleaner.clean(value)), allow_nan=True, separators=(",", ":"))
    except Exception as err:  # noqa: BLE001 - a last resort; cleaning should prevent it
        reason = f"value that failed to encode ({type(err).__name__}: {_short_repr(err)})"
        fallback: Any = placeholder(reason)
        if isinstance(value, Mapping) and "kind" in value:
            fallback = {"kind": str(value["kind"]), "error": fallback}
            if isinstance(value.get("step"), int):
                fallback["step"] = int(value["step"])
        text = json.dumps(fallback, separators=(",", ":"))
        cleaner.notes.append(("encoding", reason))
    return text, cleaner.notes


def dumps(value: Any) -> str:
    """Encode a value (a record) on one line; never raises (see :func:`clean_value`)."""
    return _encode(value)[0]


# -- decoding -----------------------------------------------------------------------------


def _parse_int(text: str) -> int:
    if len(text) > _MAX_INT_DIGITS:
        raise LogFormatError(
            f"an integer literal with {len(text)} digits (cockpit writes at most 20; larger "
            "integers are '__int__' entries)."
        )
    return int(text)


def _decode_lists(data: Any, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    if not isinstance(data, list):  # json-tricks writes 0-d arrays as a bare number
        if shape:
            raise LogFormatError(f"a numpy array entry of shape {shape} holds a single number.")
        data = [data]
    try:
        probe = np.asarray(data)
    except (ValueError, TypeError, OverflowError):
        raise LogFormatError(
            "a numpy array entry holds nested lists of unequal lengths or other things than "
            "numbers."
        ) from None
    if probe.size and probe.dtype.kind not in _KINDS[dtype.kind]:
        raise LogFormatError(
            f"a numpy array entry of dtype {dtype.name} holds values of another kind "
            f"({probe.dtype})."
        )
    if probe.size and dtype.kind in "iu" and probe.dtype.kind in "iu":
        info = np.iinfo(dtype)
        if int(probe.min()) < info.min or int(probe.max()) > info.max:
            raise LogFormatError(
                f"a numpy array entry of dtype {dtype.name} holds integers outside its range."
            )
    with np.errstate(all="ignore"):
        array = probe.astype(dtype)
    if not shape:
        return array.reshape(())
    if array.shape != tuple(shape):
        if array.size == 0 and math.prod(shape) == 0:
            return array.reshape(shape)
        raise LogFormatError(
            f"a numpy array entry declares shape {shape} but holds data of shape "
            f"{list(array.shape)}."
        )
    return array


def _decode_bytes(data: str, entry: dict, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    """json-tricks' compact form (``b64:`` or ``b64.gz:``), bounded by the declared size."""
    endian = entry.get("endian", "native")
    orders = {"little": "<", "big": ">", "native": "="}
    if endian not in orders:
        raise LogFormatError(f"a numpy array entry has an unknown 'endian' {endian!r:.40}.")
    expected = math.prod(shape) * dtype.itemsize
    if data.startswith("b64.gz:"):
        payload, compressed = data[7:], True
    elif data.startswith("b64:"):
        payload, compressed = data[4:], False
    else:
        raise LogFormatError("a numpy array entry holds a string that is not 'b64:' data.")
    if not compressed and len(payload) > 4 * ((expected + 2) // 3):
        raise LogFormatError(
            f"a numpy array entry holds {len(payload)} base64 characters, more than the "
            f"{expected} bytes its shape {shape} and dtype {dtype.name} need."
        )
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise LogFormatError("a numpy array entry holds invalid base64 data.") from None
    if compressed:
        inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header
        try:
            raw = inflater.decompress(raw, expected + 1)
        except zlib.error:
            raise LogFormatError("a numpy array entry holds invalid compressed data.") from None
        if len(raw) > expected:
            raise LogFormatError(
                f"a compressed numpy array entry inflates to more than the {expected} bytes "
                f"its shape {shape} and dtype {dtype.name} declare; it was not inflated "
                "further (a decompression bomb?)."
            )
    if len(raw) != expected:
        raise LogFormatError(
            f"a numpy array entry holds {len(raw)} bytes, but shape {shape} of "
            f"{dtype.name} needs {expected}."
        )
    order = "F" if entry.get("Corder") is False else "C"
    array = np.frombuffer(raw, dtype=dtype.newbyteorder(orders[endian]))
    return array.reshape(shape, order=order).astype(dtype)


def _decode_array(entry: dict, max_elements: int) -> Any:
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or dtype not in _SAFE_DTYPES:
        raise UnsafeLogError(
            f"refusing numpy dtype {dtype!r:.60}: cockpit logs hold only numeric arrays "
            f"({', '.join(sorted(_SAFE_DTYPES))}). Nothing from the file was imported or run."
        )
    extra = set(entry) - _NDARRAY_KEYS
    if extra:
        raise UnsafeLogError(f"unexpected keys {sorted(extra)} in a numpy array entry.")
    data = entry["__ndarray__"]
    if not isinstance(data, (list, str, int, float, complex)):
        raise UnsafeLogError("a numpy array entry holds neither numbers nor encoded bytes.")
    if "shape" not in entry:
        raise LogFormatError("a numpy array entry has no 'shape'.")
    shape = entry["shape"]
    if not (
        isinstance(shape, list)
        and len(shape) <= 64
        and all(type(n) is int and n >= 0 for n in shape)
    ):
        raise LogFormatError(
            f"a numpy array entry has the shape {shape!r:.80}; a shape is a list of at most "
            "64 non-negative integers."
        )
    size = math.prod(shape)
    if size > max_elements:
        raise LogFormatError(
            f"a numpy array entry of shape {shape} declares {size} elements, more than the "
            f"limit of {max_elements} (max_array_elements); nothing was allocated."
        )
    if "Corder" in entry and not isinstance(entry["Corder"], bool):
        raise LogFormatError("a numpy array entry has a 'Corder' that is not true or false.")
    np_dtype = np.dtype(dtype)
    if isinstance(data, str):
        array = _decode_bytes(data, entry, np_dtype, shape)
    else:
        array = _decode_lists(data, np_dtype, shape)
    return array.item() if array.ndim == 0 else array


def _decode_complex(entry: dict) -> complex:
    if set(entry) != {"__complex__"}:
        raise UnsafeLogError(
            f"unexpected keys {sorted(set(entry) - {'__complex__'})} in a complex entry."
        )
    parts = entry["__complex__"]
    if not (
        isinstance(parts, list) and len(parts) == 2 and all(type(x) in (int, float) for x in parts)
    ):
        raise LogFormatError("a complex entry must hold [real, imag], two numbers.")
    return complex(parts[0], parts[1])


def _decode_int(entry: dict) -> int:
    if set(entry) != {"__int__"}:
        raise UnsafeLogError(f"unexpected keys {sorted(set(entry) - {'__int__'})} in an int entry.")
    text = entry["__int__"]
    if not isinstance(text, str) or len(text) > MAX_INT_BITS // 4 + 3 or not _INT_HEX.match(text):
        raise LogFormatError(
            f"an int entry must hold a hexadecimal string of at most {MAX_INT_BITS} bits."
        )
    return int(text, 16)


class _Hook:
    """The only decoding hook (``object_pairs_hook``): safe markers, unescaped keys."""

    def __init__(self, max_elements: int):
        self.max_elements = max_elements

    def __call__(self, pairs: list[tuple[str, Any]]) -> Any:
        marker = None
        for key, _ in pairs:
            if _is_marker(key):
                if key not in _ALLOWED_MARKERS:
                    raise UnsafeLogError(
                        f"refusing to decode a '{key[:60]}' entry: cockpit logs hold only "
                        "numbers, strings and numeric arrays, so this file was not written by "
                        "cockpit or was altered. Nothing from it was imported or run."
                    )
                marker = key
        if marker is None:
            return {_unescape(k): v for k, v in pairs}
        entry = dict(pairs)
        if "__ndarray__" in entry:
            return _decode_array(entry, self.max_elements)
        if marker == "__complex__":
            return _decode_complex(entry)
        return _decode_int(entry)


def _decode(text: str, max_elements: int) -> Any:
    """Decode one JSON text safely.

    Syntax errors stay ``json.JSONDecodeError`` (a torn line), everything else that is
    wrong becomes :class:`LogFormatError` (or :class:`UnsafeLogError`).
    """
    try:
        return json.loads(text, object_pairs_hook=_Hook(max_elements), parse_int=_parse_int)
    except (json.JSONDecodeError, LogFormatError):
        raise
    except RecursionError:
        raise LogFormatError(
            "nesting deeper than the JSON parser allows (Python's recursion limit); cockpit "
            f"writes at most {MAX_VALUE_DEPTH} levels of nested values."
        ) from None
    except MemoryError:
        raise LogFormatError("out of memory while decoding it.") from None
    except Exception as err:  # noqa: BLE001 - any malformed input becomes LogFormatError
        raise LogFormatError(
            f"malformed entry ({type(err).__name__}: {_short_repr(err, 200)})."
        ) from None


def loads(text: str | bytes, *, max_array_elements: int | None = None) -> Any:
    """Decode one JSON text safely (see the module docstring).

    Raises:
        UnsafeLogError: An entry would import or build objects.
        LogFormatError: The text is not valid JSON or holds a malformed entry.

    """
    limit = MAX_ARRAY_ELEMENTS if max_array_elements is None else max_array_elements
    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        return _decode(text, limit)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LogFormatError(f"not valid JSON ({err}).") from None


# -- writing ------------------------------------------------------------------------------


class LogWriter:
    """Appends records to a JSON Lines file: flushed per record, fsync-ed at an interval.

    Use it as a sink (``writer(record)``); :class:`~cockpit_core.Cockpit` makes one when
    given ``log=path``. It never raises on a value (see :func:`clean_value`), nor when the
    disk is full: records it cannot write wait in a buffer of at most ``max_pending_bytes``
    and are retried with every new record and on :meth:`close`; it warns when writing
    fails, when it works again and how many records were lost. With
    ``keep_in_memory=False`` that buffer is the only copy of those records.

    An existing log is never truncated: the writer cuts off a torn last line (with a
    warning), then appends a new run whose header carries ``run`` = previous run + 1.

    Args:
        path: File to write (parent folders are created; an existing log is appended to).
        fsync_every: Seconds between ``os.fsync`` calls (``0`` syncs every record, ``None``
            never; ``close`` always syncs unless ``None``). Flushing each record already
            survives a killed process; fsync also survives a crash of the machine.
        max_pending_bytes: Bound of the buffer of unwritten records; when it is full,
            newer records are dropped (and counted in :attr:`lost`).

    Attributes:
        run: The run number written into this writer's header records.
        lost: Records dropped so far because they could not be written.

    Raises:
        LogFormatError: ``path`` exists, is not empty and is not a JSON Lines log.
        OSError: The file cannot be opened.

    """

    def __init__(
        self,
        path: str | Path,
        fsync_every: float | None = 5.0,
        *,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ):
        if fsync_every is not None and fsync_every < 0:
            raise ValueError(f"fsync_every must be >= 0 seconds or None, got {fsync_every}.")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync_every = fsync_every
        self.max_pending_bytes = max_pending_bytes
        self.run = 1
        self.lost = 0
        self._appending = False
        self._started = False
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._error: OSError | None = None  # while writing fails
        self._last_error: OSError | None = None
        self._dirty = False
        self._warned: set[str] = set()
        if self.path.exists() and self.path.stat().st_size:
            self._prepare_existing()
        self._file: IO[bytes] = open(self.path, "ab", buffering=0)  # noqa: SIM115 - kept open
        self._good_size = os.fstat(self._file.fileno()).st_size
        self._last_sync = time.monotonic()

    # -- opening an existing log ----------------------------------------------------------

    def _prepare_existing(self) -> None:
        with open(self.path, "r+b") as f:
            head = f.read(64)
            torn_start = b"\n" not in head and b'{"kind":'.startswith(head.strip()[:8])
            if not _RECORD_START.match(head) and not torn_start:
                raise LogFormatError(
                    f"{self.path} exists and is not a cockpit JSON Lines log (it does not "
                    "start with a record); cockpit never overwrites a file: choose another "
                    "log path, or move the file away."
                )
            if not self._cut_torn_tail(f):
                return
            f.seek(0)
            self.run = _last_run(f) + 1
        self._appending = True
        warnings.warn(
            f"cockpit log: {self.path} already holds a log; appending run {self.run} to it "
            "(readers show, for every step, the values of the latest run that recorded it).",
            CockpitWarning,
            stacklevel=3,
        )

    def _cut_torn_tail(self, f: IO[bytes]) -> bool:
        """Cut an incomplete last line; whether anything is left."""
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return True
        start = size
        while start > 0:
            step = min(1 << 16, start)
            f.seek(start - step)
            i = f.read(step).rfind(b"\n")
            if i >= 0:
                start = start - step + i + 1
                break
            start -= step
        f.seek(start)
        tail = f.read(min(size - start, MAX_LINE_BYTES + 1))
        if tail.strip() and len(tail) <= MAX_LINE_BYTES:
            try:
                complete = isinstance(_decode(tail.decode("utf-8"), MAX_ARRAY_ELEMENTS), dict)
            except (json.JSONDecodeError, UnicodeDecodeError):
                complete = False
            except LogFormatError:  # valid JSON, however wrong: not a torn line, keep it
                complete = True
            if complete:
                f.seek(size)
                f.write(b"\n")
                return True
        f.truncate(start)
        if tail.strip():
            warnings.warn(
                f"cockpit log: {self.path} ended in an incomplete line of {size - start} "
                "bytes (a run killed while writing it); it was cut off before appending.",
                CockpitWarning,
                stacklevel=4,
            )
        return start > 0

    # -- writing --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._file.closed

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line, flush it, fsync if the interval has passed."""
        if self._file.closed:
            raise ValueError(f"the log {self.path} is closed.")
        record = dict(record)
        lines = []
        if record.get("kind") == "header":
            record.setdefault("log_format", LOG_FORMAT_VERSION)
            record.setdefault("run", self.run)
        elif self._appending and not self._started:  # a new run needs a header to start it
            header = {"kind": "header", "run": self.run, "log_format": LOG_FORMAT_VERSION}
            lines.append(self._line(header))
        self._started = True
        lines.extend(self._lines(record))
        self._flush_pending()  # retry what is buffered first, making room for these lines
        for line in lines:
            self._enqueue(line)
        self._flush_pending()
        self._maybe_fsync()

    def _line(self, record: Mapping[str, Any]) -> bytes:
        return (_encode(record)[0] + "\n").encode("utf-8")

    def _lines(self, record: dict[str, Any]) -> list[bytes]:
        """The record's line, smaller values replacing too large ones (with error records)."""
        text, notes = _encode(record)
        for category, note in notes:
            if category not in self._warned:
                self._warned.add(category)
                warnings.warn(
                    f"cockpit log: a value in a '{record.get('kind')}' record cannot be "
                    f"logged as it is; it was written as the placeholder string '{note}'.",
                    CockpitWarning,
                    stacklevel=4,
                )
        if len(text) <= MAX_LINE_BYTES:
            return [(text + "\n").encode("utf-8")]
        data = json.loads(text)  # plain JSON: only its size matters here
        target = data["values"] if isinstance(data.get("values"), dict) else data
        share = MAX_LINE_BYTES // (2 * max(1, len(target)))
        replaced = []
        for key, value in list(target.items()):
            if target is data and key in ("kind", "step", "run"):
                continue
            size = len(json.dumps(value, allow_nan=True, separators=(",", ":")))
            if size > share:
                target[key] = placeholder(
                    f"value of {size} bytes, too large for one log line (the limit is "
                    f"{MAX_LINE_BYTES} bytes)"
                )
                replaced.append(key)
        lines = [(json.dumps(data, allow_nan=True, separators=(",", ":")) + "\n").encode()]
        step = record.get("step")
        for key in replaced:
            error = {"kind": "error", "step": step, "quantity": _unescape(key)}
            error.update(phase="serialize", error=f"UnserializableValue: {target[key]}")
            lines.append(self._line({**error, "traceback": []}))
        warnings.warn(
            f"cockpit log: a '{record.get('kind')}' record of {len(text)} bytes is larger than "
            f"the limit of {MAX_LINE_BYTES} bytes; {sorted(replaced)} were written as "
            "placeholders.",
            CockpitWarning,
            stacklevel=4,
        )
        return lines

    def _enqueue(self, line: bytes) -> None:
        if self._error is not None and self._pending_bytes + len(line) > self.max_pending_bytes:
            self.lost += 1
            if "buffer full" not in self._warned:
                self._warned.add("buffer full")
                warnings.warn(
                    f"cockpit log: the buffer of unwritten records for {self.path} is full "
                    f"({self.max_pending_bytes} bytes); newer records are dropped until "
                    "writing works again.",
                    CockpitWarning,
                    stacklevel=4,
                )
            return
        self._pending.append(line)
        self._pending_bytes += len(line)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._file.write(view)
            if not n:
                raise OSError(errno.EIO, "the file accepted no bytes")
            view = view[n:]

    def _flush_pending(self) -> None:
        """Write the buffered lines; on an OS error keep them for the next try."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        try:
            if self._dirty:  # drop what a failed write left of a line
                os.ftruncate(self._file.fileno(), self._good_size)
                self._dirty = False
            self._write_all(data)
        except OSError as err:
            self._dirty = True
            if self._error is None:
                warnings.warn(
                    f"cockpit log: cannot write to {self.path} ({err}); keeping unwritten "
                    f"records in memory (up to {self.max_pending_bytes} bytes) and retrying "
                    "with every new record. With keep_in_memory=False this buffer is the only "
                    "copy of them.",
                    CockpitWarning,
                    stacklevel=4,
                )
            self._error = self._last_error = err
            return
        self._good_size += len(data)
        if self._error is not None:
            warnings.warn(
                f"cockpit log: writing to {self.path} works again; {len(self._pending)} "
                "buffered records were written.",
                CockpitWarning,
                stacklevel=4,
            )
            self._error = None
        self._pending.clear()
        self._pending_bytes = 0

    def _fsync(self) -> None:
        try:
            os.fsync(self._file.fileno())
        except OSError as err:
            if "fsync" not in self._warned:
                self._warned.add("fsync")
                warnings.warn(
                    f"cockpit log: fsync of {self.path} failed ({err}); records are written "
                    "but may not survive a crash of the machine.",
                    CockpitWarning,
                    stacklevel=4,
                )

    def _maybe_fsync(self) -> None:
        now = time.monotonic()
        if self.fsync_every is not None and now - self._last_sync >= self.fsync_every:
            if self._error is None:
                self._fsync()
            self._last_sync = now

    def close(self) -> None:
        """Retry unwritten records once, fsync and close the file (idempotent; never raises)."""
        if self._file.closed:
            return
        self._flush_pending()
        if self._pending:
            with contextlib.suppress(OSError):  # drop what the failed write left of a line
                os.ftruncate(self._file.fileno(), self._good_size)
            self.lost += len(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
        if self.lost:
            warnings.warn(
                f"cockpit log: {self.lost} records could not be written to {self.path} and "
                f"are lost ({self._last_error}).",
                CockpitWarning,
                stacklevel=2,
            )
        if self.fsync_every is not None:
            self._fsync()
        with contextlib.suppress(OSError):
            self._file.close()

    def __repr__(self) -> str:
        return f"LogWriter({str(self.path)!r})"


def _last_run(f: IO[bytes]) -> int:
    """The highest run number in a log (headers without ``run`` count 1, 2, ...)."""
    headers = last = 0
    for line in f:
        if _HEADER_START.match(line):
            headers += 1
            run = None
            with contextlib.suppress(Exception):
                run = _decode(line.decode("utf-8"), MAX_ARRAY_ELEMENTS).get("run")
            last = max(last, run if type(run) is int else headers)
    return max(last, headers, 1)


def write_json_atomic(path: str | Path, value: Any) -> Path:
    """Write ``value`` as one JSON line to ``path`` atomically.

    The text goes to a temporary file in the same folder (``.NAME.*.tmp``), is flushed and
    fsync-ed, and then renamed over ``path`` (``os.replace``): a process killed meanwhile
    leaves the previous file intact (and perhaps the temporary file, which may be deleted).

    Raises:
        OSError: The file cannot be written; ``path`` is unchanged.

    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (dumps(value) + "\n").encode("utf-8")
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if os.name == "posix":  # make the rename itself durable
        with contextlib.suppress(OSError):
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    if len(data) > MAX_LINE_BYTES:
        warnings.warn(
            f"cockpit: {path} has {len(data)} bytes, more than the readers' default limit of "
            f"{MAX_LINE_BYTES}; read it with read_log(path, max_line_bytes={len(data)}) or "
            "use the JSON Lines log (log=...) for long runs.",
            CockpitWarning,
            stacklevel=3,
        )
    return path


# -- reading ------------------------------------------------------------------------------


@dataclass
class LogData:
    """A log loaded back: what the dashboard and analysis code read.

    Attributes:
        header: The last header record (without ``kind``), ``{}`` if the file has none.
        output: ``{step: {quantity_key: value}}``, steps sorted. A step that several runs
            recorded holds the values of the latest of them.
        errors: The ``error`` records (quantities that failed at a step, values written as
            placeholders), except those of steps that a later run recorded again.
        skipped: The ``skipped`` records (steps whose quantities were not computed, e.g.
            because the loss was not finite), likewise.
        headers: Every run's header, in file order (``header`` is the last).

    """

    header: dict[str, Any] = field(default_factory=dict)
    output: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, Any]] = field(default_factory=list)


def _limits(max_line_bytes: int | None, max_array_elements: int | None) -> tuple[int, int]:
    return (
        MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes,
        MAX_ARRAY_ELEMENTS if max_array_elements is None else max_array_elements,
    )


def _only_blank_after(f: IO[bytes]) -> bool:
    while chunk := f.read(1 << 20):
        if chunk.strip():
            return False
    return True


def _iter_records(
    f: IO[bytes], path: Path, max_line_bytes: int, max_elements: int
) -> Iterator[dict[str, Any]]:
    """Every complete record (checked); a torn last line is skipped with a warning."""
    number = 0
    while line := f.readline(max_line_bytes + 1):
        number += 1
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            raise LogFormatError(
                f"{path}, line {number} is longer than the limit of {max_line_bytes} bytes; "
                "pass a larger max_line_bytes to read it anyway."
            )
        if not line.strip():
            continue
        try:
            record = _decode(line.decode("utf-8"), max_elements)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if _only_blank_after(f):
                warnings.warn(
                    f"{path}: skipped a torn last line (the run was probably killed while "
                    "writing it); every complete record before it was read.",
                    CockpitWarning,
                    stacklevel=4,
                )
                return
            raise LogFormatError(
                f"{path}, line {number} is not valid JSON (only the last line of a killed run "
                "may be incomplete); the file is damaged."
            ) from None
        except LogFormatError as err:
            raise type(err)(f"{path}, line {number}: {err}") from None
        if not isinstance(record, dict):
            raise LogFormatError(f"{path}, line {number} is not a JSON object.")
        kind = record.get("kind")
        if kind == "values" or (kind in ("error", "skipped") and "step" in record):
            step = record.get("step")
            if type(step) is not int:
                raise LogFormatError(
                    f"{path}, line {number}: 'step' must be an integer, got {step!r:.40}."
                )
        if kind == "values" and not isinstance(record.get("values"), dict):
            raise LogFormatError(f"{path}, line {number}: 'values' must be a JSON object.")
        yield record


def read_records(
    path: str | Path,
    *,
    max_line_bytes: int | None = None,
    max_array_elements: int | None = None,
) -> list[dict[str, Any]]:
    """Every complete record of a JSON Lines log; a torn last line is skipped with a warning.

    Args:
        path: The log.
        max_line_bytes: Longest line read (default :data:`MAX_LINE_BYTES`).
        max_array_elements: Largest array read (default :data:`MAX_ARRAY_ELEMENTS`).

    Raises:
        UnsafeLogError: An entry would import or build objects (see the module docstring).
        LogFormatError: A line other than the last is not valid JSON, or any line holds a
            malformed entry or exceeds a limit.

    """
    path = Path(path)
    line_limit, elements = _limits(max_line_bytes, max_array_elements)
    with open(path, "rb") as f:
        return list(_iter_records(f, path, line_limit, elements))


def _new_run(header: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"header": header, "steps": set(), "values": {}, "events": []}


def _assemble(records: Iterator[dict[str, Any]]) -> LogData:
    """Merge the runs of a log: the latest run that records a step decides that step."""
    runs = [_new_run()]
    for record in records:
        kind = record.get("kind")
        run = runs[-1]
        if kind == "header":
            header = {k: v for k, v in record.items() if k != "kind"}
            if run["header"] is None and not run["steps"] and not run["events"]:
                run["header"] = header
            else:
                runs.append(_new_run(header))
        elif kind == "values":
            run["values"].setdefault(record["step"], {}).update(record["values"])
            run["steps"].add(record["step"])
        elif kind in ("error", "skipped"):
            if "step" in record:
                run["steps"].add(record["step"])
            run["events"].append(record)
    data = LogData()
    claimed: set[int] = set()
    kept: list[list[dict[str, Any]]] = []
    for run in reversed(runs):
        for step, values in run["values"].items():
            if step not in claimed:
                data.output[step] = values
        kept.append([e for e in run["events"] if e.get("step") not in claimed])
        claimed |= run["steps"]
    for events in reversed(kept):
        for event in events:
            (data.errors if event["kind"] == "error" else data.skipped).append(event)
    data.headers = [run["header"] for run in runs if run["header"] is not None]
    data.header = data.headers[-1] if data.headers else {}
    data.output = dict(sorted(data.output.items()))
    return data


def _from_consolidated(data: Any, path: Path) -> LogData:
    if not isinstance(data, dict):
        raise LogFormatError(f"{path} is not a cockpit log: it is not a JSON object.")
    if "output" not in data:
        raise LogFormatError(
            f"{path} is a JSON object without 'output': not a cockpit log (write one with "
            "Cockpit(..., log='run/log.jsonl') or cp.write('run/output.json'))."
        )
    output = data["output"]
    bad = LogFormatError(f"{path}: 'output' must map step numbers to values.")
    if not isinstance(output, dict):
        raise bad
    steps = {}
    for key, values in output.items():
        if not (re.fullmatch(r"-?\d{1,20}", key) and isinstance(values, dict)):
            raise bad
        steps[int(key)] = dict(values)
    header = data.get("header") or {}
    lists = {name: data.get(name) or [] for name in ("errors", "skipped")}
    if not isinstance(header, dict) or not all(
        isinstance(v, list) and all(isinstance(e, dict) for e in v) for v in lists.values()
    ):
        raise LogFormatError(
            f"{path}: 'header' must be an object, 'errors' and 'skipped' lists of objects."
        )
    return LogData(
        header=dict(header),
        output=dict(sorted(steps.items())),
        errors=list(lists["errors"]),
        skipped=list(lists["skipped"]),
        headers=[dict(header)] if header else [],
    )


def _read_consolidated(f: IO[bytes], path: Path, line_limit: int, elements: int) -> LogData:
    f.seek(0)
    raw = f.read(line_limit + 1)
    if len(raw) > line_limit:
        raise LogFormatError(
            f"{path} is a JSON file of more than {line_limit} bytes; pass a larger "
            "max_line_bytes to read it anyway."
        )
    lines = raw.count(b"\n", 0, len(raw.rstrip())) + 1
    try:
        data = _decode(raw.decode("utf-8"), elements)
    except json.JSONDecodeError as err:
        raise LogFormatError(
            f"{path}, line {err.lineno}: not valid JSON ({err.msg}); a file cut short, or not "
            "a cockpit log."
        ) from None
    except UnicodeDecodeError:
        raise LogFormatError(f"{path} is not UTF-8 text: not a cockpit log.") from None
    except LogFormatError as err:
        where = "line 1" if lines == 1 else f"lines 1-{lines}"
        raise type(err)(f"{path}, {where}: {err}") from None
    return _from_consolidated(data, path)


def read_run(
    path: str | Path,
    *,
    max_line_bytes: int | None = None,
    max_array_elements: int | None = None,
) -> LogData:
    """Load a JSON Lines log or a consolidated JSON file (header, values, errors).

    A JSON Lines log may hold several runs (a resumed training appends one): for every
    step, the latest run that recorded it wins; ``header`` is the last run's header.

    Args:
        path: The file.
        max_line_bytes: Longest line (or consolidated file) read (default
            :data:`MAX_LINE_BYTES`).
        max_array_elements: Largest array read (default :data:`MAX_ARRAY_ELEMENTS`).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UnsafeLogError: An entry would import or build objects; nothing was run.
        LogFormatError: The file is not a cockpit log, is damaged before its last line,
            holds a malformed entry or exceeds a limit (the message names the line).

    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no log file at {path}")
    line_limit, elements = _limits(max_line_bytes, max_array_elements)
    with open(path, "rb") as f:
        first = b""
        while not first.strip():
            first = f.readline(line_limit + 1)
            if not first:
                raise LogFormatError(f"{path} is empty: not a cockpit log.")
        if not first.lstrip().startswith(b"{"):
            raise LogFormatError(
                f"{path} is not a cockpit log: it does not start with a JSON object."
            )
        if not _RECORD_START.match(first):
            if len(first) > line_limit and not first.endswith(b"\n"):
                return _read_consolidated(f, path, line_limit, elements)
            try:
                single = _decode(first.decode("utf-8"), elements)
            except (json.JSONDecodeError, UnicodeDecodeError):  # pretty-printed or cut short
                return _read_consolidated(f, path, line_limit, elements)
            except LogFormatError as err:
                raise type(err)(f"{path}, line 1: {err}") from None
            if not (isinstance(single, dict) and "kind" in single) and _only_blank_after(f):
                return _from_consolidated(single, path)
        del first
        f.seek(0)
        return _assemble(_iter_records(f, path, line_limit, elements))


def read_log(
    path: str | Path,
    *,
    max_line_bytes: int | None = None,
    max_array_elements: int | None = None,
) -> dict[int, dict[str, Any]]:
    """Load a JSON Lines log or a consolidated JSON file into ``{step: {name: value}}``.

    Both forms give the same structure; a torn last line of a JSON Lines log is skipped
    with a warning, and of steps recorded by several runs the latest run wins. Nothing in
    the file is ever imported or executed (see :class:`UnsafeLogError`); limits as in
    :func:`read_run`.
    """
    return read_run(
        path, max_line_bytes=max_line_bytes, max_array_elements=max_array_elements
    ).output
