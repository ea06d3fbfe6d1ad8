"""FSDP2 (``fully_shard``, 2 gloo processes, CPU, float64): exact values from the shards.

Each process of ``_fsdp_worker.py`` shards two transformer blocks and the root with
``fully_shard`` (its parameters are ``DTensor`` s) and trains on its part of each global
batch of 8, split 4/4 and 5/3. The reference is one unsharded process holding the whole
batch, trained with the same update (the mean of the two parts' mean gradients, which is
what FSDP's reduce-scatter averages).

- ``loss`` and ``grad_hist_1d`` (per-sample statistics from the module hooks, which see the
  unsharded weights, combined over the processes) equal the reference on every process, at
  both splits; histogram counts are identical.
- The first-party quantities that declare shards (``grad_norm``, ``distance``,
  ``update_size``, ``param_norm``, ``update_ratio``, the gradient tests, ``cabs`` with the
  learning rate from the optimizer, ``noise_scale``), ``optimizer_hparams`` and the
  shard-aware test quantities (``_fsdp_quantities``, written as a third party would) read
  only each process's rows and equal the reference; those that read the gradient only with
  equal local batches (else refused with the reason). The projections on the gradient
  (``inner_test``, ``ortho_test``, ``noise_scale``) gather one parameter's gradient at a
  time.
- ``alpha`` (directions from the sharded parameters and optimizer state), ``hess_max_ev``
  (Hessian-vector products) and ``noise_scale_cheap`` are refused per quantity with their
  reason; training is unchanged, and cockpit's own code gathers no parameter (a spy on
  every gather), and never holds two gathered gradients at once.
- ``distributed="off"``, a Cockpit built before ``fully_shard``: every quantity refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from _fsdp_quantities import SHARD_AWARE  # noqa: E402
from _fsdp_worker import (  # noqa: E402
    FAILING_RANK,
    FAILING_STEP,
    LR,
    SIZES,
    STEPS,
    SYNC_QUANTITIES,
    SYNC_SIZES,
    batch,
    make_model,
    quantities,
)
from test_ddp import assert_same, launch  # noqa: E402

from cockpit_core import Cockpit  # noqa: E402
from cockpit_core.distributed import sharded  # noqa: E402
from cockpit_core.distributed.sharded import (  # noqa: E402
    HVP_REASON,
    MICRO_BATCH_REASON,
    PARAMS_REASON,
    PROJECTION_REASON,
    REASON,
    UNEQUAL_REASON,
)

pytest.importorskip("torch.distributed.fsdp")
pytest.importorskip("cockpit_hooks")

RTOL = 1e-9
IDS = [f"{a}/{b}" for a, b in SIZES]
EXACT = {
    "loss",
    "grad_hist_1d",
    "shard_distance",
    "distance",
    "update_size",
    "param_norm",
    "update_ratio",
    "optimizer_hparams",
}
"""Equal to the reference at every split (they do not read the gradient)."""
NEEDS_GRADIENT = {
    "shard_grad_norm",
    "shard_mean_gsnr",
    "shard_norm_test",
    "grad_norm",
    "norm_test",
    "mean_gsnr",
    "early_stopping",
    "cabs",
    "cabs_optimizer",
    "inner_test",
    "ortho_test",
    "noise_scale",
}
"""Equal to the reference with equal splits; refused with unequal ones (UNEQUAL_REASON)."""
TWO_STEP = {"update_size", "update_ratio"}
"""Stored under the step whose update they measure: none at the last step."""
PROJECTS = {"inner_test", "ortho_test", "noise_scale"}
"""Read BATCH_PROJECTION: one gathered gradient per parameter and step, one at a time."""
REFUSED = {
    "parameters": PARAMS_REASON,  # reads ctx.params without declaring shards
    "alpha": PROJECTION_REASON.split("{stat}")[1],
    "hess_max_ev": HVP_REASON,
    "noise_scale_cheap": MICRO_BATCH_REASON,
}


def assert_close(actual, expected, path: str) -> None:
    """``assert_same`` at ``RTOL``; non-finite entries identical (``update_ratio``'s ``inf``).

    ``assert_same`` scales its absolute tolerance by the largest entry, which an ``inf``
    (a parameter of norm 0, such as a bias initialised to zero) would make infinite.
    """
    if isinstance(expected, dict):
        assert set(actual) == set(expected), path
        for k in expected:
            assert_close(actual[k], expected[k], f"{path}.{k}")
        return
    if isinstance(expected, (float, np.ndarray, np.number)):
        e, a = np.asarray(expected, dtype=np.float64), np.asarray(actual, dtype=np.float64)
        finite = np.isfinite(e)
        assert np.array_equal(np.isfinite(a), finite), path
        assert np.array_equal(a[~finite], e[~finite], equal_nan=True), path
        assert_same(a[finite], e[finite], RTOL, path)
        return
    assert_same(actual, expected, RTOL, path)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fsdp")


@pytest.fixture(scope="module")
def outputs(run_dir) -> list[dict]:
    return launch("_fsdp_worker.py", 2, run_dir)


def _reference(sizes: tuple[int, int]) -> dict:
    """One unsharded process, the global batch; the update is the mean of the parts' means."""
    model = make_model()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9)
    # noise_scale_cheap needs several micro-batches or processes: nothing to compare here
    tracked = [q for q in quantities() if q != "noise_scale_cheap"]
    cp = Cockpit(model, tracked, distributed="off")
    cuts = [slice(0, sizes[0]), slice(sizes[0], sum(sizes))]
    losses: list[list[float]] = [[], []]
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        per_sample = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
        info = {"loss": loss, "individual_losses": per_sample, "batch_size": len(x)}
        with cp(step, info={**info, "optimizer": opt}):
            loss.backward()
        parts = []
        for rank, cut in enumerate(cuts):  # what each FSDP process backpropagates
            part = torch.nn.functional.cross_entropy(model(x[cut]), y[cut])
            losses[rank].append(float(part.detach()))
            parts.append(torch.autograd.grad(part, params))
        for p, g0, g1 in zip(params, *parts):
            p.grad = (g0 + g1) / 2
        opt.step()
    assert not cp.errors, cp.errors
    return {
        "output": cp.get_output(),
        "losses": losses,
        "names": [n for n, _ in model.named_parameters()],
    }


@pytest.fixture(scope="module")
def references() -> dict:
    return {sizes: _reference(sizes) for sizes in SIZES}


def test_the_test_quantities_equal_the_first_party_ones_on_one_process(references):
    """Unsharded, shard_sum returns its argument: the same values as the quantities they mirror."""
    for ref in references.values():
        for step, values in ref["output"].items():
            for mine, theirs in SHARD_AWARE.items():
                assert_same(values[mine], values[theirs], 1e-12, f"step {step} {mine}")


def test_training_is_unchanged_by_cockpit(outputs, references):
    for rank, result in enumerate(outputs):
        for how, sizes in result:
            run, plain = result[(how, sizes)], result[("plain", sizes)]
            assert run["types"] == ["DTensor"], "the parameters are not sharded"
            assert len(run["losses"]) == STEPS, f"rank{rank} {how} did not finish"
            if how in ("exact", "no_reshard", "accumulate"):  # the math attention kernel of
                # hess_max_ev; micro-batches: other summation orders
                torch.testing.assert_close(run["losses"], plain["losses"], rtol=1e-13, atol=0)
                torch.testing.assert_close(run["params"], plain["params"], rtol=1e-13, atol=1e-15)
                continue
            # the same computation in the same process: identical, not merely close
            assert run["losses"] == plain["losses"], f"rank{rank} {how} {sizes}"
            for mine, theirs in zip(run["params"], plain["params"]):
                assert torch.equal(mine, theirs), f"rank{rank} {how} {sizes}"
        for sizes in SIZES:  # and as the reference's update (summation order only)
            torch.testing.assert_close(
                torch.tensor(result[("plain", sizes)]["losses"]),
                torch.tensor(references[sizes]["losses"][rank]),
                rtol=1e-10,
                atol=0.0,
            )


RUNS_COMPARED = [("exact", s) for s in SIZES] + [("no_reshard", SIZES[0])]


@pytest.mark.parametrize(
    "how,sizes", RUNS_COMPARED, ids=[f"{h}-{a}/{b}" for h, (a, b) in RUNS_COMPARED]
)
def test_quantities_from_the_shards_equal_one_process_on_the_global_batch(
    outputs, references, how, sizes
):
    expected = references[sizes]["output"]
    equal = sizes[0] == sizes[1]
    exact = EXACT | (NEEDS_GRADIENT if equal else set())
    for rank, result in enumerate(outputs):
        output = result[(how, sizes)]["output"]
        assert set(output) == set(range(STEPS)), f"rank{rank}"
        for step in range(STEPS):
            wanted = exact - TWO_STEP if step == STEPS - 1 else exact
            assert set(output[step]) == wanted, f"rank{rank} step {step}"
            for key in wanted:
                reference = expected[step][SHARD_AWARE.get(key, key)]
                assert_close(output[step][key], reference, f"rank{rank} {step} {key}")
            # counts are integers: identical, not close
            hist, ref_hist = output[step]["grad_hist_1d"], expected[step]["grad_hist_1d"]
            assert np.array_equal(hist["hist"], ref_hist["hist"]), f"rank{rank} {step}"
            assert np.array_equal(hist["per_param"], ref_hist["per_param"])
            assert hist["hist"].sum() == sum(sizes) * sum(
                p.numel() for p in make_model().parameters()
            )


@pytest.mark.parametrize("sizes", SIZES, ids=IDS)
def test_first_party_quantities_are_exact_except_those_refused(outputs, sizes):
    """The lists above cover every tracked quantity: exact, refused, or gradient-refused."""
    run = outputs[0][("exact", sizes)]
    keys = {k for values in run["output"].values() for k in values}
    keys |= {e["quantity"] for e in run["errors"]}
    assert keys == EXACT | NEEDS_GRADIENT | set(REFUSED)


@pytest.mark.parametrize("sizes", SIZES, ids=IDS)
def test_other_quantities_are_refused_per_quantity_with_the_reason(outputs, sizes):
    for rank, result in enumerate(outputs):
        run = result[("exact", sizes)]
        by_quantity: dict[str, set] = {}
        for e in run["errors"]:
            by_quantity.setdefault(e["quantity"], set()).add((e["step"], e["error"]))
        expected = dict(REFUSED)
        if sizes[0] != sizes[1]:
            for name in NEEDS_GRADIENT:
                expected[name] = UNEQUAL_REASON.format(sizes=f"{sizes[0]}/{sizes[1]}")
        assert set(by_quantity) == set(expected), f"rank{rank}"
        for name, reason in expected.items():
            steps = {s for s, _ in by_quantity[name]}
            assert steps == ({0, 2} if name == "hess_max_ev" else set(range(STEPS))), name
            for _, error in by_quantity[name]:
                assert error.startswith("UnsupportedModelError: "), error
                assert reason in error, (name, error)
        assert run["skipped"] == []
    assert outputs[0][("exact", sizes)]["errors"] == outputs[1][("exact", sizes)]["errors"]


def test_a_shard_sum_abandoned_by_one_process_fails_there_and_training_goes_on(outputs, references):
    """Process 1's quantity raises before the shard_sum that process 0 waits in."""
    expected = references[SIZES[0]]["output"]
    for rank, result in enumerate(outputs):
        run = result[("flaky", SIZES[0])]
        assert len(run["losses"]) == STEPS
        assert {(e["step"], e["quantity"]) for e in run["errors"]} == {
            (step, "shard_flaky") for step in range(STEPS)
        }
        for e in run["errors"]:
            if rank == 1:
                assert e["error"] == "RuntimeError: injected failure", e["error"]
            else:
                assert e["error"].startswith("OtherProcessError: 'shard_flaky'"), e["error"]
                assert "it failed on process(es) [1]" in e["error"], e["error"]
        for step in range(STEPS):  # the quantities after it are unaffected
            output = run["output"][step]
            assert set(output) == {"loss", "shard_grad_norm"}
            assert_same(output["shard_grad_norm"], expected[step]["grad_norm"], RTOL, "norm")
            assert_same(output["loss"], expected[step]["loss"], RTOL, "loss")


def test_micro_batches_combine_as_one_process_on_the_global_batch(outputs, references):
    expected = references[SIZES[0]]["output"]
    for rank, result in enumerate(outputs):
        run = result[("accumulate", SIZES[0])]
        assert run["errors"] == [], run["errors"]
        for step in range(STEPS):
            output = run["output"][step]
            assert set(output) == {"loss", "grad_hist_1d", "shard_grad_norm", "shard_mean_gsnr"}
            for key, value in output.items():
                reference = expected[step][SHARD_AWARE.get(key, key)]
                assert_same(value, reference, RTOL, f"rank{rank} {step} {key}")


def test_cockpit_gathers_no_parameter_and_one_gradient_at_a_time(outputs):
    """No DTensor is gathered; of the gradient, one parameter at a time (projections).

    Cockpit's own gathers are small integer layouts, and, at equal splits (where
    ``BATCH_PROJECTION`` is formed), each parameter's gradient once per tracked step
    (padded to the processes' equal chunks), all into one buffer of the largest
    parameter's size: one address, so never two gathered gradients at once.
    """
    params = list(make_model().parameters())
    padded = [2 * -(-p.shape[0] // 2) * (p.numel() // p.shape[0]) for p in params]
    for rank, result in enumerate(outputs):
        for sizes in SIZES:
            seen = result[("exact", sizes)]["gathers"]
            assert seen, "the spy saw nothing: it does not watch cockpit's collectives"
            layouts = [g for g in seen if g[1] == "torch.int64"]
            gradients = [g for g in seen if g[1] != "torch.int64"]
            assert {g[0] for g in layouts} <= {"all_gather"}, f"rank{rank}: {layouts}"
            smallest = min(p.numel() for p in params if p.dim() > 1)
            assert max(g[2] for g in layouts) < 2 * smallest * 26, layouts
            if sizes[0] != sizes[1]:  # the gradient's rows are not g's: nothing to project
                assert gradients == [], f"rank{rank}: {gradients}"
                continue
            assert {g[0] for g in gradients} <= {"all_gather_single", "all_gather_into_tensor"}
            assert {g[1] for g in gradients} == {"torch.float64"}, gradients
            assert [g[2] for g in gradients] == padded * STEPS, f"rank{rank}"
            for step in range(STEPS):  # one buffer per step, one parameter's size
                buffers = {g[3:] for g in gradients[step * len(params) : (step + 1) * len(params)]}
                assert len(buffers) == 1, f"rank{rank} step {step}: {buffers}"
                assert buffers.pop()[1] == max(padded) * 8, f"rank{rank} step {step}"


def test_parameter_names_are_those_of_the_model(outputs, references):
    for result in outputs:
        for run in result.values():
            assert run["names"] == references[SIZES[0]]["names"]


def test_check_reports_every_parameter_served_by_the_module_hooks(outputs, references):
    for rank, result in enumerate(outputs):
        for sizes in SIZES:
            served = result[("exact", sizes)]["served"]
            assert list(served) == references[sizes]["names"], f"rank{rank}"
            assert set(served.values()) == {"hooks"}, f"rank{rank}: {served}"


@pytest.mark.parametrize("how", ["off", "late"])
def test_unreadable_layouts_refuse_every_quantity_with_the_reason(outputs, how):
    for rank, result in enumerate(outputs):
        run = result[(how, SIZES[0])]
        assert run["output"] == {}, f"rank{rank}: a value computed on sharded parameters"
        assert run["errors"], f"rank{rank}: nothing recorded"
        for e in run["errors"]:
            assert e["error"].startswith(f"UnsupportedModelError: {REASON}"), e["error"]
            if how == "late":  # the model's parameters, not the tracked ones, are sharded
                assert "sharded after the Cockpit was built" in e["error"]
            else:
                assert "'blocks.0.self_attn.in_proj_weight' and 25 more" in e["error"]
        assert {e["step"] for e in run["errors"]} == set(range(STEPS))
        assert run["skipped"] == []
        refusals = [w for w in run["warnings"] if "DTensors" in w]  # one per Cockpit
        assert len(refusals) == 1, run["warnings"]
    assert outputs[0][(how, SIZES[0])]["errors"] == outputs[1][(how, SIZES[0])]["errors"]


def test_on_error_raise_raises_a_refusal_on_every_process_alike(outputs):
    for rank, result in enumerate(outputs):
        raised = result[("raise", SIZES[0])]["raised"]
        assert len(raised) == STEPS, f"rank{rank}: {raised}"
        assert all("sharded" in r or "FSDP2" in r for r in raised), raised
    assert outputs[0][("raise", SIZES[0])]["raised"] == outputs[1][("raise", SIZES[0])]["raised"]


def test_rank_0_alone_logs_values_and_refusals(outputs, run_dir):
    records = [json.loads(line) for line in (run_dir / "exact.jsonl").read_text().splitlines()]
    errors = [r for r in records if r.get("kind") == "error"]
    assert len(errors) == len(outputs[0][("exact", SIZES[0])]["errors"])
    assert [f.name for f in run_dir.glob("*.jsonl")] == ["exact.jsonl"]  # rank 0's only
    text = (run_dir / "exact.jsonl").read_text()
    assert "shard_grad_norm" in text and "grad_hist_1d" in text


# -- the distributed synchronisation path: a failure on one process stays contained ---------


@pytest.fixture(scope="module")
def sync_runs(tmp_path_factory) -> list[dict]:
    return launch("_fsdp_worker.py", 2, tmp_path_factory.mktemp("sync"), "sync_failure")


@pytest.mark.parametrize("sizes", SYNC_SIZES, ids=[f"{a}/{b}" for a, b in SYNC_SIZES])
def test_a_gradient_sync_failing_on_one_process_fails_the_step_everywhere(sync_runs, sizes):
    """The gradient's part of the all-reduce fails on process 1 at one step (injected).

    Before, the exception left the ``with cp(...)`` block on that process only, and the
    other waited in the all-reduce until the process group's timeout.
    """
    for rank, result in enumerate(sync_runs):
        clean, failed = result[(sizes, False)], result[(sizes, True)]
        assert clean["errors"] == [], clean["errors"]
        assert failed["losses"] == clean["losses"], f"rank{rank}: training changed"
        assert {(e["step"], e["quantity"]) for e in failed["errors"]} == {
            (FAILING_STEP, q) for q in SYNC_QUANTITIES
        }
        for e in failed["errors"]:
            assert e["error"].startswith("GradientUnavailableError: the global batch's gradient")
            assert f"process(es) [{FAILING_RANK}]" in e["error"]
            here = "(here: RuntimeError: injected failure)" in e["error"]
            assert here == (rank == FAILING_RANK), e["error"]
        assert FAILING_STEP not in failed["output"]
        for step in set(range(STEPS)) - {FAILING_STEP}:
            for key, value in clean["output"][step].items():
                assert_same(failed["output"][step][key], value, 1e-12, f"rank{rank} {key}")


# -- whether the model was sharded after the Cockpit was built: remembered per model --------


def test_the_models_layout_is_listed_once_and_again_when_a_parameter_is_replaced(monkeypatch):
    """``holds_sharded`` lists the model's parameters once, and again only after a change."""

    class Marked(torch.nn.Parameter):  # stands for a DTensor (no process group needed)
        pass

    monkeypatch.setattr(sharded, "_SHARDED", (Marked,))
    model = make_model()
    listed = []
    modules = model.modules

    def counting() -> Any:
        listed.append(1)
        return modules()

    monkeypatch.setattr(model, "modules", counting)
    assert not sharded.holds_sharded(model)
    assert not sharded.holds_sharded(model)
    assert len(listed) == 1, "listed again though nothing changed"
    head = model.head
    head.weight = Marked(head.weight.detach().clone())  # what fully_shard does, per module
    assert sharded.holds_sharded(model)
    assert len(listed) == 2
    assert sharded.holds_sharded(model)
    assert len(listed) == 2
    other = make_model()  # another model: its own answer
    assert not sharded.holds_sharded(other)


def test_the_remembered_layout_does_not_keep_the_model_alive():
    """The answer is kept per model without a strong reference to it (nor its Cockpits)."""
    import gc
    import weakref

    model = make_model()
    assert not sharded.holds_sharded(model)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
