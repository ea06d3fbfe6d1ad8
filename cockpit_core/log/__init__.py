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
most :data:`MAX_ARRAY_ELEMENTS` elements, the arrays of a file at most
:data:`MAX_DECODED_BYTES` plus :data:`MAX_DECODED_RATIO` bytes per byte read (checked
before anything is allocated, and compressed payloads are never inflated beyond their
declared size); every malformed input raises :class:`LogFormatError` naming the file and
line, or saying that the file as a whole is not a cockpit log. :func:`check_log_path` tells,
without touching anything, whether a :class:`LogWriter` can open a path. See
``docs/log_format.md``.

For sinks that feed experiment trackers, ``TagMap`` of :mod:`cockpit_core.log.scalars`
names each value of a record as a scalar tag (``cockpit/grad_norm/total``), the same in
every tracker.
"""

from __future__ import annotations

from cockpit_core.log.atomic import write_json_atomic
from cockpit_core.log.data import LogData
from cockpit_core.log.decode import LogFormatError, UnsafeLogError, loads
from cockpit_core.log.encode import (
    Placeholder,
    clean_value,
    dumps,
    placeholder,
    unserializable_notes,
)
from cockpit_core.log.format import (
    LOG_FORMAT_VERSION,
    MAX_ARRAY_ELEMENTS,
    MAX_DECODED_BYTES,
    MAX_DECODED_RATIO,
    MAX_INT_BITS,
    MAX_LINE_BYTES,
    MAX_PENDING_BYTES,
    MAX_VALUE_DEPTH,
    PLACEHOLDER_PREFIX,
)
from cockpit_core.log.read import read_log, read_records, read_run
from cockpit_core.log.write import LogWriter, check_log_path

__all__ = [
    "LOG_FORMAT_VERSION",
    "MAX_ARRAY_ELEMENTS",
    "MAX_DECODED_BYTES",
    "MAX_DECODED_RATIO",
    "MAX_INT_BITS",
    "MAX_LINE_BYTES",
    "MAX_PENDING_BYTES",
    "MAX_VALUE_DEPTH",
    "PLACEHOLDER_PREFIX",
    "LogData",
    "LogFormatError",
    "LogWriter",
    "Placeholder",
    "UnsafeLogError",
    "check_log_path",
    "clean_value",
    "dumps",
    "loads",
    "placeholder",
    "read_log",
    "read_records",
    "read_run",
    "unserializable_notes",
    "write_json_atomic",
]
