"""Probes of function calls: quantities that read the torch-function calls of the forward pass."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from cockpit_core import (
    Cockpit,
    FunctionCall,
    Probe,
    Quantity,
    QuantityConfig,
    Registry,
    Requirements,
    StepContext,
    hookimpl,
)

SOFTMAXES = (F.softmax, torch.softmax, torch.Tensor.softmax)
CALLS: list[tuple[str, str]] = []  # (owner class, function name) of every reduce call


class Inner(torch.nn.Module):
    """Scores then a softmax (the innermost module of the call)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(5, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return F.softmax(self.lin(x), dim=-1)


class Outer(torch.nn.Module):
    """A softmax of its own (``Tensor.softmax``) after an ``Inner``; and one in a no_grad block."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        with torch.no_grad():
            torch.softmax(x, dim=-1)  # not this step's (no gradients)
        return self.head(self.inner(x)).softmax(-1)


def _every(name: str, module: torch.nn.Module) -> bool:
    return True


def _max_and_sum(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    call = FunctionCall(*inputs)
    CALLS.append((type(module).__name__, call.function.__name__))
    assert call.kwargs.get("dim", call.args[1] if len(call.args) > 1 else None) == -1
    return torch.stack([output.amax(), call.args[0].double().square().sum()])


class SoftmaxConfig(QuantityConfig):
    """Options of :class:`SoftmaxCalls`."""

    inner_only: bool = False


class SoftmaxCalls(Quantity):
    """Per owner: the largest softmax output and the sum of squares of the softmax inputs."""

    name = "softmax_calls"
    Config = SoftmaxConfig
    config: SoftmaxConfig

    @property
    def probe(self) -> Probe:
        """The probe of the three softmax functions."""
        select = (lambda n, m: isinstance(m, Inner)) if self.config.inner_only else _every
        key = f"softmax(inner_only={self.config.inner_only})"
        return Probe(key, select, _max_and_sum, functions=SOFTMAXES)

    def requirements(self) -> Requirements:
        """One probe of function calls."""
        return Requirements(probes=(self.probe,))

    def compute(self, ctx: StepContext) -> dict[str, list[list[float]]]:
        """``{owner: [[max, sum of squares] per call]}``."""
        found = ctx.probe(self.probe.key)
        return {name: [c.tolist() for c in calls] for name, calls in found.items()}


class Broken(Quantity):
    """A probe of function calls whose reduce raises."""

    name = "broken_call_probe"

    def requirements(self) -> Requirements:
        """Divides the output by a string."""
        return Requirements(
            probes=(Probe("broken_calls", _every, lambda m, i, o: o / "x", functions=SOFTMAXES),)
        )

    def compute(self, ctx: StepContext) -> float:
        """Reads the probe (and fails)."""
        ctx.probe("broken_calls")
        return 0.0


def _registry() -> Registry:
    plugin = types.SimpleNamespace()

    def register_quantities(register):
        register(SoftmaxCalls)
        register(Broken)

    plugin.register_quantities = hookimpl(register_quantities)
    registry = Registry()
    registry.add_plugin(plugin, name="call-probes", distribution="test-call-probes")
    return registry


def _model() -> Outer:
    torch.manual_seed(0)
    return Outer().double()


def _expected(model: Outer, x: torch.Tensor) -> dict[str, list[list[float]]]:
    """Brute force: the two softmax calls with gradients, computed without hooks."""
    with torch.no_grad():
        scores = model.inner.lin(x)
        inner = torch.softmax(scores, dim=-1)
        logits = model.head(inner)
        outer = torch.softmax(logits, dim=-1)
    return {
        "inner": [[float(inner.max()), float(scores.square().sum())]],
        "": [[float(outer.max()), float(logits.square().sum())]],
    }


def _assert_close(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for owner, calls in expected.items():
        np.testing.assert_allclose(got[owner], calls, rtol=1e-12)


def _step(cp: Cockpit, model: torch.nn.Module, step: int, x: torch.Tensor) -> None:
    loss = model(x).square().mean()
    with cp(step, loss=loss):
        loss.backward()


def test_calls_are_read_with_their_innermost_module_on_tracked_steps_only():
    model = _model()
    cp = Cockpit(model, [{"name": "softmax_calls", "every": 2}], registry=_registry())
    expected, stack_sizes = {}, []
    model.inner.register_forward_pre_hook(
        lambda m, a: stack_sizes.append(torch._C._len_torch_function_stack())
    )
    CALLS.clear()
    for step in range(5):
        x = torch.randn(3, 5, dtype=torch.float64)
        if step % 2 == 0:
            expected[step] = _expected(model, x)
        _step(cp, model, step, x)
    out = cp.get_output()
    assert sorted(out) == [0, 2, 4] and not cp.errors
    for step, values in expected.items():
        got = out[step]["softmax_calls"]
        assert list(got) == ["inner", ""]  # in the order of the owners' first calls
        _assert_close(got, values)
    # F.softmax in Inner, Tensor.softmax in Outer; the no_grad call is not read
    assert CALLS == [("Inner", "softmax"), ("Outer", "softmax")] * 3
    assert stack_sizes == [1, 0, 1, 0, 1]  # the mode is on during tracked forward passes only
    assert torch._C._len_torch_function_stack() == 0


def test_select_reads_only_calls_whose_innermost_module_it_picks():
    model = _model()
    cp = Cockpit(model, [{"name": "softmax_calls", "inner_only": True}], registry=_registry())
    x = torch.randn(3, 5, dtype=torch.float64)
    _step(cp, model, 0, x)
    _assert_close(cp.get_output()[0]["softmax_calls"], {"inner": _expected(model, x)["inner"]})


def test_no_hook_and_no_mode_stays_while_no_probe_is_armed():
    model = _model()
    cp = Cockpit(model, [{"name": "softmax_calls", "every": 10}], registry=_registry())
    _step(cp, model, 0, torch.randn(2, 5, dtype=torch.float64))
    hooked = [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert not hooked  # step 10 is far: disarmed
    cp.prepare(10)
    assert all(m._forward_hooks and m._forward_pre_hooks for m in model.modules())
    cp.close()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_micro_batches_checkpoint_recomputes_and_other_modes():
    model = _model()
    cp = Cockpit(model, ["softmax_calls"], registry=_registry())
    x1, x2 = torch.randn(3, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    seen: list[object] = []

    class Spy(TorchFunctionMode):  # a mode of the user's, entered around the forward pass
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    CALLS.clear()
    with cp(0, accumulate=True) as run:
        for x in (x1, x2):
            with Spy():
                out = checkpoint(model, x, use_reentrant=False)  # backward reruns the forward
            loss = out.square().sum() / 5
            run.micro_batch(loss=loss)
            loss.backward()
    assert len(CALLS) == 4  # two calls per micro-batch; none from the recomputes
    assert F.softmax in seen and torch.Tensor.softmax in seen  # the user's mode saw them too
    first, second = _expected(model, x1), _expected(model, x2)
    got = cp.get_output()[0]["softmax_calls"]
    _assert_close(got, {k: first[k] + second[k] for k in first})
    assert torch._C._len_torch_function_stack() == 0


def test_a_composite_function_is_one_call():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(4, 2, batch_first=True).double()
    cp = Cockpit(mha, ["softmax_calls"], registry=_registry())
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    loss = mha(x, x, x)[0].square().sum()  # its softmax is inside F.multi_head_attention_forward
    with cp(0, loss=loss):
        loss.backward()
    assert cp.get_output()[0]["softmax_calls"] == {}  # watched, but no call of its own
    assert not cp.errors


def test_a_failing_reduce_is_recorded_and_training_goes_on():
    model = _model()
    cp = Cockpit(model, ["broken_call_probe", "softmax_calls"], registry=_registry())
    x = torch.randn(3, 5, dtype=torch.float64)
    with pytest.warns(UserWarning, match="its reduce raised TypeError.*at module 'inner'"):
        _step(cp, model, 0, x)
    assert [e["quantity"] for e in cp.errors] == ["broken_call_probe"]
    _assert_close(cp.get_output()[0]["softmax_calls"], _expected(model, x))
    assert torch._C._len_torch_function_stack() == 0


def test_a_forward_pass_that_raises_leaves_no_mode_behind():
    model = _model()
    cp = Cockpit(model, ["softmax_calls"], registry=_registry())
    with pytest.raises(RuntimeError):
        model(torch.randn(3, 6, dtype=torch.float64))  # wrong width: Linear raises
    assert torch._C._len_torch_function_stack() == 0
    x = torch.randn(3, 5, dtype=torch.float64)
    _step(cp, model, 0, x)
    _assert_close(cp.get_output()[0]["softmax_calls"], _expected(model, x))


def test_a_probe_rejects_functions_that_are_not_callable():
    with pytest.raises(ValueError, match="functions must be callables"):
        Probe("bad", _every, _max_and_sum, functions=("softmax",))  # type: ignore[arg-type]
