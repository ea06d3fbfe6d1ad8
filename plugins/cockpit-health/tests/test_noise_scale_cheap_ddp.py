"""noise_scale_cheap under DDP: 2 gloo processes on the loopback interface, float64.

The global batch's micro-batches are those of both processes (each process's local batch
when it does not accumulate). The reference takes every micro-batch's gradient with
``torch.autograd.grad`` in this process, in rank order, and evaluates the definition (the
helper of ``test_noise_scale_cheap.py``); both processes must report it (rtol 1e-9, as
there).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from _noise_scale_ddp_worker import CONFIGS, STEPS, global_batch, mlp  # noqa: E402
from test_noise_scale_cheap import RTOL, reference  # noqa: E402

TIMEOUT = 240  # seconds for both processes together (about 10 s here)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("noise_scale_ddp")
    port = str(free_port())
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    worker = str(HERE / "_noise_scale_ddp_worker.py")
    procs = [
        subprocess.Popen(
            [sys.executable, worker, str(r), "2", port, str(out_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        for r in range(2)
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
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_both_processes_report_the_global_batchs_micro_batches(outputs, config):
    sizes = [b for rank_sizes in CONFIGS[config] for b in rank_sizes]
    model, loss_fn = mlp(), torch.nn.MSELoss()
    for step in range(STEPS):
        x, y = global_batch(step, sum(sizes))
        expected = reference(model, x, y, sizes, loss_fn)
        for rank, output in enumerate(outputs):
            value = output[config][step]["noise_scale_cheap"]
            where = f"{config}, step {step}, rank {rank}"
            for key in ("batch_size", "micro_batch_size", "micro_batches", "reason"):
                assert value[key] == expected[key], f"{where}: {key}"
            for key in ("trace_cov", "grad_sq", "b_simple"):
                np.testing.assert_allclose(
                    value[key], expected[key], rtol=RTOL, err_msg=f"{where}: {key}"
                )
