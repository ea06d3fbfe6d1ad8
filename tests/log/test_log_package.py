"""``cockpit_core.log`` is a package: its public names, and limits set in ``log.format``."""

import pytest

import cockpit_core.log as log
import cockpit_core.log.format as log_format
from cockpit_core.log import LogFormatError, LogWriter, read_records


def test_every_public_name_is_importable_from_the_package():
    names = {
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
    }
    assert set(log.__all__) == names
    assert all(getattr(log, name) is not None for name in names)


def test_a_limit_set_in_the_format_module_applies_to_the_reader(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    writer({"kind": "values", "step": 0, "values": {"loss": 1.0, "note": "x" * 200}})
    writer.close()
    assert len(read_records(path)) == 1

    monkeypatch.setattr(log_format, "MAX_LINE_BYTES", 100)
    with pytest.raises(LogFormatError, match="longer than the limit of 100 bytes"):
        read_records(path)

    monkeypatch.undo()
    assert log_format.MAX_LINE_BYTES == 2**30
    assert len(read_records(path)) == 1
