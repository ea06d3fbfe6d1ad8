"""A training process killed with SIGKILL keeps every step it finished (issue 5)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
import torch

from cockpit_core import Cockpit
from cockpit_core.log import read_log, read_records, read_run

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL is POSIX only")

CHILD = textwrap.dedent(
    """
    import sys, time
    import torch
    from cockpit_core import Cockpit
    from cockpit_core.testing import tiny_mlp

    problem = tiny_mlp()
    model = problem.make_model()
    loss_fn = problem.loss_module()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cp = Cockpit(model.named_parameters(), ["loss", "grad_norm", "distance"],
                 log=sys.argv[1], log_fsync_every=0.05)
    for step in range(100000):
        x, y = problem.batch(step)
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        losses = problem.individual_losses(out, y).detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": len(x)}
        with cp(step, info=info):
            loss.backward()
        opt.step()
        print(step, flush=True)  # the step's record was written before this line
    """
)


def test_sigkill_mid_run_keeps_every_finished_step(tmp_path):
    log = tmp_path / "log.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    finished = []
    try:
        deadline = time.monotonic() + 120
        while len(finished) < 25 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            finished.append(int(line))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert len(finished) >= 25, "the child did not train (see its stderr)"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line is allowed and warned about
        output = read_log(log)
        records = read_records(log)
    assert records[0]["kind"] == "header"
    assert [q["name"] for q in records[0]["quantities"]] == ["loss", "grad_norm", "distance"]
    # every step the child reported done is in the log, complete, with real values
    for step in finished:
        values = output[step]
        assert set(values) == {"loss", "grad_norm", "distance"}
        assert np.isfinite(values["loss"])
        assert values["grad_norm"]["per_param"].shape == (len(records[0]["params"]),)
    # and the steps read form a gap-free range (nothing in the middle got lost)
    steps = sorted(output)
    assert steps == list(range(steps[-1] + 1))

    # resuming the killed run on the same log continues it: nothing is truncated
    resume_at = steps[-1] + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = torch.nn.Linear(2, 1)
        cp = Cockpit(model.named_parameters(), ["loss"], log=log, log_fsync_every=None)
        for step in range(resume_at, resume_at + 3):
            losses = (model(torch.randn(4, 2)) ** 2).squeeze(1)
            info = {"loss": losses.mean(), "individual_losses": losses.detach(), "batch_size": 4}
            with cp(step, info=info):
                losses.mean().backward()
        cp.close()
    assert any("appending run 2" in str(w.message) for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn tail was cut before appending
        run = read_run(log)
    assert [h["run"] for h in run.headers] == [1, 2]
    assert sorted(run.output) == list(range(resume_at + 3))
    for step in steps:  # the first run's records survive
        assert run.output[step]["loss"] == output[step]["loss"]
