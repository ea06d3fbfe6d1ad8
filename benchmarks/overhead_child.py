"""One measured training run of the overhead benchmark, in a fresh process.

``overhead.py`` starts this module as ``python overhead_child.py SPEC_JSON`` once per
configuration. It must run both in the project's environment (``kind`` ``plain``, ``ours``
or ``peer``) and in a side environment holding Cockpit 1.0.2 (``kind`` ``reference``), so
at module level it imports only the standard library. The last stdout line is the result:
``@@RESULT@@ {json}``. ``python overhead_child.py --describe`` prints the problems' sizes.

A spec (dict) holds: ``kind``, ``problem`` (see ``overhead_problems.py``), ``device``,
``threads``, ``seed``, ``warmup``, ``steps`` (measured), ``every`` (tracking interval), and
for ``ours``/``reference`` one of ``preset``, ``set`` (a name of ``SETS``) or ``quantity``;
for ``ours`` also ``path``: ``"model"`` (``Cockpit(model, ...)``, the recommended path) or
``"backpack"`` (``Cockpit(model.named_parameters(), ...)``: the model unknown to cockpit,
BackPACK computes every statistic, the path before issue 16); for ``peer`` the ``peer``
name (``norm_peers.PEERS``).
"""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback
from typing import Any

RESULT_TAG = "@@RESULT@@"
N_BATCHES = 4  # distinct synthetic batches, cycled; generated before timing starts
LEARNING_RATE = 0.01

# Named quantity lists: "first_order" is every quantity of ``full`` that needs neither
# curvature diagonals nor Hessian-vector products.
SETS = {"first_order": ["economy", "grad_hist_2d"]}
# Problems whose models are not extended for BackPACK on the recommended path (BackPACK
# supports only their nn.Linear layers; module hooks serve every parameter).
NOT_EXTENDED = ("tf-small", "tf-medium", "tf-post", "tf-post-bare", "gpt2", "nanogpt", "vit")

# Our quantity names -> Cockpit 1.0.2 class names (cockpit.quantities.*).
REFERENCE_CLASSES = {
    "alpha": "Alpha",
    "cabs": "CABS",
    "distance": "Distance",
    "early_stopping": "EarlyStopping",
    "grad_hist_1d": "GradHist1d",
    "grad_hist_2d": "GradHist2d",
    "grad_norm": "GradNorm",
    "hess_max_ev": "HessMaxEV",
    "hess_trace": "HessTrace",
    "inner_test": "InnerTest",
    "loss": "Loss",
    "mean_gsnr": "MeanGSNR",
    "norm_test": "NormTest",
    "ortho_test": "OrthoTest",
    "parameters": "Parameters",
    "tic_diag": "TICDiag",
    "tic_trace": "TICTrace",
    "time": "Time",
    "update_size": "UpdateSize",
}


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _find_hvp_count(value: Any) -> float | None:
    """An HVP count in a ``hess_max_ev`` output value (a key naming hvps or matvecs)."""
    if isinstance(value, dict):
        for key, item in value.items():
            k = str(key).lower()
            if ("hvp" in k or "matvec" in k) and isinstance(item, (int, float)):
                return float(item)
        for item in value.values():
            found = _find_hvp_count(item)
            if found is not None:
                return found
    return None


class _Counter:
    """Counts calls of a wrapped method (Hessian-vector products)."""

    def __init__(self, cls: type, attr: str):
        self.count = 0
        original = getattr(cls, attr)

        def wrapped(obj, *args, **kwargs):
            self.count += 1
            return original(obj, *args, **kwargs)

        setattr(cls, attr, wrapped)


def _hvp_class() -> type | None:
    """The core's Hessian-vector-product operator, wherever this version keeps it."""
    import importlib

    for module in ("cockpit_core.context", "cockpit_core.engine.hvp"):
        try:
            cls = getattr(importlib.import_module(module), "HessianVectorProducts", None)
        except ImportError:
            continue
        if cls is not None:
            return cls
    return None


def _routes(cp, model, result: dict) -> None:
    """What ``cp.check(model)`` says: per quantity how, per provider how many parameters.

    Called after the measured steps: on a Cockpit that was not given the model, ``check``
    reroutes to module hooks that are not installed, and later steps fail.
    """
    try:
        report = cp.check(model)
        result["routes"] = {r.quantity: r.how for r in report.rows}
        result["params_served"] = {p.served: len(p.names) for p in report.params}
    except Exception as err:  # informational only
        result["routes_error"] = f"{type(err).__name__}: {err}"


def _build_ours(spec: dict, model, result: dict):
    import cockpit_core

    registry = cockpit_core.default_registry()
    result["plugins"] = {p.distribution: p.version for p in registry.plugins if p.ok}
    every = int(spec["every"])
    if "preset" in spec:
        base = cockpit_core.resolve_quantities(spec["preset"], registry)
    elif "set" in spec:
        base = cockpit_core.resolve_quantities(SETS[spec["set"]], registry)
    else:
        base = cockpit_core.resolve_quantities([spec["quantity"]], registry)
    # Force the interval on every member (presets could carry their own schedules).
    quantities = [
        type(q)(q.config.model_copy(update={"every": every, "offset": 0, "schedule": None}))
        for q in base
    ]
    result["quantities"] = [q.key for q in quantities]
    hvp = _hvp_class()
    counter = _Counter(hvp, "__call__") if hvp is not None else None
    path = spec.get("path", "model")
    if path not in ("model", "backpack"):
        raise ValueError(f"unknown path {path!r}: use 'model' or 'backpack'")
    params = model if path == "model" else model.named_parameters()
    return cockpit_core.Cockpit(params, quantities=quantities, registry=registry), counter


def _build_reference(spec: dict, model, result: dict):
    import warnings

    warnings.filterwarnings("ignore")  # pkg_resources deprecation, create_graph cycles
    from cockpit import Cockpit, quantities
    from cockpit.quantities import hess_max_ev
    from cockpit.utils import schedules
    from cockpit.utils.configuration import configuration

    schedule = schedules.linear(int(spec["every"]))
    if "preset" in spec:
        qs = configuration(spec["preset"], track_schedule=schedule)
    else:
        cls = getattr(quantities, REFERENCE_CLASSES[spec["quantity"]])
        qs = [cls(track_schedule=schedule)]
    result["quantities"] = [type(q).__name__ for q in qs]
    counter = _Counter(hess_max_ev.HVPLinearOperator, "hessian_vector_product")
    return Cockpit(model.parameters(), quantities=qs), counter


def tracked_step(
    cp, model, loss_fn, opt, batch, step: int, reference: bool = False, per_sample=None
) -> None:
    """One training step inside ``with cp(step, info=...)``, as each library's docs show.

    ``per_sample(outputs, targets) -> [B]``: the per-sample losses whose mean ``loss_fn``
    computes (``Problem.per_sample``; default: cross-entropy of logits ``[B, classes]``),
    evaluated without a graph for ``individual_losses``. Ours keeps the loss graph with
    ``retain_graph``; Cockpit 1.0.2 (``reference``) asks for ``create_graph``.
    """
    import torch  # imported in run() first, which measures the RSS after imports
    import torch.nn.functional as F

    x, y = batch
    opt.zero_grad()
    out = model(x)
    loss = loss_fn(out, y)
    with torch.no_grad():
        if per_sample is None:
            losses = F.cross_entropy(out, y, reduction="none")
        else:
            losses = per_sample(out, y)
    info = {"batch_size": len(x), "individual_losses": losses, "loss": loss, "optimizer": opt}
    with cp(step, info=info):
        if reference:
            loss.backward(create_graph=cp.create_graph(step))
        else:
            loss.backward(retain_graph=cp.retain_graph(step))
    opt.step()


def run(spec: dict) -> dict:
    """Train ``warmup + steps`` steps as ``spec`` says; return timings, memory and counts."""
    import torch

    kind, device = spec["kind"], torch.device(spec["device"])
    torch.set_num_threads(int(spec["threads"]))
    result: dict[str, Any] = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    result["rss_after_torch_mb"] = peak_rss_mb()
    if kind in ("plain", "ours", "peer"):
        # plain and peers import cockpit, its plugins and BackPACK too, so that import memory
        # cancels in RSS ratios
        from cockpit_backpack import extend

        import cockpit_core

        cockpit_core.default_registry()
    elif kind == "reference":
        import backpack
        import cockpit  # noqa: F401

        extend = backpack.extend
    else:
        raise ValueError(f"unknown kind {kind!r}")
    from overhead_problems import get_problem, n_params

    problem = get_problem(spec["problem"])
    result["rss_after_imports_mb"] = peak_rss_mb()

    needs_classifier = kind in ("reference", "peer") or spec.get("path") == "backpack"
    if needs_classifier and not problem.classifier:
        what = "the BackPACK path" if kind == "ours" else kind
        raise ValueError(
            f"{what} needs a classifier with nn.CrossEntropyLoss; {problem.name} trains with "
            "its own per-sample loss: run it with our recommended path only"
        )
    torch.manual_seed(int(spec["seed"]))
    model = problem.make_model().to(device)
    result["n_params"] = n_params(model)
    loss_fn = problem.loss_module()
    gen = torch.Generator().manual_seed(int(spec["seed"]) + 1)
    batches = [tuple(t.to(device) for t in problem.make_batch(gen)) for _ in range(N_BATCHES)]
    cp = counter = peer_step = None
    if kind in ("ours", "reference"):
        result["extended"] = kind == "reference" or spec["problem"] not in NOT_EXTENDED
        if result["extended"]:
            model, loss_fn = extend(model), extend(loss_fn)
        build = _build_ours if kind == "ours" else _build_reference
        cp, counter = build(spec, model, result)
    elif kind == "peer":
        from norm_peers import build_peer, import_peer

        before = peak_rss_mb()
        import_peer(spec["peer"])
        result["rss_peer_imports_mb"] = peak_rss_mb() - before  # not counted in RSS ratios
        model, peer_step = build_peer(spec["peer"], model, loss_fn, result)
    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    norms: list = []

    def step_plain(step: int) -> None:
        x, y = batches[step % N_BATCHES]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    def step_ours(step: int) -> None:
        batch = batches[step % N_BATCHES]
        tracked_step(cp, model, loss_fn, opt, batch, step, per_sample=problem.per_sample)

    def step_reference(step: int) -> None:
        batch = batches[step % N_BATCHES]
        tracked_step(cp, model, loss_fn, opt, batch, step, True, problem.per_sample)

    def step_peer(step: int) -> None:
        norms[:] = [peer_step(batches[step % N_BATCHES], opt)]

    train_step = {
        "plain": step_plain,
        "ours": step_ours,
        "reference": step_reference,
        "peer": step_peer,
    }[kind]
    warmup, steps = int(spec["warmup"]), int(spec["steps"])
    result["rss_before_training_mb"] = peak_rss_mb()
    times = []
    for step in range(warmup + steps):
        if step == warmup and counter is not None:
            result["hvps_warmup"] = counter.count
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        train_step(step)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    result["warmup_times_s"] = times[:warmup]
    result["times_s"] = times[warmup:]
    result["peak_rss_mb"] = peak_rss_mb()
    if cuda:
        result["cuda_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    if kind in ("ours", "reference"):
        _summarize_tracking(spec, cp, counter, result)
    if kind == "ours" and spec.get("path", "model") == "model":
        _routes(cp, model, result)  # after training: on an unattached Cockpit check() reroutes
    if norms and norms[0] is not None:  # the last step's per-sample norms, to compare peers
        result["last_norms"] = [float(v) for v in norms[0]]
    if "torchvision" in sys.modules:
        result["torchvision_imported"] = True
    return result


def _summarize_tracking(spec: dict, cp, counter: _Counter | None, result: dict) -> None:
    warmup, total, every = (
        int(spec["warmup"]),
        int(spec["warmup"]) + int(spec["steps"]),
        int(spec["every"]),
    )
    # HVPs of the measured steps only (a warm-started eigensolver needs more at first)
    tracked = len([s for s in range(warmup, total) if s % every == 0])
    if counter is not None:
        measured = counter.count - result.get("hvps_warmup", 0)
        result["hvps_total"] = counter.count
        result["hvps_per_tracked_step"] = measured / tracked if tracked else None
    if spec["kind"] == "ours":
        output = cp.get_output()
        result["tracked_steps"] = len(output)
        result["errors"] = [f"step {e['step']} {e['quantity']}: {e['error']}" for e in cp.errors]
        result["skipped"] = len(cp.skipped)
        counts = [
            _find_hvp_count(vals["hess_max_ev"])
            for step, vals in output.items()
            if "hess_max_ev" in vals and step >= warmup
        ]
        counts = [c for c in counts if c is not None]
        if counts:
            result["hess_max_ev_hvps_from_output"] = sum(counts) / len(counts)
    else:
        result["tracked_steps"] = len(cp.get_output()) if hasattr(cp, "get_output") else None
        result["errors"] = []


def describe() -> dict[str, dict]:
    """``{problem: {"params": n, "batch_size": B, "model": text, "classifier": bool}}``."""
    import torch
    from overhead_problems import PROBLEMS, get_problem, n_params

    out = {}
    for name in PROBLEMS:
        problem = get_problem(name)
        torch.manual_seed(0)
        out[name] = {
            "params": n_params(problem.make_model()),
            "batch_size": problem.batch_size,
            "model": problem.description,
            "classifier": problem.classifier,
        }
    return out


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--describe"]:
        print(json.dumps(describe()))
        return 0
    spec = json.loads(argv[1])
    try:
        result = {"ok": True, **run(spec)}
    except Exception as err:  # reported to the parent, which records it and goes on
        result = {
            "ok": False,
            "error": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc(limit=6),
            "peak_rss_mb": peak_rss_mb(),
        }
    sys.stdout.flush()
    print(RESULT_TAG + " " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
