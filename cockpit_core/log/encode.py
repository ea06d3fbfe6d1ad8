"""Values into loggable JSON: cleaning, the placeholder rules and the encoder.

:func:`clean_value` turns anything into loggable data and replaces what cannot be logged
faithfully by a :class:`Placeholder` string (``"<unserializable: why>"``);
:func:`unserializable_notes` lists those places. :func:`dumps` writes a record on one line
in json-tricks' layout (numpy arrays as ``__ndarray__`` entries with ``dtype`` and
``shape``, complex numbers as ``__complex__``), plus ``__int__`` for integers beyond 64
bits, and ``~``-escapes marker-like keys. See :mod:`cockpit_core.log` and
``docs/log_format.md``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

import cockpit_core.log.format as log_format
from cockpit_core.log.format import SAFE_DTYPES, escape

_LONG = (np.dtype(np.longdouble), np.dtype(np.clongdouble))
_RECORD_DEPTH = 4  # levels of a record above its values
_PLAIN = frozenset({float, str, bool, type(None)})  # kept as they are, without a call


class Placeholder(str):
    """The string written instead of a value that cannot be logged faithfully.

    Its text is ``"<unserializable: why>"``; it reads back as a plain string. The Cockpit
    records an ``error`` record (phase ``serialize``) for every value that holds one.
    """

    __slots__ = ()


def placeholder(reason: str) -> Placeholder:
    """The placeholder ``"<unserializable: {reason}>"``."""
    return Placeholder(f"{log_format.PLACEHOLDER_PREFIX}{reason}>")


# -- cleaning: any value -> loggable data ---------------------------------------------------


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters; a failing ``__repr__`` is named, not raised."""
    try:
        text = repr(value)
    except Exception as err:  # noqa: BLE001 - a broken __repr__ must not stop the log
        text = f"(repr failed: {type(err).__name__})"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shape(shape: Any) -> str:
    return str([int(n) for n in shape])


class _Cleaner:
    """One pass of :func:`clean_value`; ``notes`` collects ``(category, placeholder)``."""

    def __init__(self, max_depth: int = log_format.MAX_VALUE_DEPTH) -> None:
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
                name, f"{name} that failed to convert ({type(err).__name__}: {short_repr(err)})"
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
            f"type {kind.__qualname__}", f"{kind.__qualname__} object {short_repr(value)}"
        )

    def _int(self, value: int) -> Any:
        if value.bit_length() <= log_format.MAX_INT_BITS:
            return value
        return self._placeholder("int", f"int of {value.bit_length()} bits")

    def _key(self, key: Any, out: dict[str, Any]) -> str:
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
                f"key {short_repr(key)} ({type(key).__name__}), which collides with another "
                f"key written as {short_repr(name)}"
            )
            name = self._placeholder("key", reason)
            i = 2
            while name in out:
                name, i = placeholder(f"{reason} (#{i})"), i + 1
        return name

    def _dict(self, value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, item in list(value.items()):
            item = item if type(item) in _PLAIN else self.clean(item, depth + 1)
            out[self._key(key, out)] = item
        return out

    def _numpy_scalar(self, value: np.generic, depth: int) -> Any:
        if value.dtype.kind in "mMV":  # datetime, timedelta, structured
            return self._placeholder(
                f"numpy {value.dtype}", f"numpy {value.dtype} scalar {short_repr(value)}"
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
            f"numpy {value.dtype}", f"numpy {value.dtype} scalar {short_repr(value)}"
        )

    def _array(self, value: np.ndarray, depth: int) -> Any:
        what = f"array of dtype {value.dtype} and shape {_shape(value.shape)}"
        if isinstance(value, np.ma.MaskedArray):
            return self._placeholder("masked array", f"masked {what}")
        value = np.asarray(value)
        if value.size > log_format.MAX_ARRAY_ELEMENTS:
            return self._placeholder(
                "size",
                f"{what} with {value.size} elements (the limit is {log_format.MAX_ARRAY_ELEMENTS})",
            )
        if value.ndim == 0:
            return self.clean(value[()], depth)
        if value.dtype.name in SAFE_DTYPES or value.dtype in _LONG:
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
        if value.numel() > log_format.MAX_ARRAY_ELEMENTS:
            return self._placeholder(
                "size",
                f"tensor of shape {shape} with {value.numel()} elements "
                f"(the limit is {log_format.MAX_ARRAY_ELEMENTS})",
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


def _where(root: str, keys: tuple[Any, ...]) -> str:
    path = root + "".join(f"[{k!r}]" for k in keys)
    return path if len(path) <= 120 else f"{path[:60]}...{path[-50:]}"


def unserializable_notes(value: Any, where: str = "value") -> list[str]:
    """What of a cleaned value (see :func:`clean_value`) is not logged faithfully.

    One line per placeholder (``"value['a'][0] was written as '<unserializable: ...>'"``)
    and per ``np.longdouble`` value that float64 rounds or cannot hold.
    """
    notes: list[str] = []
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
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
        return {escape(k): _to_json(v) for k, v in value.items()}
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


def encode_value(value: Any) -> tuple[str, list[tuple[str, str]]]:
    """One JSON line for ``value`` and the placeholders made on the way; never raises.

    Records nest values a few levels deep (``values`` -> key, or ``output`` -> step -> key),
    so values cleaned by :func:`clean_value` are not cut again here.
    """
    cleaner = _Cleaner(log_format.MAX_VALUE_DEPTH + _RECORD_DEPTH)
    try:
        text = json.dumps(_to_json(cleaner.clean(value)), allow_nan=True, separators=(",", ":"))
    except Exception as err:  # noqa: BLE001 - a last resort; cleaning should prevent it
        reason = f"value that failed to encode ({type(err).__name__}: {short_repr(err)})"
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
    return encode_value(value)[0]
