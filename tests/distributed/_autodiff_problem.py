"""The problem of the ``autodiff`` tests under accumulation and DDP, and its references.

:func:`~cockpit_core.testing.tiny_transformer` (embedding, learned positions, attention,
LayerNorm, GELU; 231 parameters, float64), not extended: the ``autodiff`` provider computes
every curvature diagonal. Quantities: ``hess_trace`` of the Hessian and of the GGN
(``diag_hessian``, ``diag_ggn_exact``) and ``tic_diag`` (the Hessian diagonal with the
gradients' second moment).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from cockpit_core import Cockpit
from cockpit_core.engine.attention import math_attention
from cockpit_core.testing import tiny_transformer
from cockpit_core.testing.reference import explicit_ggn, explicit_hessian

STEPS = 2
PROBLEM = tiny_transformer(extended=False, batch_size=6)
QUANTITIES = [
    {"name": "hess_trace"},
    {"name": "hess_trace", "method": "diag_ggn_exact", "label": "ggn_trace"},
    {"name": "tic_diag"},
]
CURVATURE = QUANTITIES[:2]
"""The quantities whose every statistic comes from the ``autodiff`` provider."""
RTOL = 1e-10
"""float64: the parts' diagonals differ from the whole batch's by summation order only."""


def info_of(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> dict:
    """``info`` of a (micro-)batch, with the inputs the provider recomputes the loss from."""
    loss = torch.nn.functional.cross_entropy(out, y)
    losses = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
    return {
        "loss": loss,
        "individual_losses": losses,
        "batch_size": len(x),
        "inputs": x,
        "targets": y,
    }


@functools.cache
def one_batch() -> tuple[dict, dict]:
    """One process, the whole batch: the Cockpit's output, and explicit references at step 0.

    The references are the per-parameter traces of the diagonals of the explicit float64
    Hessian and GGN (:mod:`cockpit_core.testing.reference`; the Hessian costs one
    autograd call per parameter entry, so only step 0's is formed). Cached: the
    accumulation and DDP tests of one session share it.
    """
    model = PROBLEM.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, QUANTITIES, on_error="raise", distributed="off")
    cp.attach(model, torch.nn.CrossEntropyLoss(reduction="none"))
    x, y = PROBLEM.batch(0)
    with math_attention():
        hessian = torch.diagonal(explicit_hessian(model, PROBLEM, x, y))
        ggn = torch.diagonal(explicit_ggn(model, PROBLEM, x, y))
    sizes = [p.numel() for p in model.parameters()]
    references = {
        "hess_trace": [float(d.sum()) for d in torch.split(hessian, sizes)],
        "ggn_trace": [float(d.sum()) for d in torch.split(ggn, sizes)],
    }
    for step in range(STEPS):
        x, y = PROBLEM.batch(step)
        opt.zero_grad()
        out = model(x)
        info = info_of(x, y, out)
        with cp(step, info=info):
            info["loss"].backward()
        opt.step()
    return cp.get_output(), references


def _close(actual, expected, where: str) -> None:
    scale = float(np.max(np.abs(expected)))  # entries that cancel to ~0: relative to the largest
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL * scale, err_msg=where)


def assert_matches(
    output: dict, expected: dict, references: dict, where: str, keys: list[str] | None = None
) -> None:
    """Step 0 against the explicit references; every step against one process on the batch.

    Args:
        output: The Cockpit output of the run under test.
        expected: :func:`one_batch`'s output.
        references: :func:`one_batch`'s explicit per-parameter traces at step 0.
        where: For the messages.
        keys: The output keys to compare (default: every key of ``expected``).

    """
    for key in ("hess_trace", "ggn_trace"):
        _close(output[0][key]["per_param"], references[key], f"{where}: {key} vs explicit")
    assert set(output) == set(expected) == set(range(STEPS)), where
    for step in range(STEPS):
        wanted = set(expected[step]) if keys is None else set(keys)
        assert set(output[step]) == wanted, f"{where}: step {step} has {set(output[step])}"
        for key in sorted(wanted):
            for part in ("total", "per_param"):
                _close(
                    output[step][key][part],
                    expected[step][key][part],
                    f"{where}: {key} {part} at step {step}",
                )
