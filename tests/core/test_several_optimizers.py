"""Several optimizers and parameter groups in a hand-written loop (docs/integrations.md).

A Cockpit describes the parameters it is built from; ``info["optimizer"]`` is the
optimizer that updates them, and each parameter uses its own param group's
hyperparameters. Values are checked against brute-force float64 references written
from the definitions (tests/integrations/_common.py).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cockpit_backpack import extend

from cockpit_core import Cockpit, CockpitWarning

sys.path.insert(0, str(Path(__file__).parents[1] / "integrations"))
from _common import (  # noqa: E402
    assert_matches_brute_force,
    brute_force,
    chain_losses,
    per_sample,
)

QUANTITIES = ["loss", "grad_norm", "update_size", "distance", "alpha"]
STEPS = 3


def _chain() -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """``Linear(6, 5), Tanh`` and ``Linear(5, 3)`` (float64) and the mean loss."""
    torch.manual_seed(0)
    a = extend(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh()).double())
    b = extend(torch.nn.Sequential(torch.nn.Linear(5, 3)).double())
    return a, b, extend(torch.nn.CrossEntropyLoss())


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(4)
    return [
        (
            torch.randn(16, 6, generator=gen, dtype=torch.float64),
            torch.randint(0, 3, (16,), generator=gen),
        )
        for _ in range(STEPS)
    ]


def _info(
    out: torch.Tensor, y: torch.Tensor, loss: torch.Tensor, opt: torch.optim.Optimizer
) -> dict:
    losses = F.cross_entropy(out, y, reduction="none").detach()
    return {"loss": loss, "individual_losses": losses, "batch_size": len(y), "optimizer": opt}


def test_one_cockpit_per_optimizer_each_around_its_own_backward_pass():
    """Alternating updates (as in a GAN): one record per step in each Cockpit, its own values."""
    a, b, loss_fn = _chain()
    opts = [
        torch.optim.SGD(a.parameters(), lr=0.5, momentum=0.9),
        torch.optim.Adam(b.parameters(), lr=0.05),
    ]
    cps = [Cockpit(net.named_parameters(), QUANTITIES, on_error="raise") for net in (a, b)]
    params = [*a.parameters(), *b.parameters()]
    states: list[list] = [[], []]
    batches = _batches()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)  # each optimizer matches its Cockpit
        for step, (x, y) in enumerate(batches):
            for i, (opt, cp) in enumerate(zip(opts, cps)):
                states[i].append([p.detach().clone() for p in params])
                opt.zero_grad()
                out = b(a(x))  # the loss of optimizer 1 sees optimizer 0's update
                loss = loss_fn(out, y)
                with cp(step, info=_info(out, y, loss, opt)):
                    loss.backward()
                opt.step()

    for i, cp in enumerate(cps):
        expected = brute_force(chain_losses, [*states[i], params], [2 * i, 2 * i + 1], batches)
        output = cp.get_output()
        assert_matches_brute_force(output, expected, rel=1e-7)
        assert output[1]["alpha"]["predictor"] == ["sgd", "adam"][i]  # its own optimizer


def _shared_backward(a, b, cps: list[Cockpit], opt_of: list[int]) -> tuple[list, list]:
    """One backward pass of ``b(a(x))``, then optimizers 0 (``a``) and 1 (``b``) step.

    The ``with`` blocks of all ``cps`` are nested around the one backward pass;
    ``cps[k]`` gets ``info["optimizer"] = opts[opt_of[k]]``. Returns the values of every
    parameter at each step (and after the last) and the batches.
    """
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opts = [
        torch.optim.SGD(a.parameters(), lr=0.5, momentum=0.9),
        torch.optim.Adam(b.parameters(), lr=0.05),
    ]
    params = [*a.parameters(), *b.parameters()]
    states, batches = [], _batches()
    for step, (x, y) in enumerate(batches):
        states.append([p.detach().clone() for p in params])
        for opt in opts:
            opt.zero_grad()
        out = b(a(x))
        loss = loss_fn(out, y)
        with contextlib.ExitStack() as stack:
            for cp, i in zip(cps, opt_of):
                stack.enter_context(cp(step, info=_info(out, y, loss, opts[i])))
            loss.backward()
        for opt in opts:
            opt.step()
    return [*states, params], batches


def test_one_backward_pass_one_attached_cockpit_per_optimizer():
    """Nested ``with`` blocks; each Cockpit attached to its module (module hooks)."""
    a, b, _ = _chain()
    cps = [Cockpit(net.named_parameters(), QUANTITIES, on_error="raise") for net in (a, b)]
    for cp, net in zip(cps, (a, b)):
        cp.attach(net)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)
        states, batches = _shared_backward(a, b, cps, opt_of=[0, 1])
    for i, cp in enumerate(cps):
        expected = brute_force(chain_losses, states, [2 * i, 2 * i + 1], batches)
        output = cp.get_output()
        assert_matches_brute_force(output, expected, rel=1e-7)
        assert output[1]["alpha"]["predictor"] == ["sgd", "adam"][i]


def test_one_backward_pass_one_cockpit_over_both_optimizers():
    """Right where the optimizer does not matter; warned, and alpha not exact, where it does."""
    a, b, _ = _chain()
    cp = Cockpit(torch.nn.Sequential(a, b).named_parameters(), QUANTITIES, on_error="raise")
    with pytest.warns(
        CockpitWarning,
        match=r"info\['optimizer'\] updates 0 parameter\(s\) the Cockpit does not track and "
        r"does not update 2 tracked parameter\(s\); quantities that use the update or the "
        r"learning rate \(update_size, alpha, cabs\) may be wrong\.",
    ):
        states, batches = _shared_backward(a, b, [cp], opt_of=[0])
    output = cp.get_output()
    expected = brute_force(chain_losses, states, [0, 1, 2, 3], batches)
    assert_matches_brute_force(output, expected, rel=1e-7, skip=("alpha",))
    # Adam's update of the second layer is not predicted: the diagonal approximation
    assert output[1]["alpha"]["predictor"] == "generic"
    assert output[1]["alpha"]["exact"] is False


def test_param_groups_each_use_their_own_hyperparameters():
    """One optimizer, two groups (lr 0.5 / 0.05, momentum 0 / 0.9): lr-based values per group."""
    a, b, loss_fn = _chain()
    opt = torch.optim.SGD(
        [{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.05, "momentum": 0.9}],
        lr=0.5,
    )
    lrs = [0.5, 0.5, 0.05, 0.05]
    params = [*a.parameters(), *b.parameters()]
    model = torch.nn.Sequential(a, b)
    cp = Cockpit(model.named_parameters(), [*QUANTITIES, "cabs"], on_error="raise")
    states, batches = [], _batches()
    for step, (x, y) in enumerate(batches):
        states.append([p.detach().clone() for p in params])
        opt.zero_grad()
        out = b(a(x))
        loss = loss_fn(out, y)
        with cp(step, info=_info(out, y, loss, opt)):
            loss.backward()
        opt.step()

    output = cp.get_output()
    expected = brute_force(chain_losses, [*states, params], [0, 1, 2, 3], batches)
    # alpha exact at step 1: group 1's momentum entered its parameters' predicted update
    assert_matches_brute_force(output, expected, rel=1e-7, skip=("cabs",))
    assert output[1]["alpha"]["predictor"] == "sgd"
    # cabs (Balles et al., 2017, Eq. 22) per parameter: lr of its group * tr(Sigma_p) / L
    sizes = [p.numel() for p in params]
    for step, (x, y) in enumerate(batches):
        losses, grads = per_sample(chain_losses, states[step], [0, 1, 2, 3], x, y)
        traces = [g.var(0, correction=0).sum() for g in grads.split(sizes, dim=1)]
        per_param = [lr * float(tr / losses.mean()) for lr, tr in zip(lrs, traces)]
        np.testing.assert_allclose(output[step]["cabs"]["per_param"], per_param, rtol=1e-10)
        assert output[step]["cabs"]["total"] == pytest.approx(sum(per_param), rel=1e-10)
    # step 0 (momentum buffer = g): update / gradient is each parameter's own group lr;
    # the ratio of the totals (the dashboard's effective lr) mixes the groups
    for k in range(4):
        ratio = output[0]["update_size"]["per_param"][k] / output[0]["grad_norm"]["per_param"][k]
        assert ratio == pytest.approx(lrs[k], rel=1e-10)
    total = output[0]["update_size"]["total"] / output[0]["grad_norm"]["total"]
    assert 0.05 < total < 0.5
