"""Running one measured process, noise accounting, and the ratio statistics (overhead.py)."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from overhead_child import RESULT_TAG

CHILD = Path(__file__).resolve().parent / "overhead_child.py"


def _cpu_seconds() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, from ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:9]]
    except OSError:
        return 0.0, 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = vals
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def foreign_load(seconds: float) -> float:
    """CPU cores used by other processes over ``seconds`` (this process sleeps meanwhile)."""
    busy0, _ = _cpu_seconds()
    time.sleep(seconds)
    busy1, _ = _cpu_seconds()
    return (busy1 - busy0) / seconds


def wait_until_quiet(threshold: float, max_wait: float) -> tuple[float, float]:
    """Wait until other processes use at most ``threshold`` cores; return (waited s, load)."""
    t0 = time.perf_counter()
    load = foreign_load(0.3)
    while load > threshold and time.perf_counter() - t0 < max_wait:
        time.sleep(2.0)
        load = foreign_load(0.5)
    return time.perf_counter() - t0, load


def run_child(python: str, spec: dict, timeout: float) -> dict:
    """Run one configuration in a fresh process; never raises.

    Besides the child's own result, records ``foreign_cores``: CPU cores that other
    processes used meanwhile (machine busy time minus the child's CPU time, per wall second),
    and ``steal_cores`` (time the hypervisor gave our CPUs to others).
    """
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), PYTHONWARNINGS="ignore")
    busy0, steal0 = _cpu_seconds()
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [python, str(CHILD), json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(CHILD.parent),
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith(RESULT_TAG)]
        if lines:
            result = json.loads(lines[-1][len(RESULT_TAG) :])
        else:
            tail = (proc.stderr or proc.stdout)[-1500:]
            result = {"ok": False, "error": f"exit code {proc.returncode}: {tail.strip()}"}
    except subprocess.TimeoutExpired:
        result = {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    busy1, steal1 = _cpu_seconds()
    result["spec"] = spec
    result["wall_s"] = wall
    result["foreign_cores"] = max(0.0, (busy1 - busy0) - (_children_cpu() - cpu0)) / wall
    result["steal_cores"] = (steal1 - steal0) / wall
    return result


# -- statistics -----------------------------------------------------------------------------


def step_stat(times: list[float], every: int) -> float:
    """Median step time; tracking every N-th step: median over N-step periods of their mean."""
    if every == 1:
        return statistics.median(times)
    periods = [times[i : i + every] for i in range(0, len(times) - every + 1, every)]
    return statistics.median(statistics.fmean(p) for p in periods)


def plain_stat(runs: list[dict], every: int) -> float | None:
    """Plain step time from the neighbouring plain runs: median (every step) or mean."""
    times = [t for r in runs if r.get("ok") for t in r["times_s"]]
    if not times:
        return None
    return statistics.median(times) if every == 1 else statistics.fmean(times)


def summarize(unit: dict, plains: list[dict], threshold: float) -> dict:
    """Ratios of one configuration run to its neighbouring plain runs."""
    res, every = unit["result"], unit["every"]
    out: dict[str, Any] = {"ok": bool(res.get("ok")), "wall_s": res.get("wall_s")}
    out["foreign_cores"] = max(r.get("foreign_cores", 0.0) for r in [res, *plains])
    out["noisy"] = out["foreign_cores"] > threshold
    if not res.get("ok"):
        out["error"] = res.get("error", "failed")
        return out
    base = plain_stat(plains, every)
    step = step_stat(res["times_s"], every)
    out["step_ms"] = 1e3 * step
    out["plain_step_ms"] = None if base is None else 1e3 * base
    out["time_ratio"] = None if base is None else step / base
    rss = [r["peak_rss_mb"] for r in plains if r.get("ok")]
    # a peer's own imports (Opacus: ~110 MB) are left out: plain runs do not import it
    peak = res["peak_rss_mb"] - res.get("rss_peer_imports_mb", 0.0)
    out["peak_rss_mb"] = res["peak_rss_mb"]
    out["rss_ratio"] = peak / statistics.fmean(rss) if rss else None
    if "cuda_peak_mb" in res:
        cuda = [r["cuda_peak_mb"] for r in plains if r.get("ok") and "cuda_peak_mb" in r]
        out["cuda_peak_mb"] = res["cuda_peak_mb"]
        out["cuda_ratio"] = res["cuda_peak_mb"] / statistics.fmean(cuda) if cuda else None
    out["hvps_per_tracked_step"] = res.get("hvps_per_tracked_step")
    if "hess_max_ev_hvps_from_output" in res:
        out["hess_max_ev_hvps_from_output"] = res["hess_max_ev_hvps_from_output"]
    for key in ("params_served", "extended", "last_norms", "opacus_fixed_modules"):
        if key in res:
            out[key] = res[key]
    out["errors"] = res.get("errors", [])
    if res.get("torchvision_imported"):
        out["errors"] = out["errors"] + ["torchvision was imported"]
    return out


def unit_key(entry: dict) -> tuple:
    return (entry["kind"], entry["problem"], entry["every"], tuple(entry["config"] or ()))


def was_run(entry: dict) -> bool:
    """Whether a loaded configuration ran (successfully or with its own error)."""
    res = entry.get("result", {})
    return bool(res.get("ok")) or not str(res.get("error", "")).startswith("not run")


def drop_noisy(sequence: list[dict], threshold: float) -> tuple[list[dict], list[dict]]:
    """Split off configuration runs that were noisy (or whose preceding plain run was)."""
    keep: list[dict] = []
    moved: list[dict] = []
    last_plain: dict[tuple, dict] = {}
    for entry in sequence:
        res = entry.get("result", {})
        where = (entry["problem"], entry.get("session"))
        if entry["kind"] == "plain":
            last_plain[where] = res
            keep.append(entry)
            continue
        before = last_plain.get(where, {})
        noise = max(res.get("foreign_cores", 0.0), before.get("foreign_cores", 0.0))
        (moved if was_run(entry) and noise > threshold else keep).append(entry)
    return keep, moved


def aggregate(sequence: list[dict], problems: list[str], threshold: float) -> dict[str, Any]:
    """``{problem: {configuration: {kind: {interval: summary}}, "plain": {...}}}``."""
    results: dict[str, Any] = {}
    for i, entry in enumerate(sequence):
        if entry["kind"] == "plain":
            continue
        # neighbouring plain runs: the one just before (the plan puts one before every
        # configuration) and the next one of the same problem
        same = [
            (j, e)
            for j, e in enumerate(sequence)
            if e["kind"] == "plain"
            and e["problem"] == entry["problem"]
            and e.get("session") == entry.get("session")
        ]
        before = [e for j, e in same if j < i][-1:]
        after = [e for j, e in same if j > i][:1]
        plains = [e["result"] for e in before + after]
        summary = summarize(entry, plains, threshold)
        label = entry["config"][1]
        slot = results.setdefault(entry["problem"], {}).setdefault(
            label, {"type": entry["config"][0]}
        )
        slot.setdefault(entry["kind"], {})[str(entry["every"])] = summary
    for problem in problems:
        plain_runs = [
            e["result"] for e in sequence if e["kind"] == "plain" and e["problem"] == problem
        ]
        ok = [r for r in plain_runs if r.get("ok")]
        results.setdefault(problem, {})["plain"] = {
            "type": "plain",
            "step_ms_median": 1e3 * plain_stat(ok, 1) if ok else None,
            "step_ms_mean": 1e3 * plain_stat(ok, 2) if ok else None,
            "peak_rss_mb": statistics.fmean(r["peak_rss_mb"] for r in ok) if ok else None,
            "runs": len(plain_runs),
            "failed": len(plain_runs) - len(ok),
        }
        for slot in results[problem].values():
            ours, ref = slot.get("ours", {}), slot.get("reference", {})
            for every, mine in ours.items():
                theirs = ref.get(every)
                if mine.get("time_ratio") and theirs and theirs.get("time_ratio"):
                    mine["vs_reference"] = mine["time_ratio"] / theirs["time_ratio"]
                    mine["vs_reference_raw"] = mine["step_ms"] / theirs["step_ms"]
        _compare_paths(results[problem])
        _compare_peers(results[problem])
    return results


def _ratio(a: dict | None, b: dict | None, key: str) -> float | None:
    if a and b and a.get(key) and b.get(key):
        return a[key] / b[key]
    return None


def _compare_paths(configs: dict[str, Any]) -> None:
    """``vs_backpack_path``: a configuration's time ratio over that of ``NAME:backpack``."""
    for label, slot in configs.items():
        old = configs.get(f"{label}:backpack", {}).get("ours", {})
        for every, mine in slot.get("ours", {}).items():
            value = _ratio(mine, old.get(every), "time_ratio")
            if value is not None:
                mine["vs_backpack_path"] = value


def _compare_peers(configs: dict[str, Any]) -> None:
    """Per-sample norms: ours (``norm_test``) over each peer, and the peers' norms vs vmap's."""
    ours = configs.get("norm_test", {}).get("ours", {}).get("1")
    vmap = configs.get("vmap", {}).get("peer", {}).get("1") or {}
    for slot in configs.values():
        peer = slot.get("peer", {}).get("1")
        if not peer or not peer.get("ok"):
            continue
        if slot is not configs.get("opacus_plain"):  # that one computes no norms
            peer["ours_over_peer"] = _ratio(ours, peer, "time_ratio")
            peer["ours_over_peer_raw"] = _ratio(ours, peer, "step_ms")
        mine, ref = peer.get("last_norms"), vmap.get("last_norms")
        if mine and ref and len(mine) == len(ref) and peer is not vmap:
            peer["norms_vs_vmap"] = max(abs(a - b) / abs(b) for a, b in zip(mine, ref) if b)
