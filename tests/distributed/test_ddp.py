"""Under torch.distributed (2 processes, gloo, CPU) every quantity equals one process on the global batch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from _problem import PROVIDERS, QUANTITIES, STEPS, batch, make_model  # noqa: E402
from cockpit_backpack import extend

from cockpit_core import Cockpit  # noqa: E402

HERE = Path(__file__).parent
TIMEOUT = 240  # seconds for both processes together (they take ~10 s here)
# float64: only the summation order differs (per rank, then across ranks), ~1e-15; Lanczos
# (hess_max_ev) and the divisions in the tests amplify it a little. float32: the same
# rounding at 6e-8 relative, amplified by cancellations such as sum_n g_n^2 - B g^2 and
# early stopping's 1 - B/D sum_d snr_d, so small entries are compared against the largest
# entry of the same value (ATOL_SCALE x rtol x max |entry|, at least rtol for terms ~1).
RTOL = {"float64": 1e-10, "float32": 1e-5}
ATOL_SCALE = {"float64": 1e-3, "float32": 1.0}
CONFIGS = [
    ("float64", (32, 32)),
    ("float64", (40, 24)),
    ("float32", (32, 32)),
    ("float32", (40, 24)),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(worker: str, world: int, out_dir: Path, *args: str) -> list[dict]:
    """Run ``worker`` in ``world`` processes on the loopback interface; return their outputs."""
    port = str(free_port())
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / worker), str(r), str(world), port, str(out_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT)
            logs.append(out.decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} failed:\n{log[-4000:]}"
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def ddp_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ddp")


@pytest.fixture(scope="module")
def ddp_outputs(ddp_dir) -> list[dict]:
    return launch("_worker.py", 2, ddp_dir)


def single_process(dtype: torch.dtype) -> dict:
    model = make_model(dtype)
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cp = Cockpit(model.named_parameters(), QUANTITIES, on_error="raise", distributed="off")
    for step in range(STEPS):
        x, y = batch(step, dtype)
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        losses = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": len(x), "optimizer": opt}
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return cp.get_output()


def assert_same(actual, expected, rtol: float, path: str, atol_scale: float = 1e-3) -> None:
    if isinstance(expected, dict):
        assert set(actual) == set(expected), f"{path}: keys {set(actual) ^ set(expected)}"
        for k in expected:
            if k == "time":
                continue
            assert_same(actual[k], expected[k], rtol, f"{path}.{k}", atol_scale)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, rtol, f"{path}[{i}]", atol_scale)
    elif isinstance(expected, (int, float, np.ndarray, np.number)) and not isinstance(
        expected, bool
    ):
        e = np.asarray(expected, dtype=np.float64)
        a = np.asarray(actual, dtype=np.float64)
        # atol: values that are 0 up to rounding (e.g. cancelling sums) in one of the runs
        scale = float(np.nanmax(np.abs(e))) if e.size and np.isfinite(e).any() else 1.0
        if atol_scale >= 1:
            scale = max(scale, 1.0)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * atol_scale * scale, err_msg=path)
    else:
        assert actual == expected, path


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype,sizes", CONFIGS, ids=[f"{d}-{s[0]}/{s[1]}" for d, s in CONFIGS])
def test_every_quantity_equals_one_process_on_the_global_batch(ddp_outputs, dtype, sizes, provider):
    expected = single_process(getattr(torch, dtype))  # BackPACK for everything
    names = {q if isinstance(q, str) else q["name"] for q in QUANTITIES}
    assert names <= {k for v in expected.values() for k in v}, "reference misses quantities"
    for rank, outputs in enumerate(ddp_outputs):
        assert_same(
            outputs[(dtype, sizes, provider)],
            expected,
            RTOL[dtype],
            f"rank{rank}",
            ATOL_SCALE[dtype],
        )


@pytest.mark.parametrize("provider", PROVIDERS)
def test_gradient_accumulation_with_no_sync_equals_one_process(ddp_outputs, provider):
    # each process: 32 samples as 2 micro-batches of 16, DDP's all-reduce only on the last
    # (no_sync() on the first); the accumulated global batch is the same 64 samples
    expected = single_process(torch.float64)
    for rank, outputs in enumerate(ddp_outputs):
        assert_same(
            outputs[("float64", "accumulate 2x16", provider)],
            expected,
            RTOL["float64"],
            f"rank{rank}",
            ATOL_SCALE["float64"],
        )


def test_only_rank_0_writes_the_log_unless_write_on_all(ddp_outputs, ddp_dir):
    from cockpit_core import read_log

    assert (ddp_dir / "rank0-rank0.jsonl").exists()
    assert not (ddp_dir / "rank0-rank1.jsonl").exists()
    logs = [read_log(ddp_dir / f"all-rank{r}.jsonl") for r in range(2)]
    # every process logs the same global value of the loss
    assert logs[0][0]["loss"] == pytest.approx(logs[1][0]["loss"], rel=1e-12)
