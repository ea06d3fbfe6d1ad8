"""``Requirements(micro_batch_norms=True)``: each micro-batch's own gradient norms.

The reference takes each micro-batch's gradient with ``torch.autograd.grad`` of its own
(scaled) loss, in float64, and squares its norm per parameter. The core instead reduces
the gradient a tensor hook sees during the user's backward pass, so agreement checks that
the hooks see exactly one pass's contribution, unscaled, per parameter. Float64 norms
differ only by summation order: rtol 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cockpit_core import (
    Cockpit,
    Quantity,
    Requirements,
    StepContext,
)
from cockpit_core.requirements import merge_requirements

RTOL = 1e-12


class Norms(Quantity):
    """What ``ctx.micro_batch_norms`` holds, as plain data."""

    name = "micro_norms"
    REQUIREMENTS = Requirements(micro_batch_norms=True)

    def compute(self, ctx: StepContext) -> dict:
        """Contributions, own gradients, sizes, shares and ranks."""
        norms = ctx.micro_batch_norms
        return {
            "contributions": norms.contributions.cpu().numpy(),
            "grad_sq": norms.grad_sq().cpu().numpy(),
            "samples": list(norms.samples),
            "shares": list(norms.shares),
            "ranks": list(norms.ranks),
        }


class Undeclared(Quantity):
    """Reads the norms without declaring them."""

    name = "undeclared_norms"

    def compute(self, ctx: StepContext) -> float:
        """Fails: not declared."""
        return float(len(ctx.micro_batch_norms))


def model_and_data(seed: int = 0, n: int = 12, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    model = model.to(dtype)
    x = torch.randn(n, 3, generator=gen, dtype=dtype)
    y = torch.randn(n, 2, generator=gen, dtype=dtype)
    return model, x, y


def squared_norms(model, loss) -> np.ndarray:
    """``|d loss / d p|^2`` per parameter, by autograd."""
    grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
    return np.array([float((g.double() ** 2).sum()) for g in grads])


def hooks_left(model) -> int:
    # torch keeps a leaf tensor's hooks in _backward_hooks (see test_engine_structure)
    return sum(len(p._backward_hooks or {}) for p in model.parameters())


@pytest.mark.parametrize("sizes", [[12], [3, 5, 4], [6, 6]], ids=["one", "3+5+4", "6+6"])
def test_each_micro_batch_contribution_equals_its_own_gradient(sizes):
    model, x, y = model_and_data()
    loss_fn = torch.nn.MSELoss()
    cp = Cockpit(model.named_parameters(), [Norms()], on_error="raise")
    total = sum(sizes)
    expected_c, expected_g = [], []
    lo = 0
    for b in sizes:
        mean = loss_fn(model(x[lo : lo + b]), y[lo : lo + b])
        expected_g.append(squared_norms(model, mean))
        expected_c.append(squared_norms(model, mean * (b / total)))
        lo += b
    with cp(0, info={"batch_size": total}, accumulate=True) as run:
        lo = 0
        for b in sizes:
            loss = loss_fn(model(x[lo : lo + b]), y[lo : lo + b]) * (b / total)
            with run.micro_batch({"batch_size": b}):
                loss.backward()
            lo += b
    out = cp.get_output()[0]["micro_norms"]
    np.testing.assert_allclose(out["contributions"], np.array(expected_c), rtol=RTOL)
    np.testing.assert_allclose(out["grad_sq"], np.array(expected_g), rtol=RTOL)
    assert out["samples"] == sizes
    assert out["shares"] == pytest.approx([b / total for b in sizes], rel=1e-15)
    assert out["ranks"] == [0] * len(sizes)
    assert hooks_left(model) == 0


def test_a_step_without_accumulation_is_one_micro_batch():
    model, x, y = model_and_data()
    loss = torch.nn.MSELoss()(model(x), y)
    expected = squared_norms(model, loss)
    cp = Cockpit(model.named_parameters(), [Norms()], on_error="raise")
    with cp(0, info={"batch_size": len(x)}):
        loss.backward()
    out = cp.get_output()[0]["micro_norms"]
    np.testing.assert_allclose(out["contributions"], expected[None], rtol=RTOL)
    np.testing.assert_allclose(out["grad_sq"], expected[None], rtol=RTOL)
    assert (out["samples"], out["shares"], out["ranks"]) == ([12], [1.0], [0])
    # the grad that was there before the step is not this pass's contribution
    model.zero_grad()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    loss = torch.nn.MSELoss()(model(x), y)
    with cp(1, info={"batch_size": len(x)}):
        loss.backward()
    out = cp.get_output()[1]["micro_norms"]
    np.testing.assert_allclose(out["contributions"], expected[None], rtol=RTOL)


def test_only_the_micro_batches_backward_passes_are_counted():
    """Gradients taken inside the step but outside a micro-batch (here torch.autograd.grad
    of another loss, as a recomputing provider or a Hessian-vector product would) reach no
    hook: the parameters are hooked only during each micro-batch."""
    model, x, y = model_and_data()
    loss_fn = torch.nn.MSELoss()
    sizes, total = [5, 7], 12
    expected = []
    lo = 0
    for b in sizes:
        expected.append(squared_norms(model, loss_fn(model(x[lo : lo + b]), y[lo : lo + b])))
        lo += b
    cp = Cockpit(model.named_parameters(), [Norms()], on_error="raise")
    with cp(0, info={"batch_size": total}, accumulate=True) as run:
        lo = 0
        for b in sizes:
            xb, yb = x[lo : lo + b], y[lo : lo + b]
            loss = loss_fn(model(xb), yb) * (b / total)
            with run.micro_batch({"batch_size": b}):
                loss.backward()
            squared_norms(model, loss_fn(model(xb), yb))  # not a micro-batch's pass
            lo += b
    out = cp.get_output()[0]["micro_norms"]
    np.testing.assert_allclose(out["grad_sq"], np.array(expected), rtol=RTOL)


def test_norms_are_unscaled_by_a_grad_scaler():
    model, x, y = model_and_data(dtype=torch.float32)
    loss_fn = torch.nn.MSELoss()
    expected = squared_norms(model, loss_fn(model(x), y))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    cp = Cockpit(model.named_parameters(), [Norms()], on_error="raise")
    loss = loss_fn(model(x), y)
    with cp(0, info={"batch_size": len(x), "grad_scaler": scaler}):
        scaler.scale(loss).backward()
    out = cp.get_output()[0]["micro_norms"]
    # float32 norms (reduced in float32, squared in float64): rounding ~1e-7 relative
    np.testing.assert_allclose(out["contributions"], expected[None], rtol=1e-5)


def test_two_backward_passes_in_one_micro_batch_give_the_reason():
    model, x, y = model_and_data()
    loss_fn = torch.nn.MSELoss()
    cp = Cockpit(model.named_parameters(), [Norms()])
    with pytest.warns(match="arrived in several parts"):
        with cp(0, info={"batch_size": 12}, accumulate=True) as run:
            with run.micro_batch({"batch_size": 12}):
                loss_fn(model(x[:6]), y[:6]).mul(0.5).backward()
                loss_fn(model(x[6:]), y[6:]).mul(0.5).backward()
    assert 0 not in cp.get_output()
    (error,) = cp.errors
    assert error["error"].startswith("UnsupportedModelError") and "'0.weight'" in error["error"]
    assert hooks_left(model) == 0


def test_undeclared_reads_and_hooks_after_a_failing_block():
    model, x, y = model_and_data()
    cp = Cockpit(model.named_parameters(), [Undeclared()])
    loss = torch.nn.MSELoss()(model(x), y)
    with pytest.warns(match="micro_batch_norms=True"):
        with cp(0, info={"batch_size": 12}):
            loss.backward()
    assert "KeyError" in cp.errors[0]["error"]
    cp = Cockpit(model.named_parameters(), [Norms()])
    with pytest.raises(RuntimeError, match="user"):
        with cp(1, info={"batch_size": 12}):
            raise RuntimeError("user code")
    assert hooks_left(model) == 0
    with pytest.raises(RuntimeError, match="user"):
        with cp(2, info={"batch_size": 12}, accumulate=True) as run:
            with run.micro_batch({"batch_size": 12}):
                raise RuntimeError("user code")
    assert hooks_left(model) == 0


def test_untracked_steps_hook_nothing_and_requirements_merge():
    model, x, y = model_and_data()
    cp = Cockpit(model.named_parameters(), [Norms(every=2)], on_error="raise")
    seen = []
    for step in range(2):
        loss = torch.nn.MSELoss()(model(x), y)
        with cp(step, info={"batch_size": 12}):
            seen.append(hooks_left(model))
            loss.backward()
    assert seen == [len(list(model.parameters())), 0]
    merged = merge_requirements(
        [("a", Requirements()), ("b", Requirements(micro_batch_norms=True))]
    )
    assert merged.micro_batch_norms and not merged.empty
    assert not merge_requirements([("a", Requirements())]).micro_batch_norms


def test_missing_sizes_are_an_error_of_the_reader():
    model, x, y = model_and_data()
    cp = Cockpit(model.named_parameters(), [Norms()])
    with pytest.warns(match="size of some micro-batch is unknown"):
        with cp(0, info={"batch_size": 12}, accumulate=True) as run:
            for lo in (0, 6):
                with run.micro_batch({}):
                    torch.nn.MSELoss()(model(x[lo : lo + 6]), y[lo : lo + 6]).mul(0.5).backward()
    assert "MisuseError" in cp.errors[0]["error"]
