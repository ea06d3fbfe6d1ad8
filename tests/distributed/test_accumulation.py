"""Gradient accumulation: quantities of K micro-batches equal those of the one big batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from _problem import PROVIDERS, QUANTITIES, STEPS, batch, cockpit_params, make_model  # noqa: E402
from cockpit_backpack import extend
from test_ddp import ATOL_SCALE, RTOL, assert_same, single_process  # noqa: E402

from cockpit_core import Cockpit, MisuseError  # noqa: E402


def accumulated(dtype: torch.dtype, micro: list[int], provider: str) -> dict:
    model = make_model(dtype)
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cp = Cockpit(cockpit_params(model, provider), QUANTITIES, on_error="raise")
    for step in range(STEPS):
        x, y = batch(step, dtype)
        total = len(x)
        opt.zero_grad()
        with cp(step, info={"batch_size": total, "optimizer": opt}, accumulate=True) as run:
            lo = 0
            for size in micro:
                xb, yb = x[lo : lo + size], y[lo : lo + size]
                lo += size
                out = model(xb)
                loss = loss_fn(out, yb) * (size / total)  # its share of the mean loss
                losses = torch.nn.functional.cross_entropy(out, yb, reduction="none").detach()
                info = {"loss": loss, "individual_losses": losses, "batch_size": size}
                with run.micro_batch(info):
                    loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return cp.get_output()


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("micro", [[16, 16, 16, 16], [40, 24]], ids=["4x16", "40+24"])
def test_accumulated_micro_batches_equal_the_big_batch(micro, provider):
    expected = single_process(torch.float64)  # BackPACK for everything, one batch
    actual = accumulated(torch.float64, micro, provider)
    assert_same(actual, expected, RTOL["float64"], "accumulated", ATOL_SCALE["float64"])


def test_accumulate_needs_the_total_batch_size():
    model = make_model(torch.float64)
    cp = Cockpit(model.named_parameters(), ["loss"])
    with pytest.raises(MisuseError, match="batch_size"):
        with cp(0, info={}, accumulate=True):
            pass
