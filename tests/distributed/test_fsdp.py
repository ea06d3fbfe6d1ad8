"""FSDP2 (``fully_shard``, 2 gloo processes, CPU, float64): exact values from the shards.

Each process of ``_fsdp_worker.py`` shards two transformer blocks and the root with
``fully_shard`` (its parameters are ``DTensor`` s) and trains on its part of each global
batch of 8, split 4/4 and 5/3. The reference is one unsharded process holding the whole
batch, trained with the same update (the mean of the two parts' mean gradients, which is
what FSDP's reduce-scatter averages).

- ``loss`` and ``grad_hist_1d`` (per-sample statistics from the module hooks, which see the
  unsharded weights, combined over the processes) equal the reference on every process, at
  both splits; histogram counts are identical.
- The shard-aware test quantities (``_fsdp_quantities``: ``shards = True`` and
  ``shard_sum``) read only each process's rows and equal ``grad_norm``, ``distance``,
  ``mean_gsnr`` and ``norm_test`` of the reference; with unequal local batches the
  gradient is refused.
- Every other quantity is refused per quantity with its reason (it reads the shards without
  declaring it, projects on the gradient, or needs Hessian-vector products); training is
  unchanged, and cockpit's own code gathers no parameter (a spy on every gather).
- ``distributed="off"``, a Cockpit built before ``fully_shard``: every quantity refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
EXACT = {"loss", "grad_hist_1d", "shard_distance"}
"""Equal to the reference at every split; with equal splits also the gradient's quantities."""
NEEDS_GRADIENT = {"shard_grad_norm", "shard_mean_gsnr", "shard_norm_test"}
REFUSED = {
    "grad_norm": PARAMS_REASON,
    "distance": PARAMS_REASON,
    "update_size": PARAMS_REASON,
    "norm_test": PARAMS_REASON,
    "mean_gsnr": PARAMS_REASON,
    "early_stopping": PARAMS_REASON,
    "cabs": PARAMS_REASON,
    "inner_test": PROJECTION_REASON.format(stat="batch_projection"),
    "ortho_test": PROJECTION_REASON.format(stat="batch_projection"),
    "alpha": PROJECTION_REASON.split("{stat}")[1],
    "hess_max_ev": HVP_REASON,
    "noise_scale_cheap": MICRO_BATCH_REASON,
}


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
            assert set(output[step]) == exact, f"rank{rank} step {step}"
            for key in exact:
                reference = expected[step][SHARD_AWARE.get(key, key)]
                assert_same(output[step][key], reference, RTOL, f"rank{rank} {step} {key}")
            # counts are integers: identical, not close
            hist, ref_hist = output[step]["grad_hist_1d"], expected[step]["grad_hist_1d"]
            assert np.array_equal(hist["hist"], ref_hist["hist"]), f"rank{rank} {step}"
            assert np.array_equal(hist["per_param"], ref_hist["per_param"])
            assert hist["hist"].sum() == sum(sizes) * sum(
                p.numel() for p in make_model().parameters()
            )


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


def test_cockpit_gathers_no_parameter(outputs):
    """Cockpit's own collectives are small integer layouts; no DTensor is gathered."""
    for rank, result in enumerate(outputs):
        for sizes in SIZES:
            seen = result[("exact", sizes)]["gathers"]
            assert seen, "the spy saw nothing: it does not watch cockpit's collectives"
            kinds = {what for what, _, _ in seen}
            assert kinds <= {"all_gather"}, f"rank{rank}: {kinds}"
            assert {dtype for _, dtype, _ in seen} == {"torch.int64"}, f"rank{rank}: {seen}"
            smallest = min(p.numel() for p in make_model().parameters() if p.dim() > 1)
            assert max(n for _, _, n in seen) < 2 * smallest * 26, seen


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
