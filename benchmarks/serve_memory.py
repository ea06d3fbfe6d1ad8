"""Memory and time per change of ``cockpit serve`` on a large synthetic log (issue 29).

Usage: ``python benchmarks/serve_memory.py [MB] [--feed] [--resumed]`` (default 100 MB). The log is
written once to ``$TMPDIR/cockpit_serve_memory/log.jsonl`` (kept for the next run: the same
file for the code before and after). Each measurement runs in a fresh process, with the
``cockpit_core`` that is first on ``PYTHONPATH`` (``PYTHONPATH=/tmp/serve_before`` for a
``git worktree`` of the code before):

* follower: a ``LogFollower`` reads the whole log; then 5 times one record is appended, the
  follower polled and its series taken (what the page draws), timed;
* ``--resumed``: the log ends with a second run's header and ``resumed`` record (a
  training resumed from the last step's checkpoint); the appended records are that run's;
* ``--feed``: a ``Feed`` with the diagnoses (``cockpit serve``'s default) builds the page
  once; then 3 times one record is appended and the page built again with the diagnoses
  due, timed.

Memory is the process's peak RSS (``ru_maxrss``) minus the RSS after the imports; one JSON
line per measurement.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

KEYS = ["loss", "grad_norm", "distance", "update_size", "alpha", "time", "norm_test"]


def record(step: int) -> str:
    values = {
        "loss": 2.0 / (1 + step) + (step % 7) * 1e-3,
        "grad_norm": {"total": 1.0 + (step % 13) * 0.01},
        "distance": {"total": step * 1e-3},
        "update_size": {"total": 1e-3 + (step % 5) * 1e-5},
        "alpha": {"alpha": (step % 11) / 11 - 0.5, "exact": True},
        "time": {"time": step * 0.01},
        "norm_test": {"ratio": 0.5 + (step % 17) * 0.01},
    }
    return json.dumps({"kind": "values", "step": step, "values": values}) + "\n"


def generate(path: str, megabytes: float) -> int:
    header = {
        "kind": "header",
        "run": 1,
        "log_format": 2,
        "quantities": [{"name": k, "key": k} for k in KEYS],
        "params": [],
    }
    step = 0
    with open(path, "w") as f:
        f.write(json.dumps(header) + "\n")
        while f.tell() < megabytes * 1e6:
            f.writelines(record(s) for s in range(step, step + 1000))
            step += 1000
    return step


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def child(path: str, steps: int, feed: bool) -> None:
    import cockpit_web.feed as feed_module
    from cockpit_web import Feed
    from cockpit_web.follow import LogFollower

    base = _rss_mb()
    start = time.perf_counter()
    changes = []
    if feed:
        feed_module.DIAGNOSE_SHARE = 1e9  # the diagnoses are due again at every change
        page = Feed([path])
        while page.poll():  # the whole backlog (16 MB per poll)
            pass
        page.payload()
        first = time.perf_counter() - start
        for i in range(3):
            with open(path, "a") as f:
                f.write(record(steps + i))
            start = time.perf_counter()
            payload = page.payload()
            changes.append(time.perf_counter() - start)
        points = payload["points"]
        records = page.runs[0].records
    else:
        follower = LogFollower(path, "run")
        while follower.poll():
            pass
        first = time.perf_counter() - start
        for i in range(5):
            with open(path, "a") as f:
                f.write(record(steps + i))
            start = time.perf_counter()
            follower.poll()
            _ = follower.series  # what the page draws
            changes.append(time.perf_counter() - start)
        points = sum(len(s) for s in follower.series.values())
        records = follower.records
    print(
        json.dumps(
            {
                "mode": ("feed+diagnose" if feed else "follower")
                + (" resumed" if os.environ.get("SERVE_RESUMED") else ""),
                "code": os.environ.get("PYTHONPATH", ""),
                "records": records,
                "first_read_s": round(first, 2),
                "peak_rss_mb": round(_rss_mb() - base, 1),
                "change_s_median": round(sorted(changes)[len(changes) // 2], 4),
                "points_shown": points,
            }
        )
    )


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--child"]:
        child(args[1], int(args[2]), args[3] == "feed")
        return
    feed = "--feed" in args
    resumed = "--resumed" in args
    args = [a for a in args if a not in ("--feed", "--resumed")]
    megabytes = float(args[0]) if args else 100
    folder = os.path.join(tempfile.gettempdir(), "cockpit_serve_memory")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"log-{megabytes:g}.jsonl")
    meta = path + ".steps"
    if not os.path.exists(meta):
        steps = generate(path, megabytes)
        with open(meta, "w") as f:
            f.write(str(steps))
    with open(meta) as f:
        steps = int(f.read())
    work = os.path.join(folder, "work.jsonl")  # appended to: a fresh copy per measurement
    shutil.copyfile(path, work)
    if resumed:  # a second run resumed from the last step's checkpoint: the changes are its
        with open(path) as f:
            header = f.readline()
        with open(work, "a") as f:
            f.write(header + json.dumps({"kind": "resumed", "step": steps - 1, "from_run": 1}))
            f.write("\n")
    size = os.path.getsize(work)
    print(f"log: {size / 1e6:.1f} MB, {steps} steps; load before: {os.getloadavg()}")
    out = subprocess.run(
        [sys.executable, __file__, "--child", work, str(steps), "feed" if feed else "follow"],
        capture_output=True,
        text=True,
        env={**os.environ, "SERVE_RESUMED": "1" if resumed else ""},
    )
    print(out.stdout.strip() or out.stderr[-2000:])
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
