"""JSON text into values, safely: the only decoding hook, with its bounds.

Decoding never executes code: the hook accepts numeric numpy arrays, complex numbers and
big integers and rejects every other ``__marker__`` entry with :class:`UnsafeLogError`;
an array may hold at most :data:`~cockpit_core.log.MAX_ARRAY_ELEMENTS` elements, and the
arrays of one read may decode to at most :data:`~cockpit_core.log.MAX_DECODED_BYTES` plus
:data:`~cockpit_core.log.MAX_DECODED_RATIO` bytes per byte of its text (both checked
before anything is allocated, and compressed payloads are never inflated beyond their
declared size); every other malformed input raises :class:`LogFormatError`. See
:mod:`cockpit_core.log`.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import zlib
from typing import Any, Literal

import numpy as np

import cockpit_core.log.format as log_format
from cockpit_core.errors import CockpitError
from cockpit_core.log.encode import short_repr
from cockpit_core.log.format import (
    ALLOWED_MARKERS,
    NDARRAY_KEYS,
    SAFE_DTYPES,
    is_marker,
    unescape,
)

_MAX_INT_DIGITS = 300  # integer literals the reader accepts (cockpit writes at most 20)
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


class Budget:
    """Bytes the arrays of one read may still decode to (see :data:`MAX_DECODED_BYTES`)."""

    def __init__(self, max_decoded_bytes: int | None = None) -> None:
        self.base = log_format.MAX_DECODED_BYTES if max_decoded_bytes is None else max_decoded_bytes
        self.left = self.base

    def credit(self, text_bytes: int) -> None:
        """Text was read: its arrays may take ``MAX_DECODED_RATIO`` bytes per byte of it."""
        self.left += log_format.MAX_DECODED_RATIO * text_bytes

    def spend(self, nbytes: int, shape: list[int], dtype: np.dtype) -> None:
        """Take ``nbytes`` for one array before it is decoded, or refuse it."""
        if nbytes > self.left:
            raise LogFormatError(
                f"a numpy array entry of shape {shape} and dtype {dtype.name} needs {nbytes} "
                f"bytes, more than the {self.left} that the arrays of this read may still take "
                f"(max_decoded_bytes = {self.base} plus {log_format.MAX_DECODED_RATIO} bytes "
                "per byte of text read); nothing was allocated (a decompression bomb?)."
            )
        self.left -= nbytes


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


def _decode_bytes(
    data: str, entry: dict[str, Any], dtype: np.dtype, shape: list[int]
) -> np.ndarray:
    """json-tricks' compact form (``b64:`` or ``b64.gz:``), bounded by the declared size."""
    endian = entry.get("endian", "native")
    orders: dict[str, Literal["<", ">", "="]] = {"little": "<", "big": ">", "native": "="}
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
    order: Literal["C", "F"] = "F" if entry.get("Corder") is False else "C"
    array = np.frombuffer(raw, dtype=dtype.newbyteorder(orders[endian]))
    return array.reshape(shape, order=order).astype(dtype)


def _decode_array(entry: dict[str, Any], max_elements: int, budget: Budget) -> Any:
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or dtype not in SAFE_DTYPES:
        raise UnsafeLogError(
            f"refusing numpy dtype {dtype!r:.60}: cockpit logs hold only numeric arrays "
            f"({', '.join(sorted(SAFE_DTYPES))}). Nothing from the file was imported or run."
        )
    extra = set(entry) - NDARRAY_KEYS
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
    budget.spend(size * np_dtype.itemsize, shape, np_dtype)
    if isinstance(data, str):
        array = _decode_bytes(data, entry, np_dtype, shape)
    else:
        array = _decode_lists(data, np_dtype, shape)
    return array.item() if array.ndim == 0 else array


def _decode_complex(entry: dict[str, Any]) -> complex:
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


def _decode_int(entry: dict[str, Any]) -> int:
    if set(entry) != {"__int__"}:
        raise UnsafeLogError(f"unexpected keys {sorted(set(entry) - {'__int__'})} in an int entry.")
    text = entry["__int__"]
    if (
        not isinstance(text, str)
        or len(text) > log_format.MAX_INT_BITS // 4 + 3
        or not _INT_HEX.match(text)
    ):
        raise LogFormatError(
            "an int entry must hold a hexadecimal string of at most "
            f"{log_format.MAX_INT_BITS} bits."
        )
    return int(text, 16)


class _Hook:
    """The only decoding hook (``object_pairs_hook``): safe markers, unescaped keys."""

    def __init__(self, max_elements: int, budget: Budget):
        self.max_elements = max_elements
        self.budget = budget

    def __call__(self, pairs: list[tuple[str, Any]]) -> Any:
        marker = None
        for key, _ in pairs:
            if is_marker(key):
                if key not in ALLOWED_MARKERS:
                    raise UnsafeLogError(
                        f"refusing to decode a '{key[:60]}' entry: cockpit logs hold only "
                        "numbers, strings and numeric arrays, so this file was not written by "
                        "cockpit or was altered. Nothing from it was imported or run."
                    )
                marker = key
        if marker is None:
            return {unescape(k): v for k, v in pairs}
        entry = dict(pairs)
        if "__ndarray__" in entry:
            return _decode_array(entry, self.max_elements, self.budget)
        if marker == "__complex__":
            return _decode_complex(entry)
        return _decode_int(entry)


def decode_value(text: str, max_elements: int, budget: Budget | None = None) -> Any:
    """Decode one JSON text safely; ``budget`` is that of the read it belongs to (or new).

    Syntax errors stay ``json.JSONDecodeError`` (a torn line), everything else that is
    wrong becomes :class:`LogFormatError` (or :class:`UnsafeLogError`).
    """
    budget = Budget() if budget is None else budget
    budget.credit(len(text))
    hook = _Hook(max_elements, budget)
    try:
        return json.loads(text, object_pairs_hook=hook, parse_int=_parse_int)
    except (json.JSONDecodeError, LogFormatError):
        raise
    except RecursionError:
        raise LogFormatError(
            "nesting deeper than the JSON parser allows (Python's recursion limit); cockpit "
            f"writes at most {log_format.MAX_VALUE_DEPTH} levels of nested values."
        ) from None
    except MemoryError:
        raise LogFormatError("out of memory while decoding it.") from None
    except Exception as err:  # noqa: BLE001 - any malformed input becomes LogFormatError
        raise LogFormatError(
            f"malformed entry ({type(err).__name__}: {short_repr(err, 200)})."
        ) from None


def loads(
    text: str | bytes,
    *,
    max_array_elements: int | None = None,
    max_decoded_bytes: int | None = None,
) -> Any:
    """Decode one JSON text safely (see :mod:`cockpit_core.log`).

    Args:
        text: The JSON text.
        max_array_elements: Largest array decoded (default :data:`MAX_ARRAY_ELEMENTS`).
        max_decoded_bytes: Bytes the arrays may take besides :data:`MAX_DECODED_RATIO` per
            byte of ``text`` (default :data:`MAX_DECODED_BYTES`).

    Raises:
        UnsafeLogError: An entry would import or build objects.
        LogFormatError: The text is not valid JSON, holds a malformed entry or exceeds a
            limit.

    """
    limit = log_format.MAX_ARRAY_ELEMENTS if max_array_elements is None else max_array_elements
    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        return decode_value(text, limit, Budget(max_decoded_bytes))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LogFormatError(f"not valid JSON ({err}).") from None
