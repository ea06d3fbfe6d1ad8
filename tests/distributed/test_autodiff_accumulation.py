"""The ``autodiff`` provider under gradient accumulation: micro-batches equal the big batch.

The provider recomputes the loss of each micro-batch's ``info["inputs"]`` and returns the
diagonal of that micro-batch's mean loss; the core weights it by ``B_k / B``
(``combine="mean"``). The per-parameter traces of the Hessian and GGN diagonals must equal
the explicit float64 references of the whole batch (step 0) and one process on the whole
batch (every step) to 1e-10.

``tic_diag`` is left out here: on this model its gradient second moment of the learned
positions ``pos`` comes from the core's ``func`` provider, which refuses micro-batches
(``info['inputs'] holds 2 samples but the batch size is 6``); under DDP it is compared.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from _autodiff_problem import (  # noqa: E402
    CURVATURE,
    PROBLEM,
    STEPS,
    assert_matches,
    info_of,
    one_batch,
)

from cockpit_core import Cockpit  # noqa: E402

pytest.importorskip("cockpit_autodiff")


@pytest.fixture(scope="module")
def reference() -> tuple[dict, dict]:
    return one_batch()


def accumulated(micro: list[int]) -> dict:
    model = PROBLEM.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, CURVATURE, on_error="raise", distributed="off")
    cp.attach(model, torch.nn.CrossEntropyLoss(reduction="none"))
    for step in range(STEPS):
        x, y = PROBLEM.batch(step)
        total = len(x)
        opt.zero_grad()
        with cp(step, info={"batch_size": total}, accumulate=True) as run:
            lo = 0
            for size in micro:
                xb, yb = x[lo : lo + size], y[lo : lo + size]
                lo += size
                info = info_of(xb, yb, model(xb))
                info["loss"] = info["loss"] * (size / total)  # its share of the mean loss
                with run.micro_batch(info):
                    info["loss"].backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return cp.get_output()


@pytest.mark.parametrize("micro", [[2, 2, 2], [5, 1]], ids=["3x2", "5+1"])
def test_autodiff_diagonals_of_micro_batches_equal_the_big_batch(reference, micro):
    expected, references = reference
    keys = ["hess_trace", "ggn_trace"]
    assert_matches(accumulated(micro), expected, references, f"micro-batches {micro}", keys)
