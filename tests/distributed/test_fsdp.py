"""FSDP2 (``fully_shard``, 2 gloo processes, CPU, float64): cockpit never stops training.

Each process of ``_fsdp_worker.py`` shards two transformer blocks and the root with
``fully_shard`` (its parameters are ``DTensor`` s) and trains on its half of each global
batch: without a Cockpit, with ``Cockpit(model, "economy")`` and with
``distributed="off"``. Cockpit does not yet combine sharded statistics, so every quantity
scheduled at a step is recorded as failed with the reason, on every process, with one
warning; training is unchanged. Before this refusal existed the first tracked step raised
``RuntimeError: aten.add_.Tensor got mixed torch.Tensor and DTensor`` out of the block.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from _fsdp_worker import (  # noqa: E402
    FAILING_RANK,
    FAILING_STEP,
    GLOBAL_BATCH,
    RUNS,
    STEPS,
    SYNC_QUANTITIES,
    SYNC_SIZES,
    batch,
    make_model,
)
from test_ddp import assert_same, launch  # noqa: E402

from cockpit_core import Cockpit  # noqa: E402
from cockpit_core.distributed.sharded import REASON  # noqa: E402

pytest.importorskip("torch.distributed.fsdp")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fsdp")


@pytest.fixture(scope="module")
def outputs(run_dir) -> list[dict]:
    return launch("_fsdp_worker.py", 2, run_dir)


@pytest.fixture(scope="module")
def reference() -> dict:
    """One process, no sharding, the global batch: its local-half losses and economy's keys."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cp = Cockpit(model, "economy", distributed="off")
    half = GLOBAL_BATCH // 2
    losses: list[list[float]] = [[], []]
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        out = model(x)
        for rank in range(2):
            part = slice(rank * half, (rank + 1) * half)
            losses[rank].append(
                float(torch.nn.functional.cross_entropy(out[part], y[part]).detach())
            )
        loss = torch.nn.functional.cross_entropy(out, y)
        per_sample = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
        info = {"loss": loss, "individual_losses": per_sample, "batch_size": len(x)}
        with cp(step, info={**info, "optimizer": opt}):
            loss.backward()
        opt.step()
    assert not cp.errors, cp.errors
    keys = {k for values in cp.get_output().values() for k in values}
    return {
        "losses": losses,
        "keys": keys,
        "names": [n for n, _ in model.named_parameters()],
        "params": [p.detach().clone() for p in model.parameters()],
    }


def test_training_is_unchanged_by_cockpit(outputs, reference):
    for rank, result in enumerate(outputs):
        assert result["plain"]["types"] == ["DTensor"], "the parameters are not sharded"
        for how in RUNS:
            assert len(result[how]["losses"]) == STEPS, f"rank{rank} {how} did not finish"
            # the same computation in the same process: identical, not merely close
            assert result[how]["losses"] == result["plain"]["losses"], f"rank{rank} {how}"
            for mine, plain in zip(result[how]["params"], result["plain"]["params"]):
                assert torch.equal(mine, plain), f"rank{rank} {how}"
        # and FSDP trains as one process on the global batch would (summation order only)
        torch.testing.assert_close(
            torch.tensor(result["plain"]["losses"]),
            torch.tensor(reference["losses"][rank]),
            rtol=1e-10,
            atol=0.0,
        )


def test_parameter_names_are_those_of_the_model(outputs, reference):
    for result in outputs:
        assert result["plain"]["names"] == reference["names"]
        assert not any("_fsdp_wrapped_module" in n for n in result["plain"]["names"])


@pytest.mark.parametrize("how", ["economy", "off", "late"])
def test_every_scheduled_quantity_is_refused_with_the_reason(outputs, reference, how):
    for rank, result in enumerate(outputs):
        run = result[how]
        assert run["output"] == {}, f"rank{rank}: a value computed on sharded parameters"
        assert run["errors"], f"rank{rank}: nothing recorded"
        for e in run["errors"]:
            assert e["error"].startswith(f"UnsupportedModelError: {REASON}"), e["error"]
            if how == "late":  # the model's parameters, not the tracked ones, are sharded
                assert "sharded after the Cockpit was built" in e["error"]
            else:
                assert "'blocks.0.self_attn.in_proj_weight' and 25 more" in e["error"]
        # every step, every quantity that one unsharded process computes
        assert {e["step"] for e in run["errors"]} == set(range(STEPS))
        assert {e["quantity"] for e in run["errors"]} >= reference["keys"] - {"time"}
        assert run["skipped"] == []
        # one warning per Cockpit, not one per quantity
        refusals = [w for w in run["warnings"] if "DTensors" in w]
        assert len(refusals) == 1, run["warnings"]
        if how != "late":  # late: also the optimizer's parameters are not the tracked ones
            assert len(run["warnings"]) == 1, run["warnings"]
    assert outputs[0][how]["errors"] == outputs[1][how]["errors"]


def test_on_error_raise_raises_the_refusal_on_every_process_alike(outputs):
    for rank, result in enumerate(outputs):
        raised = result["raise"]["raised"]
        assert len(raised) == STEPS, f"rank{rank}: {raised}"
        assert all(r.startswith(REASON) for r in raised), raised
    assert outputs[0]["raise"]["raised"] == outputs[1]["raise"]["raised"]


def test_rank_0_logs_the_refusals(outputs, run_dir):
    records = [json.loads(line) for line in (run_dir / "economy.jsonl").read_text().splitlines()]
    errors = [r for r in records if r.get("kind") == "error"]
    assert len(errors) == len(outputs[0]["economy"]["errors"])
    assert all(REASON in r["error"] for r in errors)


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
