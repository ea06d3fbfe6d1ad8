"""10,000 steps of the economy preset tracked every step: memory stays flat."""

import gc
import warnings

import torch
import torch.nn.functional as F
from cockpit_backpack import extend

from cockpit_core import Cockpit
from cockpit_core.log import read_records

STEPS = 10_000


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def test_economy_for_10000_steps_keeps_memory_flat_and_streams_to_the_log(tmp_path):
    torch.manual_seed(0)
    model = extend(
        torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    )
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    log = tmp_path / "log.jsonl"
    cp = Cockpit(
        model.named_parameters(), "economy", log=log, keep_in_memory=False, log_fsync_every=None
    )
    x_all, y_all = torch.randn(256, 4), torch.randint(0, 2, (256,))
    samples = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(STEPS):
            idx = torch.randint(0, 256, (8,))
            x, y = x_all[idx], y_all[idx]
            opt.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            losses = F.cross_entropy(out, y, reduction="none").detach()
            with cp(
                step,
                info={"loss": loss, "individual_losses": losses, "batch_size": 8, "optimizer": opt},
            ):
                loss.backward(retain_graph=cp.retain_graph(step))
            opt.step()
            if step in (1_000, STEPS - 1):
                gc.collect()
                samples[step] = rss_bytes()
    cp.close()
    growth = samples[STEPS - 1] - samples[1_000]
    # A leak of even one small tensor per step (>= 100 bytes) would exceed 1 MB over 9,000
    # steps; allocator noise stays well below the 8 MB bound.
    assert growth < 8 * 2**20, f"RSS grew by {growth / 2**20:.1f} MB after warm-up"
    assert cp.get_output() == {}  # streamed, not kept
    assert not cp.errors
    live = {owner for owner, _ in cp._tracker.cache.keys()}
    assert live <= {"distance", "update_size", "alpha"}, live
    records = read_records(log)
    value_steps = {r["step"] for r in records if r["kind"] == "values"}
    assert value_steps == set(range(STEPS))
