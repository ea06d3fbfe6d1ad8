"""Curvature side by side with curvlinops: trace, top eigenvalue, exact diagonal (issue 18).

On the tiny transformer of :mod:`cockpit_core.testing` (embedding, attention, LayerNorm,
GELU; 3,243 parameters) and an MLP (3,333 parameters), both float64:

1. the explicit Hessian ``H`` once (batched double backward against unit vectors; checked
   against ``torch.autograd.functional.hvp`` on random vectors), its trace and top
   eigenvalue (``numpy.linalg.eigvalsh``);
2. **trace**: Hutchinson (Hutchinson, 1989), Hutch++ (Meyer et al., 2021) and XTrace
   (Epperly et al., 2024), cockpit's (``hess_trace`` methods, block estimators in
   ``cockpit_curvature._estimators``) and curvlinops' (``hutchinson_trace``,
   ``hutchpp_trace``, ``xtrace``). The estimators see only matrix-vector products, so their
   accuracy is measured on ``H`` itself over a grid of product counts and seeds (median
   relative error); the seconds per product of each library's own Hessian-vector products on the model
   (a cockpit ``hess_trace`` step minus a plain step; curvlinops' ``HessianLinearOperator``
   with the estimator), measured with ``TIMED`` products, times the fewest products
   reaching 10% and 1%;
3. **top eigenvalue** to 1e-4 relative: ``hess_max_ev`` (Lanczos, tol 1e-4) in a tracked
   step vs ``scipy.sparse.linalg.eigsh`` on ``HessianLinearOperator(...).to_scipy()``;
4. **exact diagonal**: a tracked ``hess_trace`` step (default ``diag_hessian``: the
   ``autodiff`` provider) and ``hess_trace`` + ``tic_diag`` on the transformer vs a plain
   step.

Run: ``.venv/bin/python benchmarks/curvature_peers.py`` (needs ``pip install -c
constraints.txt curvlinops-for-pytorch==3.0.1``, the ``bench`` extra); writes
``benchmarks/results/curvature_peers.{json,md}``. About 3-5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
from cockpit_curvature import HessMaxEV, HessTrace, TICDiag
from cockpit_curvature._estimators import ESTIMATORS
from scipy.sparse.linalg import eigsh

from cockpit_core import Cockpit
from cockpit_core.engine.attention import math_attention
from cockpit_core.testing import Problem, tiny_transformer
from cockpit_core.testing.reference import flat

RESULTS = Path(__file__).parent / "results"
TARGETS = (0.10, 0.01)
GRID = (6, 12, 24, 48, 96, 192, 384)
TIMED = 48
"""Products of the timed runs; the time at a needed count is scaled from it."""
"""Product counts tried (multiples of 6: Hutch++ needs thirds, XTrace halves)."""
METHODS = ("hutchinson", "hutchpp", "xtrace")


def mlp_problem() -> Problem:
    """A 16-64-32-5 tanh MLP (3,333 parameters), batch 32, float64, cross-entropy."""

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(16, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 32),
            torch.nn.Tanh(),
            torch.nn.Linear(32, 5),
        ).double()

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 5, (256,), generator=gen)
    return Problem("mlp", make, x, y, 32, "cross_entropy", 0)


def problems() -> dict[str, Problem]:
    """The two problems by name."""
    return {
        "transformer": tiny_transformer(extended=False, d_model=16, ff=56),
        "mlp": mlp_problem(),
    }


def loss_fn(problem: Problem, model: torch.nn.Module, x, y, params=None) -> torch.Tensor:
    """Mean loss; with ``params`` through ``functional_call``."""
    out = model(x) if params is None else torch.func.functional_call(model, params, (x,))
    return problem.individual_losses(out, y).mean()


def explicit_hessian(problem: Problem, model: torch.nn.Module, x, y) -> torch.Tensor:
    """``H`` by batched double backward against blocks of unit vectors, then checked."""
    params = [p for p in model.parameters()]
    dim = sum(p.numel() for p in params)
    with math_attention():
        grads = torch.autograd.grad(loss_fn(problem, model, x, y), params, create_graph=True)
        g = flat(grads)
        rows = []
        for start in range(0, dim, 512):
            eye = torch.eye(dim, dtype=g.dtype)[start : start + 512]
            cols = torch.autograd.grad(g, params, eye, is_grads_batched=True, retain_graph=True)
            rows.append(torch.cat([c.flatten(1) for c in cols], 1))
    hessian = torch.cat(rows).detach()
    names = [n for n, _ in model.named_parameters()]
    gen = torch.Generator().manual_seed(9)
    for _ in range(2):  # independent check: torch.autograd.functional.hvp
        v = torch.randn(dim, generator=gen, dtype=torch.float64)
        parts = torch.split(v, [p.numel() for p in params])
        vs = tuple(t.view_as(p) for t, p in zip(parts, params))

        def f(*ps):
            return loss_fn(problem, model, x, y, dict(zip(names, ps)))

        with math_attention():
            _, hv = torch.autograd.functional.hvp(f, tuple(p.detach() for p in params), vs)
        err = (flat(hv) - hessian @ v).norm() / (hessian @ v).norm()
        assert err < 1e-10, f"explicit Hessian disagrees with autograd hvp: {err:.2e}"
    assert torch.allclose(hessian, hessian.T, atol=1e-12 * hessian.abs().max())
    return hessian


def cockpit_trace(h: torch.Tensor, sizes: list[int], method: str, probes: int, seed: int):
    """Cockpit's estimator on the explicit matrix: ``(estimate, products used)``."""
    gen = torch.Generator().manual_seed(seed)
    est = ESTIMATORS[method](lambda v: h @ v, sizes, probes, gen)
    return float(est.total), int(est.hvps)


def curvlinops_trace(h: torch.Tensor, method: str, probes: int, seed: int):
    """curvlinops' estimator on the explicit matrix: ``(estimate, products used)``."""
    import curvlinops

    fn = {
        "hutchinson": curvlinops.hutchinson_trace,
        "hutchpp": curvlinops.hutchpp_trace,
        "xtrace": curvlinops.xtrace,
    }[method]
    torch.manual_seed(seed)
    # XTrace applies the operator to num_matvecs / 2 probes and then to the basis Q
    return float(fn(h, probes)), probes


def accuracy(h: torch.Tensor, sizes: list[int], seeds: int) -> dict:
    """Median relative error per library, method and product count; fewest to each target."""
    exact = float(torch.trace(h))
    out: dict = {}
    for lib, run in (("cockpit", cockpit_trace), ("curvlinops", curvlinops_trace)):
        for method in METHODS:
            rows = []
            for probes in GRID:
                if probes >= len(h):
                    break
                errs, used = [], 0
                for seed in range(seeds):
                    if lib == "cockpit":
                        value, used = run(h, sizes, method, probes, seed)
                    else:
                        value, used = run(h, method, probes, seed)
                    errs.append(abs(value - exact) / abs(exact))
                rows.append(
                    {"probes": probes, "hvps": used, "median_rel_error": float(np.median(errs))}
                )
            needed = {}
            for target in TARGETS:
                hit = next((r for r in rows if r["median_rel_error"] <= target), None)
                needed[str(target)] = None if hit is None else hit
            out[f"{lib}/{method}"] = {"grid": rows, "needed": needed}
    return out


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def plain_step(problem: Problem, model, x, y) -> None:
    """Forward, backward (what every tracked step contains)."""
    model.zero_grad()
    loss_fn(problem, model, x, y).backward()


def cockpit_step_time(problem: Problem, quantity, repeat: int) -> tuple[float, dict]:
    """Median wall time of a tracked step (forward, tracked backward) and its last output."""
    model = problem.make_model()
    cp = Cockpit(model, [quantity], on_error="raise")
    cp.attach(model, torch.nn.CrossEntropyLoss(reduction="none"))
    x, y = problem.batch(0)
    step = [0]

    def tracked():
        model.zero_grad()
        loss = loss_fn(problem, model, x, y)
        with cp(step[0], info={"loss": loss, "batch_size": len(x), "inputs": x, "targets": y}):
            loss.backward(retain_graph=cp.retain_graph(step[0]))
        step[0] += 1

    tracked()  # warm-up
    seconds = _median_time(tracked, repeat)
    return seconds, cp.get_output()[step[0] - 1]


def curvlinops_operator(problem: Problem, model, x, y):
    """curvlinops' Hessian of the mean loss on the batch (``check_deterministic`` off)."""
    from curvlinops import HessianLinearOperator

    criterion = torch.nn.CrossEntropyLoss()
    params = [p for p in model.parameters()]
    return HessianLinearOperator(model, criterion, params, [(x, y)], check_deterministic=False)


def timed_traces(problem: Problem, plain: float, repeat: int) -> dict:
    """Seconds per product of each library and method, from runs with ``TIMED`` products."""
    import curvlinops

    fns = {
        "hutchinson": curvlinops.hutchinson_trace,
        "hutchpp": curvlinops.hutchpp_trace,
        "xtrace": curvlinops.xtrace,
    }
    model = problem.make_model()
    x, y = problem.batch(0)
    out = {}
    for method in METHODS:
        seconds, value = cockpit_step_time(problem, HessTrace(method=method, probes=TIMED), repeat)
        hvps = value["hess_trace"]["hvps"]
        out[f"cockpit/{method}"] = {"hvps": hvps, "seconds_per_hvp": max(seconds - plain, 0) / hvps}

        def run(method=method):
            with math_attention():
                fns[method](curvlinops_operator(problem, model, x, y), TIMED)

        out[f"curvlinops/{method}"] = {
            "hvps": TIMED,
            "seconds_per_hvp": _median_time(run, repeat) / TIMED,
        }
    return out


def top_eigenvalue(problem: Problem, h: torch.Tensor, plain: float, seeds: int) -> dict:
    """``hess_max_ev`` vs curvlinops + ``eigsh``: products, time, relative error."""
    exact = float(np.linalg.eigvalsh(h.numpy())[-1])
    model = problem.make_model()
    x, y = problem.batch(0)
    rows = {"exact": exact, "cockpit": [], "curvlinops_eigsh": []}
    for seed in range(seeds):
        seconds, value = cockpit_step_time(problem, HessMaxEV(seed=seed, warm_start=False), 1)
        ev = value["hess_max_ev"]
        rows["cockpit"].append(
            {
                "rel_error": abs(ev["value"] - exact) / abs(exact),
                "hvps": ev["hvps"],
                "seconds": max(seconds - plain, 0.0),
            }
        )
        for key, tol in (("curvlinops_eigsh", 1e-4),):
            count = [0]
            start = time.perf_counter()
            with math_attention():
                op = curvlinops_operator(problem, model, x, y).to_scipy()
                matvec = op.matvec

                def counted(v, matvec=matvec, count=count):
                    count[0] += 1
                    return matvec(v)

                from scipy.sparse.linalg import LinearOperator

                wrapped = LinearOperator(op.shape, matvec=counted, dtype=np.float64)
                v0 = np.random.default_rng(seed).standard_normal(op.shape[0])
                value = eigsh(
                    wrapped, k=1, which="LA", tol=tol, v0=v0, maxiter=200, return_eigenvectors=False
                )
            rows[key].append(
                {
                    "rel_error": abs(float(value[0]) - exact) / abs(exact),
                    "hvps": count[0],
                    "seconds": time.perf_counter() - start,
                }
            )
    return rows


def hvp_agreement(problem: Problem, h: torch.Tensor) -> float:
    """Relative error of curvlinops' Hessian-vector product against ``H v``."""
    model = problem.make_model()
    x, y = problem.batch(0)
    v = torch.randn(len(h), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with math_attention():
        hv = curvlinops_operator(problem, model, x, y) @ v
    return float((hv - h @ v).norm() / (h @ v).norm())


def exact_diagonal(problem: Problem, plain: float, repeat: int) -> dict:
    """Tracked steps with the exact Hessian diagonal (``autodiff`` on the transformer)."""
    out = {"plain_step_s": plain}
    for name, quantity in (("hess_trace", HessTrace()), ("tic_diag", TICDiag())):
        seconds, _ = cockpit_step_time(problem, quantity, repeat)
        out[f"{name}_step_s"] = seconds
        out[f"{name}_ratio"] = seconds / plain
    return out


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (runnable processes on the 2 cores)."""
    return list(os.getloadavg())


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="curvature_peers")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from importlib.metadata import version

    import curvlinops  # noqa: F401  (fail early without the bench extra)

    report: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "load_before": load_average(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "curvlinops": version("curvlinops-for-pytorch"),
            "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "seeds": args.seeds,
        "problems": {},
    }
    started = time.perf_counter()
    for name, problem in problems().items():
        model = problem.make_model()
        x, y = problem.batch(0)
        sizes = [p.numel() for p in model.parameters()]
        h = explicit_hessian(problem, model, x, y)
        plain = _median_time(
            lambda p=problem, m=model, a=x, b=y: plain_step(p, m, a, b), 2 * args.repeat + 1
        )
        acc = accuracy(h, sizes, args.seeds)
        entry = {
            "parameters": sum(sizes),
            "batch": len(x),
            "trace": float(torch.trace(h)),
            "plain_step_s": plain,
            "curvlinops_hvp_rel_error": hvp_agreement(problem, h),
            "trace_accuracy": acc,
            "trace_timed": timed_traces(problem, plain, args.repeat),
            "top_eigenvalue": top_eigenvalue(problem, h, plain, min(args.seeds, 3)),
        }
        if name == "transformer":
            entry["exact_diagonal"] = exact_diagonal(problem, plain, args.repeat)
        report["problems"][name] = entry
        print(f"{name}: done after {time.perf_counter() - started:.0f} s", flush=True)
    report["machine"]["load_after"] = load_average()
    report["seconds"] = time.perf_counter() - started
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    (RESULTS / f"{args.name}.md").write_text(render(report))
    print(render(report))


def _fmt(hit: dict | None, key: str) -> str:
    return f"> {GRID[-1]}" if hit is None else str(hit[key])


def render(report: dict) -> str:
    """The Markdown report (the targets section is written by hand below the tables)."""
    m = report["machine"]
    lines = [
        "# Curvature side by side with curvlinops (issue 18)",
        "",
        f"{m['date']}, {m['platform']}, {m['cpus']} CPUs, {m['threads']} torch threads, "
        f"torch {m['torch']}, curvlinops {m['curvlinops']}. Load average (1/5/15 min) "
        f"before {', '.join(f'{v:.1f}' for v in m['load_before'])}, after "
        f"{', '.join(f'{v:.1f}' for v in m['load_after'])} (a load near the core "
        "count means other processes shared the cores and inflated the wall times; product "
        "counts are exact). "
        f"Median over {report['seeds']} seeds. Run: `.venv/bin/python "
        f"benchmarks/curvature_peers.py` ({report['seconds']:.0f} s).",
        "",
    ]
    for name, p in report["problems"].items():
        lines += [
            f"## {name}: {p['parameters']:,} parameters, batch {p['batch']}",
            "",
            f"Plain step (forward + backward) {1e3 * p['plain_step_s']:.1f} ms; "
            f"tr(H) = {p['trace']:.6g}; curvlinops' HVP vs the explicit H: relative error "
            f"{p['curvlinops_hvp_rel_error']:.1e}.",
            "",
            "**Trace**: products (HVPs) for a median relative error <= 10% / 1% (from the "
            f"grid {', '.join(map(str, GRID))}), and the seconds at that count: seconds per "
            f"product measured in runs with {TIMED} products (cockpit: tracked step minus "
            "plain step; curvlinops: operator + estimator) times the count.",
            "",
            "| method | cockpit HVPs 10% | curvlinops HVPs 10% | cockpit HVPs 1% | "
            "curvlinops HVPs 1% | cockpit s 10% | curvlinops s 10% | cockpit s 1% | "
            "curvlinops s 1% |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        acc, timed = p["trace_accuracy"], p["trace_timed"]
        for method in METHODS:
            cells = []
            for target in ("0.1", "0.01"):
                for lib in ("cockpit", "curvlinops"):
                    cells.append(_fmt(acc[f"{lib}/{method}"]["needed"][target], "hvps"))
            for target in ("0.1", "0.01"):
                for lib in ("cockpit", "curvlinops"):
                    hit = acc[f"{lib}/{method}"]["needed"][target]
                    per = timed[f"{lib}/{method}"]["seconds_per_hvp"]
                    cells.append("-" if hit is None else f"{per * hit['hvps']:.3f}")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines += ["", "Median relative error per product count:", ""]
        lines.append(
            "| HVPs | "
            + " | ".join(f"{lib} {m}" for m in METHODS for lib in ("cockpit", "curvlinops"))
            + " |"
        )
        lines.append("|---" * (1 + 2 * len(METHODS)) + "|")
        for i, probes in enumerate(GRID):
            cells = []
            for method in METHODS:
                for lib in ("cockpit", "curvlinops"):
                    grid = acc[f"{lib}/{method}"]["grid"]
                    cells.append(f"{grid[i]['median_rel_error']:.2e}" if i < len(grid) else "-")
            lines.append(f"| {probes} | " + " | ".join(cells) + " |")
        ev = p["top_eigenvalue"]
        lines += [
            "",
            f"**Top eigenvalue** (exact {ev['exact']:.8g}), per seed: relative error, HVPs, "
            "seconds (cockpit: tracked step minus plain step).",
            "",
            "| seed | hess_max_ev (tol 1e-4) | curvlinops + eigsh (tol 1e-4) |",
            "|---|---|---|",
        ]
        for seed, rows in enumerate(zip(ev["cockpit"], ev["curvlinops_eigsh"])):
            cells = [f"{r['rel_error']:.1e}, {r['hvps']}, {r['seconds']:.3f} s" for r in rows]
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
        if "exact_diagonal" in p:
            d = p["exact_diagonal"]
            lines += [
                "",
                f"**Exact Hessian diagonal** (`autodiff` provider, one HVP per parameter): "
                f"tracked `hess_trace` step {d['hess_trace_step_s']:.2f} s "
                f"({d['hess_trace_ratio']:.0f}x the plain step), `tic_diag` step "
                f"{d['tic_diag_step_s']:.2f} s ({d['tic_diag_ratio']:.0f}x).",
            ]
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
