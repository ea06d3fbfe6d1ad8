"""One writer per log, torn tails cut only from the file itself, non-regular paths refused.

Issue 29 (points 1 and 7): a second writer on a log (another process, or a second Cockpit
in this one) is refused at construction with the holder's PID; after a full disk the file
holds no NUL byte and every complete record; a FIFO, a device or a dangling symbolic link is
refused before anything is opened (a FIFO never blocks).
"""

import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest
import torch

import cockpit_core.log.write as log_write
from cockpit_core import Cockpit, ConfigError
from cockpit_core.errors import LogLockedError, MisuseError
from cockpit_core.log import LogWriter, check_log_path, read_records, read_run
from cockpit_core.log.lock import HAVE_LOCK, sidecar_path

pytestmark = pytest.mark.skipif(os.name != "posix", reason="flock, FIFOs and rlimits: POSIX")

HOLDER = textwrap.dedent(
    """
    import sys
    import torch
    from cockpit_core import Cockpit

    cp = Cockpit(torch.nn.Linear(2, 1).parameters(), ["loss"], log=sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()  # hold the log until told to close it
    cp.close()
    """
)


def locked(path, who):
    return (
        f"cockpit log: {path} is being written by {who}; a log has one writer at a time. "
        "Give this Cockpit another log path (log=...), or close the other Cockpit "
        "(cp.close()) or wait for that process to end, then try again."
    )


def new_cockpit(path, **kwargs):
    return Cockpit(torch.nn.Linear(2, 1).parameters(), ["loss"], log=path, **kwargs)


def strict_read(path):
    """``read_run`` that fails on any warning (e.g. about a torn line)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return read_run(path)


def values(step, size=2):
    return {"kind": "values", "step": step, "values": {"loss": float(step), "a": np.ones(size)}}


def headers(path):
    return [r["run"] for r in read_records(path) if r["kind"] == "header"]


@pytest.fixture
def holder(tmp_path):
    """A child process that holds ``tmp_path / "log.jsonl"`` open in a Cockpit."""
    path = tmp_path / "log.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line == "ready\n", proc.stderr.read() if proc.poll() is not None else line
        yield proc, path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()


# -- one writer at a time ---------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_LOCK, reason="no fcntl: logs are not locked")
def test_a_second_process_is_refused_with_the_holders_pid_and_may_write_once_it_ends(holder):
    proc, path = holder
    assert sidecar_path(path).read_text() == f"{proc.pid}\n"
    size = path.stat().st_size
    for on_error in ("warn", "disable", "raise"):
        with pytest.raises(LogLockedError) as err:
            new_cockpit(path, on_error=on_error)
        assert str(err.value) == locked(path, f"another process (PID {proc.pid})")
        assert isinstance(err.value, MisuseError)
    with pytest.raises(LogLockedError, match=f"PID {proc.pid}"):
        LogWriter(path)
    assert path.stat().st_size == size  # the refused writers changed nothing
    proc.stdin.write("\n")  # the holder closes its Cockpit and ends
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert not sidecar_path(path).exists()  # deleted on close
    with pytest.warns(UserWarning, match="appending run 2"):
        cp = new_cockpit(path)
    cp.close()
    assert headers(path) == [1, 2]
    assert [h["run"] for h in strict_read(path).headers] == [1, 2]


@pytest.mark.skipif(not HAVE_LOCK, reason="no fcntl: logs are not locked")
def test_a_killed_holder_releases_the_lock(holder):
    proc, path = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert sidecar_path(path).exists()  # stale, harmless: overwritten by the next writer
    with pytest.warns(UserWarning, match="appending run 2"):
        writer = LogWriter(path)
    assert sidecar_path(path).read_text() == f"{os.getpid()}\n"
    writer(values(0))
    writer.close()
    assert not sidecar_path(path).exists()
    assert headers(path) == [1, 2] and sorted(strict_read(path).output) == [0]


@pytest.mark.skipif(not HAVE_LOCK, reason="no fcntl: logs are not locked")
@pytest.mark.parametrize("on_error", ["warn", "disable", "raise"])
def test_a_second_cockpit_in_the_same_process_is_refused(tmp_path, on_error):
    path = tmp_path / "log.jsonl"
    first = new_cockpit(path)
    size = path.stat().st_size
    with pytest.raises(LogLockedError) as err:
        new_cockpit(path, on_error=on_error)
    who = f"another Cockpit (or LogWriter) in this process (PID {os.getpid()})"
    assert str(err.value) == locked(path, who)
    with pytest.raises(LogLockedError) as err:
        LogWriter(path)
    assert str(err.value) == locked(path, who)
    assert path.stat().st_size == size
    first.close()
    with pytest.warns(UserWarning, match="appending run 2"):
        second = new_cockpit(path)
    second.close()
    first.close()  # closing again changes nothing
    assert headers(path) == [1, 2]


@pytest.mark.skipif(not HAVE_LOCK, reason="no fcntl: logs are not locked")
def test_the_lock_follows_the_file_not_its_name(tmp_path):
    path = tmp_path / "log.jsonl"
    link = tmp_path / "link.jsonl"
    writer = LogWriter(path)
    os.symlink(path, link)
    with pytest.raises(LogLockedError, match=f"in this process \\(PID {os.getpid()}\\)"):
        LogWriter(link)  # the same file under another name
    writer.close()
    LogWriter(link).close()


@pytest.mark.skipif(not HAVE_LOCK, reason="no fcntl: logs are not locked")
@pytest.mark.filterwarnings("ignore::ResourceWarning")  # the garbage writer was never closed
def test_an_unreferenced_writer_of_this_process_does_not_block(tmp_path):
    path = tmp_path / "log.jsonl"
    cycle = {"writer": LogWriter(path)}
    cycle["writer"](values(0))
    cycle["self"] = cycle  # only the garbage collector frees it
    del cycle
    with pytest.warns(UserWarning, match="appending run 2"):
        LogWriter(path).close()


# -- repairs measured on the file, never beyond the writer's own tail -------------------------


class FailingDisk:
    """Wraps a writer's file; while ``full``, a write stores a third of its bytes, then fails."""

    def __init__(self, file):
        self.file = file
        self.full = False

    def write(self, data):
        if self.full:
            self.file.write(bytes(data[: len(data) // 3]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)


def test_a_file_cut_short_by_someone_else_is_never_extended_with_nul_bytes(tmp_path):
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path, fsync_every=None)
    disk = writer._file = FailingDisk(writer._file)
    for step in range(3):
        writer(values(step))
    disk.full = True
    with pytest.warns(UserWarning, match="cannot write"):
        writer(values(3))
    os.truncate(path, 0)  # the file shrank below where the failed write began
    disk.full = False
    with pytest.warns(UserWarning, match="works again"):
        writer(values(4))
    writer.close()
    data = path.read_bytes()
    assert b"\x00" not in data
    assert data.endswith(b"\n") and sorted(strict_read(path).output) == [3, 4]


def test_a_tail_that_is_not_the_writers_own_is_left_alone(tmp_path):
    path = tmp_path / "log.jsonl"
    writer = LogWriter(path, fsync_every=None)
    disk = writer._file = FailingDisk(writer._file)
    writer(values(0))
    disk.full = True
    with pytest.warns(UserWarning, match="cannot write"):
        writer(values(1))
    with open(path, "ab") as f:  # another program appends, ignoring the lock
        f.write(b"foreign\n")
    disk.full = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer(values(2))
    assert (
        f"cockpit log: {path} was changed by another program while this writer held it; "
        "its end was left as it is."
    ) in [str(w.message) for w in caught]
    writer.close()
    assert b"foreign\n" in path.read_bytes()


DISK_FULL = textwrap.dedent(
    """
    import resource, signal, sys, warnings
    import numpy as np
    from cockpit_core.log import LogWriter

    warnings.simplefilter("ignore")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    path, limit, recover = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    writer = LogWriter(path, fsync_every=0)
    writer({"kind": "header", "quantities": ["loss", "a"]})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    failed = 0
    for step in range(60):  # lines of varying length: writes stop in the middle of one
        writer({"kind": "values", "step": step,
                "values": {"loss": float(step), "a": np.ones(1 + step % 7)}})
        failed += writer._error is not None
    if recover:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        writer({"kind": "values", "step": 60, "values": {"loss": 60.0}})
    writer.close()
    print(failed, writer.lost)
    """
)


@pytest.mark.parametrize("recover", [False, True])
def test_a_size_limited_file_keeps_only_complete_records_and_no_nul_byte(tmp_path, recover):
    path = tmp_path / "log.jsonl"
    limit = 3000
    out = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(path), str(limit), str(int(recover))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    failed, lost = map(int, out.stdout.split())
    assert failed > 0  # the limit was reached mid-run
    data = path.read_bytes()
    assert b"\x00" not in data and data.endswith(b"\n")
    run = strict_read(path)  # every line complete: no torn tail is warned about
    steps = sorted(run.output)
    assert len(read_records(path)) == data.count(b"\n")
    if recover:
        assert lost == 0 and steps == list(range(61))
    else:
        assert len(data) <= limit and lost == 60 - len(steps) > 0
        assert steps == list(range(len(steps)))  # the first records, in order
    for step in steps[:60]:
        assert run.output[step]["loss"] == float(step)
        np.testing.assert_array_equal(run.output[step]["a"], np.ones(1 + step % 7))
    assert not sidecar_path(path).exists()


# -- non-regular files and dangling links are refused before any open -------------------------


def finishes(fn, timeout=10.0):
    """Run ``fn`` in a daemon thread; what it raised (``None``), or fail if it blocks."""
    result = []

    def target():
        try:
            fn()
            result.append(None)
        except BaseException as err:  # noqa: BLE001 - handed back to the test
            result.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "blocked: a FIFO was opened"
    return result[0]


def test_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / "log.jsonl"
    os.mkfifo(path)
    message = (
        f"{path} is a FIFO (named pipe), not a regular file; a cockpit log must be a regular "
        "file (it is never opened otherwise): choose another log path."
    )
    for fn in (
        lambda: check_log_path(path),
        lambda: LogWriter(path),
        lambda: log_write._open_regular(path),  # a FIFO put in place after the check
    ):
        err = finishes(fn)
        assert type(err) is OSError and str(err) == message
    err = finishes(lambda: new_cockpit(path, on_error="warn"))
    assert isinstance(err, ConfigError)
    assert f"log: cannot open the log file {path!r}: {message}" in str(err)


def test_a_device_is_refused(tmp_path):
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null")
    with pytest.raises(OSError) as err:
        LogWriter("/dev/null")
    assert str(err.value) == (
        "/dev/null is a character device, not a regular file; a cockpit log must be a "
        "regular file (it is never opened otherwise): choose another log path."
    )


def test_a_dangling_symlink_is_refused_and_its_target_not_created(tmp_path):
    path = tmp_path / "log.jsonl"
    target = tmp_path / "runs" / "missing.jsonl"
    os.symlink(target, path)
    message = (
        f"{path} is a symbolic link to {target}, which does not exist; cockpit does not "
        "create a link's target: give the path of a file (or of one to be created), or fix "
        "or remove the link."
    )
    for fn in (lambda: check_log_path(path), lambda: LogWriter(path)):
        err = finishes(fn)
        assert isinstance(err, FileNotFoundError) and str(err) == message
    err = finishes(lambda: new_cockpit(path))
    assert isinstance(err, ConfigError) and message in str(err)
    assert not target.exists() and not target.parent.exists()
    assert os.path.islink(path)


def test_a_symlink_to_a_log_is_followed(tmp_path):
    target = tmp_path / "log.jsonl"
    LogWriter(target).close()
    link = tmp_path / "link.jsonl"
    os.symlink(target, link)
    writer = LogWriter(link)
    writer(values(0))
    writer.close()
    assert sorted(strict_read(target).output) == [0]


def test_a_failed_construction_gives_the_log_back(tmp_path):
    """A Cockpit whose constructor fails holds no lock: the next one writes the log."""
    path = tmp_path / "log.jsonl"
    params = list(torch.nn.Linear(2, 1).parameters())
    with pytest.raises(ConfigError, match="backend"):
        Cockpit(params, ["loss"], log=path, backend="no-such-backend")
    cp = Cockpit(params, ["loss"], log=path)
    cp.close()
