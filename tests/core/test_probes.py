"""Probes: quantities that read reductions of module outputs from the step's forward pass."""

from __future__ import annotations

import types

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from cockpit_core import (
    Cockpit,
    Probe,
    Quantity,
    QuantityConfig,
    Registry,
    Requirements,
    StepContext,
    hookimpl,
)
from cockpit_core.observe.probe import to_host


def _linear_sums(name: str, module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear)


def _square_sum(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return output.double().square().sum()


CALLS: list[str] = []


def _counted(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    CALLS.append(type(module).__name__)
    return output.double().square().sum()


class SumSquaresConfig(QuantityConfig):
    """Options of :class:`OutputSumSquares`."""

    counted: bool = False


class OutputSumSquares(Quantity):
    """Sum of squares of every Linear module's output, summed over the step's calls."""

    name = "output_sum_squares"
    Config = SumSquaresConfig
    config: SumSquaresConfig

    def requirements(self) -> Requirements:
        """One probe on every Linear module."""
        reduce = _counted if self.config.counted else _square_sum
        return Requirements(
            probes=(Probe(f"sumsq(counted={self.config.counted})", _linear_sums, reduce),)
        )

    def compute(self, ctx: StepContext) -> dict[str, float]:
        """``{module name: sum over calls}``."""
        found = ctx.probe(f"sumsq(counted={self.config.counted})")
        return {name: float(torch.stack(calls).sum()) for name, calls in found.items()}


class Broken(Quantity):
    """A quantity whose probe raises."""

    name = "broken_probe"

    def requirements(self) -> Requirements:
        """A probe whose reduce divides by a string."""
        return Requirements(probes=(Probe("broken", _linear_sums, lambda m, i, o: o / "x"),))

    def compute(self, ctx: StepContext) -> float:
        """Reads the probe (and fails)."""
        ctx.probe("broken")
        return 0.0


def _registry() -> Registry:
    plugin = types.SimpleNamespace()

    def register_quantities(register):
        register(OutputSumSquares)
        register(Broken)

    plugin.register_quantities = hookimpl(register_quantities)
    registry = Registry()
    registry.add_plugin(plugin, name="probes", distribution="test-probes")
    return registry


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)
    ).double()


def _expected(model: torch.nn.Module, x: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        h = model[0](x)
        out = model[2](model[1](h))
    return {"0": float(h.square().sum()), "2": float(out.square().sum())}


def test_a_probe_reads_module_outputs_on_tracked_steps_only():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(
        model,
        [{"name": "output_sum_squares", "every": 2, "counted": True}],
        registry=_registry(),
    )
    expected = {}
    CALLS.clear()
    for step in range(5):
        x = torch.randn(4, 5, dtype=torch.float64)
        if step % 2 == 0:
            expected[step] = _expected(model, x)
        loss = model(x).square().mean()  # the forward pass before the block
        with cp(step, loss=loss):
            loss.backward()
        opt.step()
        opt.zero_grad()
    out = cp.get_output()
    assert sorted(out) == [0, 2, 4] and not cp.errors
    for step, values in expected.items():
        assert out[step]["output_sum_squares"] == pytest.approx(values, rel=1e-12)
    assert len(CALLS) == 6  # two Linear modules at each of the three tracked steps


def test_forward_inside_the_block_micro_batches_and_no_grad_passes():
    model = _model()
    cp = Cockpit(model, ["output_sum_squares"], registry=_registry())
    x1, x2 = torch.randn(3, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    with torch.no_grad():
        model(torch.randn(8, 5, dtype=torch.float64))  # evaluation: not this step's
    with cp(0, accumulate=True) as run:
        for x in (x1, x2):
            loss = model(x).square().sum() / 5
            run.micro_batch(loss=loss)
            loss.backward()
    first, second = _expected(model, x1), _expected(model, x2)
    got = cp.get_output()[0]["output_sum_squares"]
    assert got == pytest.approx({k: first[k] + second[k] for k in first}, rel=1e-12)


def test_checkpointed_blocks_are_read_once():
    model = _model()
    cp = Cockpit(model, [{"name": "output_sum_squares", "counted": True}], registry=_registry())
    x = torch.randn(4, 5, dtype=torch.float64)
    CALLS.clear()
    out = checkpoint(model, x, use_reentrant=False)  # backward runs the forward again
    loss = out.square().mean()
    with cp(0, loss=loss):
        loss.backward()
    assert len(CALLS) == 2
    assert cp.get_output()[0]["output_sum_squares"] == pytest.approx(_expected(model, x))


def test_without_a_model_or_with_a_failing_probe_the_quantity_fails_and_training_goes_on():
    model = _model()
    with pytest.warns(UserWarning, match="'output_sum_squares' read the forward pass"):
        cp = Cockpit(model.parameters(), ["output_sum_squares"], registry=_registry())
    loss = model(torch.randn(4, 5, dtype=torch.float64)).square().mean()
    with pytest.warns(UserWarning, match="give it the model"):
        with cp(0, loss=loss):
            loss.backward()
    (error,) = cp.errors
    assert "UnsupportedModelError" in error["error"] and "cp.attach(model)" in error["error"]

    cp = Cockpit(model, ["broken_probe", "output_sum_squares"], registry=_registry())
    x = torch.randn(4, 5, dtype=torch.float64)
    loss = model(x).square().mean()
    with pytest.warns(UserWarning, match="its reduce raised TypeError"):
        with cp(0, loss=loss):
            loss.backward()
    assert [e["quantity"] for e in cp.errors] == ["broken_probe"]
    assert cp.get_output()[0]["output_sum_squares"] == pytest.approx(_expected(model, x))


def test_no_hook_stays_on_the_model_while_no_probe_is_armed():
    model = _model()
    cp = Cockpit(model, [{"name": "output_sum_squares", "every": 10}], registry=_registry())
    with cp(0, loss=model(torch.randn(2, 5, dtype=torch.float64)).sum()) as _:
        pass
    assert all(not m._forward_hooks for m in model.modules())  # step 10 is far: disarmed
    cp.prepare(10)
    assert all(bool(m._forward_hooks) == isinstance(m, torch.nn.Linear) for m in model[1:])


def test_to_host_keeps_shapes_order_and_dtypes():
    tensors = [
        torch.arange(6, dtype=torch.float64).reshape(2, 3),
        torch.tensor(7.0, dtype=torch.float64),
        torch.arange(4, dtype=torch.float32).reshape(4, 1) + 0.5,
        torch.zeros(0, 2, dtype=torch.float64),
    ]
    host = to_host(tensors)
    assert len(host) == len(tensors)
    for got, want in zip(host, tensors):
        assert got.shape == tuple(want.shape)
        assert got.dtype == want.numpy().dtype
        assert (got == want.numpy()).all()
    assert to_host([]) == []
