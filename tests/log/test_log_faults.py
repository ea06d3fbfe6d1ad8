"""No record is lost: full disks, restarts on an existing log, rewrites killed midway (issue 17)."""

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import cockpit_core.log as log_module
import cockpit_core.log.atomic_file as atomic_file
import cockpit_core.log.format as log_format
import cockpit_core.log.write as log_write
from cockpit_core import Cockpit, ConfigError
from cockpit_core.log import LogFormatError, LogWriter, read_log, read_records, read_run
from cockpit_core.testing import run_cockpit, tiny_mlp

ENOSPC = "[Errno 28] No space left on device"


class FullDisk:
    """Wraps a writer's file; while ``full``, a write stores half its bytes, then fails."""

    def __init__(self, file):
        self.file = file
        self.full = False

    def write(self, data):
        if self.full:
            self.file.write(bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)


def full_disk_writer(path, **kwargs):
    writer = LogWriter(path, **kwargs)
    disk = writer._file = FullDisk(writer._file)
    return writer, disk


def values(step):
    return {"kind": "values", "step": step, "values": {"loss": float(step), "a": np.ones(2)}}


def messages(caught):
    return [str(w.message) for w in caught]


def strict_read(path):
    """``read_run`` that fails on any warning (e.g. about a torn line)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return read_run(path)


# -- a full disk ----------------------------------------------------------------------------


def test_records_written_while_the_disk_is_full_are_buffered_and_written_later(tmp_path):
    path = tmp_path / "log.jsonl"
    writer, disk = full_disk_writer(path, fsync_every=None)
    writer({"kind": "header", "quantities": []})
    for step in range(3):
        writer(values(step))
    disk.full = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3, 6):
            writer(values(step))  # never raises
    assert messages(caught) == [
        f"cockpit log: cannot write to {path} ({ENOSPC}); keeping unwritten records in memory "
        f"(up to {2**26} bytes) and retrying with every new record. With keep_in_memory=False "
        "this buffer is the only copy of them."
    ]
    with pytest.warns(UserWarning, match="torn last line"):  # half a line reached the disk
        assert {0, 1, 2} <= set(read_log(path))
    disk.full = False
    with pytest.warns(UserWarning) as caught:
        writer(values(6))
    assert messages(caught) == [
        f"cockpit log: writing to {path} works again; 3 buffered records were written."
    ]
    writer.close()
    run = strict_read(path)  # the torn bytes were cut before retrying
    assert sorted(run.output) == list(range(7))
    assert writer.lost == 0


def test_a_disk_full_until_close_loses_only_the_unwritten_records(tmp_path):
    path = tmp_path / "log.jsonl"
    writer, disk = full_disk_writer(path, fsync_every=None)
    writer({"kind": "header", "quantities": []})
    writer(values(0))
    disk.full = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer(values(1))
        writer(values(2))
        writer.close()  # tries once more, then warns; never raises
    assert messages(caught)[-1] == (
        f"cockpit log: 2 records could not be written to {path} and are lost ({ENOSPC})."
    )
    assert writer.lost == 2 and writer.closed
    assert sorted(strict_read(path).output) == [0]  # valid to the end: no torn tail left


def test_the_buffer_is_bounded_and_counts_what_it_drops(tmp_path):
    path = tmp_path / "log.jsonl"
    line = len(log_module.dumps(values(10))) + 1
    writer, disk = full_disk_writer(path, fsync_every=None, max_pending_bytes=3 * line)
    writer(values(0))
    disk.full = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(10, 16):
            writer(values(step))
    assert messages(caught)[1] == (
        f"cockpit log: the buffer of unwritten records for {path} is full ({3 * line} bytes); "
        "newer records are dropped until writing works again."
    )
    assert writer.lost == 3
    disk.full = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer(values(16))
        writer.close()
    assert messages(caught) == [
        f"cockpit log: writing to {path} works again; 3 buffered records were written.",
        f"cockpit log: 3 records could not be written to {path} and are lost ({ENOSPC}).",
    ]
    assert sorted(strict_read(path).output) == [0, 10, 11, 12, 16]


def test_fsync_failures_are_warned_once_and_records_still_written(tmp_path, monkeypatch):
    def failing_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(log_write.os, "fsync", failing_fsync)
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path, fsync_every=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            writer(values(step))
        writer.close()
    assert messages(caught) == [
        f"cockpit log: fsync of {path} failed ([Errno 5] Input/output error); records are "
        "written but may not survive a crash of the machine."
    ]
    assert sorted(read_log(path)) == [0, 1, 2]


def _train(cp, model, problem, steps, opt):
    loss_fn = problem.loss_module()
    for step in steps:
        x, y = problem.batch(step)
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        info = {
            "loss": loss,
            "individual_losses": problem.individual_losses(out, y).detach(),
            "batch_size": len(x),
            "optimizer": opt,
        }
        with cp(step, info=info):
            loss.backward()
        opt.step()


def test_training_with_keep_in_memory_false_survives_a_full_disk(tmp_path):
    path = tmp_path / "log.jsonl"
    problem = tiny_mlp()
    model = problem.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cp = Cockpit(model.named_parameters(), ["loss", "grad_norm"], log=path, keep_in_memory=False)
    disk = cp._log._file = FullDisk(cp._log._file)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(cp, model, problem, range(0, 2), opt)
        disk.full = True
        _train(cp, model, problem, range(2, 5), opt)
        disk.full = False
        _train(cp, model, problem, range(5, 6), opt)
        cp.close()
    assert cp._log in cp.sinks  # never removed
    text = messages(caught)
    assert any(m.startswith(f"cockpit log: cannot write to {path}") for m in text)
    # steps 2-4: their values and the cost records of steps 1-3 (written as 2-4 enter)
    assert f"cockpit log: writing to {path} works again; 6 buffered records were written." in text
    output = strict_read(path).output
    assert sorted(output) == list(range(6))
    assert all(set(v) == {"loss", "grad_norm"} for v in output.values())


# -- atomic cp.write ------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import cockpit_core.log.atomic_file as atomic
    from cockpit_core.testing import run_cockpit, tiny_mlp

    cp = run_cockpit(tiny_mlp(), ["loss"], steps=2).cockpit
    cp.write(sys.argv[1])
    print("first", flush=True)
    cp._tracker.output[99] = {"loss": 1.0}
    def killed(fd):
        os.kill(os.getpid(), signal.SIGKILL)
    atomic.os.fsync = killed
    cp.write(sys.argv[1])
    print("not reached", flush=True)
    """
)


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL is POSIX only")
def test_a_write_killed_midway_leaves_the_previous_file_intact(tmp_path):
    path = tmp_path / "output.json"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.split() == ["first"]
    assert sorted(read_log(path)) == [0, 1]  # the previous, complete file
    leftovers = [p.name for p in tmp_path.iterdir() if p != path]
    assert len(leftovers) == 1 and leftovers[0].startswith(".output.json.")
    assert leftovers[0].endswith(".tmp")


def test_a_failed_write_raises_and_keeps_the_previous_file(tmp_path, monkeypatch):
    cp = run_cockpit(tiny_mlp(), ["loss"], steps=2).cockpit
    path = cp.write(tmp_path / "output.json")
    before = path.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_file.os, "fsync", full)
    cp._tracker.output[5] = {"loss": 0.5}
    with pytest.raises(OSError, match="No space left"):
        cp.write(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["output.json"]  # no temporary file left


def test_write_keeps_the_mode_of_an_existing_file_and_uses_the_umask_for_new_ones(tmp_path):
    cp = run_cockpit(tiny_mlp(), ["loss"], steps=1).cockpit
    umask = os.umask(0o022)
    try:
        fresh = cp.write(tmp_path / "new.json")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
        fresh.chmod(0o600)
        cp.write(fresh)
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
    finally:
        os.umask(umask)


def test_write_handles_any_value(tmp_path):
    cp = run_cockpit(tiny_mlp(), ["loss"], steps=1).cockpit
    cp._tracker.output[0]["odd"] = {"m": torch.empty(2, device="meta"), "__x__": 10**5000}
    output = read_log(cp.write(tmp_path / "o.json"))
    assert output[0]["odd"] == {
        "m": "<unserializable: meta tensor of shape [2]>",
        "__x__": 10**5000,
    }


# -- restarting on an existing log ----------------------------------------------------------


def test_a_new_cockpit_appends_a_run_and_later_runs_win(tmp_path, returning):
    path = tmp_path / "log.jsonl"
    first = run_cockpit(
        tiny_mlp(), ["tagged"], steps=4, registry=returning(lambda s: 100 + s, "tagged"), log=path
    )
    first.cockpit.close()
    with pytest.warns(UserWarning) as caught:
        second = run_cockpit(
            tiny_mlp(),
            ["tagged"],
            steps=2,
            registry=returning(lambda s: 200 + s, "tagged"),
            log=path,
        )
    second.cockpit.close()
    assert [str(w.message) for w in caught if "already holds" in str(w.message)] == [
        f"cockpit log: {path} already holds a log; appending run 2 to it (readers show, for "
        "every step, the values of the latest run that recorded it)."
    ]
    records = read_records(path)
    assert [r["run"] for r in records if r["kind"] == "header"] == [1, 2]
    kinds = [r["kind"] for r in records]  # nothing of the first run was truncated
    assert len(kinds) - kinds.count("cost") == 1 + 4 + 1 + 2 and kinds.count("cost") == 4 + 2
    run = strict_read(path)
    assert {s: v["tagged"] for s, v in run.output.items()} == {0: 200, 1: 201, 2: 102, 3: 103}
    assert [h["run"] for h in run.headers] == [1, 2] and run.header is run.headers[-1]
    with pytest.warns(UserWarning, match="appending run 3"):
        LogWriter(path).close()


def test_a_torn_last_line_is_cut_before_appending(tmp_path):
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    writer({"kind": "header", "quantities": []})
    for step in range(3):
        writer(values(step))
    writer.close()
    torn = b'{"kind":"values","step":3,"values":{"loss":3.0,"a":{"__nda'
    with open(path, "ab") as f:
        f.write(torn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer = LogWriter(path)
    assert messages(caught) == [
        f"cockpit log: {path} ended in an incomplete line of {len(torn)} bytes (a run killed "
        "while writing it); it was cut off before appending.",
        f"cockpit log: {path} already holds a log; appending run 2 to it (readers show, for "
        "every step, the values of the latest run that recorded it).",
    ]
    writer(values(3))  # no header given: the writer starts the run with one
    writer.close()
    records = read_records(path)
    assert [(r["kind"], r.get("step"), r.get("run")) for r in records] == [
        ("header", None, 1),
        ("values", 0, None),
        ("values", 1, None),
        ("values", 2, None),
        ("header", None, 2),
        ("values", 3, None),
    ]
    assert sorted(strict_read(path).output) == [0, 1, 2, 3]


def test_a_complete_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"kind":"header","run":4}\n{"kind":"values","step":0,"values":{"a":1}}')
    with pytest.warns(UserWarning, match="appending run 5"):
        writer = LogWriter(path)
    writer(values(1))
    writer.close()
    assert sorted(strict_read(path).output) == [0, 1]


def test_an_empty_or_torn_only_file_starts_run_one(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"kind":"hea')
    with pytest.warns(UserWarning, match="incomplete line of 12 bytes"):
        writer = LogWriter(path)
    writer({"kind": "header"})
    writer.close()
    assert read_records(path) == [{"kind": "header", "log_format": 2, "run": 1}]


@pytest.mark.parametrize(
    "content", [b"some notes\n", b'{"header": {}, "output": {}}\n', b"\x00\x01binary"]
)
def test_a_file_that_is_not_a_log_is_never_touched(tmp_path, content):
    path = tmp_path / "log.jsonl"
    path.write_bytes(content)
    message = (
        f"{path} exists and is not a cockpit JSON Lines log (it does not start with a record); "
        "cockpit never overwrites a file: choose another log path, or move the file away."
    )
    with pytest.raises(LogFormatError) as err:
        LogWriter(path)
    assert str(err.value) == message
    with pytest.raises(ConfigError) as err:
        Cockpit(torch.nn.Linear(2, 1).parameters(), ["loss"], log=path)
    assert f"log: cannot open the log file {path!r}: {message}" in str(err.value)
    assert path.read_bytes() == content


def test_runs_override_values_errors_and_skips_of_the_steps_they_record(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = [
        '{"kind":"header","run":1,"quantities":["a"]}',
        '{"kind":"values","step":0,"values":{"a":10,"b":1}}',
        '{"kind":"values","step":1,"values":{"a":11}}',
        '{"kind":"error","step":1,"quantity":"a","phase":"single","error":"E1"}',
        '{"kind":"skipped","step":2,"quantities":["a"],"reason":"nan"}',
        '{"kind":"values","step":3,"values":{"a":13}}',
        '{"kind":"header","run":2,"quantities":["a"]}',
        '{"kind":"values","step":1,"values":{"a":21}}',
        '{"kind":"error","step":2,"quantity":"a","phase":"single","error":"E2"}',
        '{"kind":"values","step":0,"values":{"a":20}}',
        '{"kind":"values","step":0,"values":{"c":3}}',
    ]
    path.write_text("\n".join(lines) + "\n")
    run = strict_read(path)
    assert run.output == {0: {"a": 20, "c": 3}, 1: {"a": 21}, 3: {"a": 13}}
    assert [e["error"] for e in run.errors] == ["E2"]
    assert run.skipped == []
    assert run.header == {"run": 2, "quantities": ["a"]}
    assert [h["run"] for h in run.headers] == [1, 2]


def test_a_record_too_large_for_one_line_is_written_with_placeholders(tmp_path, monkeypatch):
    monkeypatch.setattr(log_format, "MAX_LINE_BYTES", 4096)
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path)
    record = {"kind": "values", "step": 7, "values": {"small": 1.0, "big": np.zeros(5000)}}
    with pytest.warns(UserWarning) as caught:
        writer(record)
    writer.close()
    size = len(log_module.dumps(np.zeros(5000)))
    assert [str(w.message) for w in caught] == [
        f"cockpit log: a 'values' record of {len(log_module.dumps(record))} bytes is larger than the limit of "
        "4096 bytes; ['big'] were written as placeholders."
    ]
    text = f"<unserializable: value of {size} bytes, too large for one log line (the limit is 4096 bytes)>"
    run = strict_read(path)
    assert run.output == {7: {"small": 1.0, "big": text}}
    assert [(e["step"], e["quantity"], e["phase"], e["error"]) for e in run.errors] == [
        (7, "big", "serialize", f"UnserializableValue: {text}")
    ]
