"""One measured training run of the overhead benchmark, in a fresh process.

``overhead.py`` starts this module as ``python overhead_child.py SPEC_JSON`` once per
configuration. It must run both in the project's environment (``kind`` ``plain`` or
``ours``) and in a side environment holding Cockpit 1.0.2 (``kind`` ``reference``), so at
module level it imports only the standard library. The last stdout line is the result:
``@@RESULT@@ {json}``.

A spec (dict) holds: ``kind``, ``problem`` (``mlp``/``cnn``), ``device``, ``threads``,
``seed``, ``warmup``, ``steps`` (measured), ``every`` (tracking interval), and for
``ours``/``reference`` either ``preset`` or ``quantity``.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback
from typing import Any

RESULT_TAG = "@@RESULT@@"
BATCH_SIZE = 128
N_BATCHES = 4  # distinct synthetic batches, cycled; generated before timing starts
LEARNING_RATE = 0.01

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


def make_model(problem: str):
    """``mlp``: Flatten + Linear(784, 10). ``cnn``: DeepOBS 3c3d for 3x32x32 inputs.

    3c3d: conv 64 5x5 (valid) -> 28x28, max-pool 3/2 'same' -> 14, conv 96 3x3 (valid) ->
    12, max-pool -> 6, conv 128 3x3 (padded) -> 6, max-pool -> 3, flatten 128*3*3 = 1152,
    linear 512, 256, 10, ReLU after every conv and hidden linear layer. ``MaxPool2d(3, 2,
    padding=1)`` gives the output sizes of TensorFlow's 'same' pooling used by DeepOBS.
    """
    from torch import nn

    if problem == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), (1, 28, 28)
    if problem == "cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 64, 5),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
            nn.Conv2d(64, 96, 3),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
            nn.Conv2d(96, 128, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
            nn.Flatten(),
            nn.Linear(1152, 512),
            nn.ReLU(),
            nn.Linear(512, 256),
            nn.ReLU(),
            nn.Linear(256, 10),
        )
        return model, (3, 32, 32)
    raise ValueError(f"unknown problem {problem!r}: use 'mlp' or 'cnn'")


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


def _build_ours(spec: dict, model, result: dict):
    import cockpit_core
    from cockpit_core.context import HessianVectorProducts

    registry = cockpit_core.default_registry()
    result["plugins"] = {p.distribution: p.version for p in registry.plugins if p.ok}
    every = int(spec["every"])
    if "preset" in spec:
        base = cockpit_core.resolve_quantities(spec["preset"], registry)
    else:
        base = cockpit_core.resolve_quantities([spec["quantity"]], registry)
    # Force the interval on every member (presets could carry their own schedules).
    quantities = [
        type(q)(q.config.model_copy(update={"every": every, "offset": 0, "schedule": None}))
        for q in base
    ]
    result["quantities"] = [q.key for q in quantities]
    counter = _Counter(HessianVectorProducts, "__call__")
    cp = cockpit_core.Cockpit(model.named_parameters(), quantities=quantities, registry=registry)
    return cp, counter


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


def tracked_step(cp, model, loss_fn, opt, batch, step: int, reference: bool = False) -> None:
    """One training step inside ``with cp(step, info=...)``, as each library's docs show.

    Ours keeps the loss graph with ``retain_graph``; Cockpit 1.0.2 (``reference``) asks for
    ``create_graph``.
    """
    import torch  # imported in run() first, which measures the RSS after imports
    import torch.nn.functional as F

    x, y = batch
    opt.zero_grad()
    out = model(x)
    loss = loss_fn(out, y)
    with torch.no_grad():
        losses = F.cross_entropy(out, y, reduction="none")
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
    if kind in ("plain", "ours"):
        import cockpit_core  # plain imports it too, so import memory cancels in RSS ratios

        extend = cockpit_core.extend
    elif kind == "reference":
        import backpack
        import cockpit  # noqa: F401

        extend = backpack.extend
    else:
        raise ValueError(f"unknown kind {kind!r}")
    result["rss_after_imports_mb"] = peak_rss_mb()

    torch.manual_seed(int(spec["seed"]))
    model, shape = make_model(spec["problem"])
    model = model.to(device)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(int(spec["seed"]) + 1)
    batches = [
        (
            torch.randn(BATCH_SIZE, *shape, generator=gen).to(device),
            torch.randint(0, 10, (BATCH_SIZE,), generator=gen).to(device),
        )
        for _ in range(N_BATCHES)
    ]
    cp = counter = None
    if kind != "plain":
        model, loss_fn = extend(model), extend(loss_fn)
        build = _build_ours if kind == "ours" else _build_reference
        cp, counter = build(spec, model, result)
    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    def step_plain(step: int) -> None:
        x, y = batches[step % N_BATCHES]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    def step_ours(step: int) -> None:
        tracked_step(cp, model, loss_fn, opt, batches[step % N_BATCHES], step)

    def step_reference(step: int) -> None:
        tracked_step(cp, model, loss_fn, opt, batches[step % N_BATCHES], step, reference=True)

    train_step = {"plain": step_plain, "ours": step_ours, "reference": step_reference}[kind]
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
    if kind != "plain":
        _summarize_tracking(spec, cp, counter, result)
    if "torchvision" in sys.modules:
        result["torchvision_imported"] = True
    return result


def _summarize_tracking(spec: dict, cp, counter: _Counter, result: dict) -> None:
    warmup, total, every = (
        int(spec["warmup"]),
        int(spec["warmup"]) + int(spec["steps"]),
        int(spec["every"]),
    )
    # HVPs of the measured steps only (a warm-started eigensolver needs more at first)
    tracked = len([s for s in range(warmup, total) if s % every == 0])
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


def main(argv: list[str]) -> int:
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
