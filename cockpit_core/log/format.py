"""What the log format fixes for the encoder, the reader and the writer alike.

Its version, its limits, the placeholder prefix, the marker keys and numpy dtypes it allows,
how a record line starts, and how dict keys that look like markers (``"__x__"``) are
escaped with a ``~`` on writing and unescaped on reading. :mod:`cockpit_core.log`
describes the format as a whole.

The other modules look the public constants up here when they use them, so setting one
in this module (``cockpit_core.log.format.MAX_LINE_BYTES = 2**31``) changes it for the
reader and the writer alike.
"""

from __future__ import annotations

import re

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

MAX_DECODED_BYTES = 2**24
"""Bytes of arrays that one read (a log file, a consolidated file or one ``loads`` call) may
decode to on top of :data:`MAX_DECODED_RATIO` per byte of its text (16 MiB)."""

MAX_DECODED_RATIO = 8
"""Bytes of arrays that each byte of text read may decode to, besides :data:`MAX_DECODED_BYTES`.

cockpit writes arrays as lists of numbers, at least two characters (``0,``) for an element
of at most 8 bytes (a complex one is written as 20 characters or more), so its logs decode
to at most 4 bytes per byte; only compressed json-tricks arrays (``b64.gz:``) go beyond.
The reader checks each array's declared size against what is left before decoding it."""

MAX_VALUE_DEPTH = 64
"""Most levels of nested dicts/lists in a value; deeper parts become placeholders."""

MAX_INT_BITS = 2**20
"""Largest Python int (in bits) written exactly (as ``__int__``); larger ones are placeholders."""

MAX_PENDING_BYTES = 2**26
"""Default bound of the buffer that holds records the writer could not write (64 MiB)."""

PLACEHOLDER_PREFIX = "<unserializable: "
"""Every placeholder string starts with this."""

SAFE_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 "
    "complex64 complex128".split()
)
ALLOWED_MARKERS = frozenset({"__ndarray__", "__complex__", "__int__"})
NDARRAY_KEYS = frozenset({"__ndarray__", "dtype", "shape", "Corder", "endian"})
RECORD_START = re.compile(rb'\s*\{\s*"kind"\s*:')
HEADER_START = re.compile(rb'\s*\{\s*"kind"\s*:\s*"header"')


def is_marker(key: str) -> bool:
    """Whether ``key`` has the shape of a type marker (``__ndarray__``, ...)."""
    return len(key) >= 4 and key.startswith("__") and key.endswith("__")


def escape(key: str) -> str:
    """Marker-like keys (``~*__x__``) get one more leading ``~``; others stay."""
    return "~" + key if is_marker(key.lstrip("~")) else key


def unescape(key: str) -> str:
    """The key :func:`escape` was given (one leading ``~`` of a marker-like key dropped)."""
    if key.startswith("~") and is_marker(key.lstrip("~")):
        return key[1:]
    return key
