"""Overhead of cockpit over plain training, measured side by side (issues 7 and 16).

Runs plain training and every configuration (presets, named quantity sets and single
quantities, tracking every step and every 16th step) on synthetic problems (an MLP, a CNN,
two GPT-style and two post-norm transformer classifiers, and a ``transformers`` GPT-2, a
nanoGPT and a ViT), each configuration in a fresh subprocess, alternating with plain runs
(plain, config, plain, config, ..., plain), and reports step times and peak memory as
ratios to the neighbouring plain runs. On the transformer classifiers and the ViT it also
runs the peers for per-sample gradient norms (Opacus, ``torch.func`` vmap); with
``--reference-python`` it also runs Cockpit 1.0.2 on the MLP and the CNN.

    .venv/bin/python benchmarks/overhead.py --quick              # smoke run
    .venv/bin/python benchmarks/overhead.py --reference-python /tmp/refvenv/bin/python
                                                                 # full run (see README)

Configuration names: presets, quantities, ``first_order`` (``SETS`` in
``overhead_child.py``), the peers ``opacus``, ``opacus_plain``, ``vmap`` (``peers``: all
three); ``NAME:backpack`` runs a preset or quantity on the path before issue 16 (the model
not passed to the Cockpit: BackPACK computes every statistic); ``NAME@N`` runs it only
tracking every N-th step.

Results: ``benchmarks/results/<name>.json`` and ``<name>.md``. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from overhead_child import SETS
from overhead_runs import (
    aggregate,
    drop_noisy,
    run_child,
    step_stat,
    unit_key,
    wait_until_quiet,
    was_run,
)

HERE = Path(__file__).resolve().parent
PRESETS = ("economy", "business", "full")
PEERS = ("opacus", "opacus_plain", "vmap")  # norm_peers.PEERS (that module imports torch)
CLASSIC = ("mlp", "cnn")  # the problems of issue 7; Cockpit 1.0.2 runs only on these
# overhead_problems.TRANSFORMERS (issue 16) and POST_NORM (issue 32)
TRANSFORMERS = ("tf-small", "tf-medium", "tf-post", "tf-post-bare")
REAL_MODELS = ("gpt2", "nanogpt", "vit")  # overhead_problems.REAL_MODELS (issues 28, 32)
PROBLEMS = CLASSIC + TRANSFORMERS + REAL_MODELS
# per problem: mlp, cnn, tf-small, tf-medium, tf-post, tf-post-bare, gpt2, nanogpt, vit
DEFAULTS = {
    key: dict(zip(PROBLEMS, values))
    for key, values in {
        "warmup": (5, 2, 3, 2, 3, 3, 5, 5, 5),
        "steps": (50, 5, 30, 6, 30, 30, 30, 30, 30),
        "periods": (3, 2, 3, 2, 3, 3, 3, 3, 3),
        "plain_steps": (100, 8, 40, 8, 40, 40, 60, 60, 60),
        # Cockpit 1.0.2 runs on mlp and cnn only
        "reference_steps": (30, 3, 0, 0, 0, 0, 0, 0, 0),
        "reference_periods": (2, 1, 0, 0, 0, 0, 0, 0, 0),
    }.items()
}
QUICK = {
    key: dict(zip(PROBLEMS, values))
    for key, values in {
        "warmup": (2, 1, 1, 1, 1, 1, 1, 1, 1),
        "steps": (10, 2, 3, 2, 3, 3, 3, 3, 3),
        "periods": (1, 1, 1, 1, 1, 1, 1, 1, 1),
        "plain_steps": (30, 3, 5, 2, 5, 5, 5, 5, 5),
        "reference_steps": (5, 2, 0, 0, 0, 0, 0, 0, 0),
        "reference_periods": (1, 1, 0, 0, 0, 0, 0, 0, 0),
    }.items()
}
CONFIGS = "presets,quantities,economy:backpack"
TRANSFORMER_CONFIGS = "economy,first_order,norm_test@1,peers"
QUICK_CONFIGS = "economy,grad_norm,economy:backpack"


def per_problem(text: str | None, default: dict[str, int]) -> dict[str, int]:
    """Parse ``"8"`` (all problems) or ``"mlp=60,cnn=6"`` over ``default``."""
    out = dict(default)
    if not text:
        return out
    for part in text.split(","):
        if "=" in part:
            key, value = part.split("=", 1)
            if key.strip() not in PROBLEMS:
                raise SystemExit(f"unknown problem {key!r} in {text!r}; use {PROBLEMS}")
            out[key.strip()] = int(value)
        else:
            out = {p: int(part) for p in out}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--problems", default=",".join(PROBLEMS), help=f"comma list of {', '.join(PROBLEMS)}"
    )
    p.add_argument(
        "--configs",
        default=None,
        help="configurations on mlp and cnn: comma list of preset names, quantity names,\n"
        "'presets' (economy, business, full), 'quantities' (every installed quantity),\n"
        f"sets ({', '.join(SETS)}), peers ({', '.join(PEERS)}, 'peers'); NAME:backpack\n"
        f"(the path before issue 16), NAME@N (only every N-th step); default: {CONFIGS}",
    )
    p.add_argument(
        "--transformer-configs",
        default=None,
        help="configurations on the transformers and on gpt2, nanogpt, vit (same syntax);\n"
        f"default: {TRANSFORMER_CONFIGS}",
    )
    p.add_argument("--schedules", default="1,16", help="tracking intervals (default 1,16)")
    for key, helptext in (
        ("warmup", "warm-up steps per run (not measured)"),
        ("steps", "measured steps of a configuration tracking every step"),
        ("periods", "measured periods (of N steps) of a configuration tracking every N-th step"),
        ("plain_steps", "measured steps of each plain run"),
        ("reference_steps", "measured steps of a reference run tracking every step"),
        ("reference_periods", "measured periods of a reference run tracking every N-th step"),
    ):
        p.add_argument(
            "--" + key.replace("_", "-"),
            default=None,
            help=f"{helptext}: N or mlp=N,tf-small=M,... (default {DEFAULTS[key]})",
        )
    p.add_argument("--quick", action="store_true", help="smoke run: few steps and configs")
    p.add_argument(
        "--render",
        metavar="JSON",
        default=None,
        help="only rewrite the Markdown table of an earlier result file (next to it)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (same ratios)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--python", default=sys.executable, help="python of the project environment")
    p.add_argument(
        "--reference-python",
        default=None,
        help="python of a venv with cockpit-for-pytorch==1.0.2 (and setuptools<81)",
    )
    p.add_argument(
        "--reference-configs",
        default="presets",
        help="configurations also run with the reference, on mlp and cnn (default: presets)",
    )
    p.add_argument("--output-dir", default=str(HERE / "results"))
    p.add_argument("--name", default=None, help="file stem (default overhead, overhead_quick)")
    p.add_argument("--child-timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument(
        "--quiet-threshold",
        type=float,
        default=0.2,
        help="CPU cores other processes may use during a run before it counts as noisy",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="seconds to wait at most, before each pair, for other processes to go quiet",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run: keep the runs in <name>.partial.json, run the rest",
    )
    p.add_argument(
        "--redo-noisy",
        action="store_true",
        help="with --resume: run again the configurations whose runs were noisy",
    )
    p.add_argument(
        "--max-minutes",
        type=float,
        default=float("inf"),
        help="start no new configuration after this many minutes (the rest is marked not run)",
    )
    p.add_argument(
        "--retries", type=int, default=1, help="reruns of a noisy plain/configuration pair"
    )
    args = p.parse_args(argv)
    table = QUICK if args.quick else DEFAULTS
    for key in DEFAULTS:
        setattr(args, key, per_problem(getattr(args, key), table[key]))
    args.problems = [x.strip() for x in args.problems.split(",") if x.strip()]
    for problem in args.problems:
        if problem not in PROBLEMS:
            raise SystemExit(f"unknown problem {problem!r}: use {', '.join(PROBLEMS)}")
    args.schedules = [int(x) for x in args.schedules.split(",") if x.strip()]
    if args.configs is None:
        args.configs = QUICK_CONFIGS if args.quick else CONFIGS
    if args.transformer_configs is None:
        args.transformer_configs = TRANSFORMER_CONFIGS
    if args.name is None:
        args.name = "overhead_quick" if args.quick else "overhead"
    return args


def installed_quantities(python: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Quantity names, plugin versions and plugin load errors of the project environment."""
    code = (
        "import json, cockpit_core as c; r = c.default_registry(); "
        "print(json.dumps([r.names(), {p.distribution: p.version for p in r.plugins if p.ok}, "
        "{p.distribution: p.error for p in r.plugins if not p.ok}]))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    names, plugins, failed = json.loads(out.stdout.strip().splitlines()[-1])
    return names, plugins, failed


Config = tuple[str, str]  # (type: preset, set, quantity or peer; name, maybe NAME:backpack)


def expand_configs(text: str, quantities: list[str]) -> list[tuple[Config, tuple[int, ...]]]:
    """``[(("preset", "economy"), ()), (("quantity", "norm_test"), (1,)), ...]``.

    The second element restricts the tracking intervals (``NAME@N``; empty: all); peers
    always run every step.
    """
    out: list[tuple[Config, tuple[int, ...]]] = []
    for raw in (x.strip() for x in text.split(",")):
        if not raw:
            continue
        item, _, every = raw.partition("@")
        only = (int(every),) if every else ()
        item, _, path = item.partition(":")
        suffix = f":{path}" if path else ""
        if item == "presets":
            found = [("preset", p) for p in PRESETS]
        elif item == "quantities":
            found = [("quantity", q) for q in quantities]
        elif item == "peers":
            found = [("peer", p) for p in PEERS]
        elif item in PRESETS:
            found = [("preset", item)]
        elif item in SETS:
            found = [("set", item)]
        elif item in PEERS:
            found = [("peer", item)]
        else:
            found = [("quantity", item)]  # unknown names fail in the child and are recorded
        for kind, name in found:
            if kind == "peer":
                if path:
                    raise SystemExit(f"{raw!r}: peers have no {suffix} variant")
                only = (1,)
            out.append(((kind, name + suffix), only))
    seen: set[Config] = set()
    return [c for c in out if not (c[0] in seen or seen.add(c[0]))]


def applicable(config: Config) -> bool:
    """Whether ``config`` runs on a problem that is not a classifier (a language model).

    The peers (``norm_peers.py``) and the BackPACK path need ``nn.CrossEntropyLoss`` of
    logits ``[B, classes]``; a language model's loss is its own per-sample mean.
    """
    return config[0] != "peer" and not config[1].endswith(":backpack")


def child_spec(
    args: argparse.Namespace, kind: str, problem: str, every: int, config: Config | None = None
) -> dict:
    spec: dict[str, Any] = {
        "kind": kind,
        "problem": problem,
        "device": args.device,
        "threads": args.threads,
        "seed": args.seed,
        "warmup": args.warmup[problem],
        "every": every,
    }
    if kind == "plain":
        spec["steps"] = args.plain_steps[problem]
    elif kind in ("ours", "peer"):
        spec["steps"] = args.steps[problem] if every == 1 else every * args.periods[problem]
    else:
        ref_steps, ref_periods = args.reference_steps[problem], args.reference_periods[problem]
        spec["steps"] = ref_steps if every == 1 else every * ref_periods
        spec["warmup"] = min(spec["warmup"], 2)
    if config is not None:
        name, _, path = config[1].partition(":")
        spec[config[0]] = name
        if kind == "ours":
            spec["path"] = path or "model"
    return spec


def describe_problems(python: str) -> dict[str, dict]:
    """Parameter counts, batch sizes and models of the problems (from the child module)."""
    out = subprocess.run(
        [python, str(HERE / "overhead_child.py"), "--describe"],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(HERE),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine_info(args: argparse.Namespace) -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "threads": args.threads,
        "device": args.device,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        root = HERE.parent
        git = ["git", "-C", str(root)]
        info["git_commit"] = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain"], capture_output=True, text=True
        ).stdout
        info["git_uncommitted_files"] = len(dirty.splitlines())
    except OSError:
        pass
    return info


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _progress(done: int, total: int, entry: dict) -> None:
    res = entry["result"]
    label = "plain" if entry["config"] is None else entry["config"][1]
    status = "ok" if res.get("ok") else "FAILED: " + res.get("error", "")[:200]
    if res.get("ok"):
        status += f" {1e3 * step_stat(res['times_s'], entry['every']):.2f} ms/step"
    print(
        f"[overhead] {done}/{total} {entry['problem']} {entry['kind']} {label} every "
        f"{entry['every']}: {status} [{res['wall_s']:.1f} s, others used "
        f"{res['foreign_cores']:.2f} cores]",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(HERE))
    from overhead_report import evaluate_targets, render_markdown

    args = parse_args(argv)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        targets = evaluate_targets(data["results"])
        md = Path(args.render).with_suffix(".md")
        md.write_text(render_markdown(data["meta"], targets, data["results"]))
        print(f"[overhead] wrote {md}")
        return 0
    signal.signal(signal.SIGTERM, _terminate)  # so that subprocess.run kills the running child
    started = time.perf_counter()
    names, plugins, failed_plugins = installed_quantities(args.python)
    problems_info = describe_problems(args.python)
    for name in args.problems:
        d = problems_info[name]
        print(
            f"[overhead] {name}: {d['model']}, {d['params']:,} parameters, batch {d['batch_size']}"
        )
    families = {
        "classic": expand_configs(args.configs, names),
        "transformer": expand_configs(args.transformer_configs, names),
    }
    ref_configs = (
        {c for c, _ in expand_configs(args.reference_configs, names)}
        if args.reference_python
        else set()
    )
    if args.reference_python and not Path(args.reference_python).exists():
        raise SystemExit(f"--reference-python {args.reference_python} does not exist")

    # The plan: for each unit, a plain run and then the unit; one last plain run per problem.
    # Presets and sets first (the targets), then single quantities, then the peers; each
    # reference run right after ours of the same configuration.
    plan: list[dict] = []
    not_applicable: list[str] = []
    for problem in args.problems:
        configs = families["classic" if problem in CLASSIC else "transformer"]
        if not problems_info[problem].get("classifier", True):
            skipped = [c for c in configs if not applicable(c[0])]
            configs = [c for c in configs if applicable(c[0])]
            if skipped:
                names_skipped = ", ".join(c[0][1] for c in skipped)
                not_applicable.append(f"{problem}: {names_skipped}")
                print(f"[overhead] {problem}: not applicable, skipped: {names_skipped}")
        groups = [
            [c for c in configs if c[0][0] in ("preset", "set")],
            [c for c in configs if c[0][0] == "quantity"],
            [c for c in configs if c[0][0] == "peer"],
        ]
        for group in groups:
            for every in args.schedules:
                for config, only in group:
                    if only and every not in only:
                        continue
                    kinds = ["peer"] if config[0] == "peer" else ["ours"]
                    if problem in CLASSIC and config in ref_configs:
                        kinds.append("reference")
                    for kind in kinds:
                        plan.append(
                            {"kind": kind, "problem": problem, "every": every, "config": config}
                        )
    partial = Path(args.output_dir) / f"{args.name}.partial.json"
    partial.parent.mkdir(parents=True, exist_ok=True)
    total_pairs = len(plan) + len(args.problems)
    print(f"[overhead] {total_pairs} plain/configuration pairs; quantities: {', '.join(names)}")
    sequence: list[dict] = []
    discarded: list[dict] = []
    session = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    machine = machine_info(args)
    sessions: dict[str, dict] = {}
    if args.resume and partial.exists():
        loaded = json.loads(partial.read_text())
        sequence, discarded = loaded["runs"], loaded["discarded_runs"]
        sessions = loaded.get("sessions", {})
        print(f"[overhead] resuming: {len(sequence)} runs loaded from {partial}", flush=True)
    if args.redo_noisy:
        sequence, moved = drop_noisy(sequence, args.quiet_threshold)
        discarded += moved
        print(f"[overhead] rerunning {len(moved)} noisy configuration runs", flush=True)
    finished = {unit_key(e) for e in sequence if e["kind"] != "plain" and was_run(e)}
    done = 0
    for problem in args.problems:
        ran = False
        for unit in [u for u in plan if u["problem"] == problem] + [None]:
            done += 1
            if unit is not None and unit_key(unit) in finished:
                continue
            if unit is None and not ran:
                continue
            ran = True
            if unit is not None and time.perf_counter() - started > 60 * args.max_minutes:
                unit["result"] = {"ok": False, "error": "not run: --max-minutes reached"}
                sequence.append(unit)
                continue
            attempts = []
            for attempt in range(args.retries + 1):
                waited, load = wait_until_quiet(args.quiet_threshold, args.quiet_wait)
                if waited > 5:
                    print(f"[overhead]   waited {waited:.0f} s for a quiet machine", flush=True)
                pair = [{"kind": "plain", "problem": problem, "every": 1, "config": None}]
                if unit is not None:
                    pair.append(dict(unit))
                for entry in pair:
                    entry["session"] = session
                for entry in pair:
                    python = args.reference_python if entry["kind"] == "reference" else args.python
                    spec = child_spec(args, entry["kind"], problem, entry["every"], entry["config"])
                    entry["result"] = res = run_child(python, spec, args.child_timeout)
                    res.update(attempt=attempt, waited_s=waited, foreign_cores_before=load)
                    _progress(done, total_pairs, entry)
                noise = max(e["result"]["foreign_cores"] for e in pair)
                attempts.append((noise, attempt, pair))
                if noise <= args.quiet_threshold or attempt == args.retries:
                    break
                print(f"[overhead]   other processes used {noise:.2f} cores: retrying", flush=True)
            attempts.sort(key=lambda a: (a[0], a[1]))
            sequence += attempts[0][2]
            for _, _, pair in attempts[1:]:
                discarded += pair
            sessions[session] = {
                "started": session,
                "wall_s": time.perf_counter() - started,
                "git_commit": machine.get("git_commit"),
                "git_uncommitted_files": machine.get("git_uncommitted_files"),
                "plugins": plugins,
            }
            partial.write_text(
                json.dumps({"runs": sequence, "discarded_runs": discarded, "sessions": sessions})
            )

    results = aggregate(sequence, args.problems, args.quiet_threshold)

    torch_versions = sorted(
        {e["result"].get("torch") for e in sequence if e["result"].get("torch")}
    )
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "torch": torch_versions,
        "plugins": plugins,
        "failed_plugins": failed_plugins,
        "quantities_installed": names,
        "problems": {p: problems_info[p] for p in args.problems},
        "not_applicable": not_applicable,
        "reference_python": args.reference_python,
        "settings": {
            k: getattr(args, k)
            for k in (
                "problems",
                "configs",
                "transformer_configs",
                "schedules",
                "seed",
                "reference_configs",
                "quiet_threshold",
                "quiet_wait",
                "retries",
                *DEFAULTS,
            )
        },
        "total_wall_s": time.perf_counter() - started,
        "sessions": sessions,
        "loadavg_end": os.getloadavg(),
    }
    targets = evaluate_targets(results)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": meta,
        "targets": targets,
        "results": results,
        "runs": sequence,
        "discarded_runs": discarded,
    }
    json_path = out_dir / f"{args.name}.json"
    md_path = out_dir / f"{args.name}.md"
    json_path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    md_path.write_text(render_markdown(meta, targets, results))
    print(f"[overhead] wrote {json_path} and {md_path} in {meta['total_wall_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
