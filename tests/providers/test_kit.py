"""The provider conformance kit catches broken providers, with messages that say how to fix them."""

from __future__ import annotations

import contextlib

import pytest
import torch

from cockpit_core import DenseGrads, StatisticProvider
from cockpit_core.testing import ConformanceError, Problem, check_provider, tiny_mlp
from cockpit_core.testing.reference import explicit_ggn, explicit_hessian

from .loop_provider import LoopProvider

FAST = {"kinds": ["batch_l2"], "problems": [tiny_mlp()]}


class Unscaled(LoopProvider):
    """Delivers the gradients of l_n / B (as a mean-loss backward pass scales them)."""

    name = "unscaled"

    def collect(self, collection):  # noqa: D102
        original = collection.deliver

        def deliver(index, grads, defer=False):
            original(index, DenseGrads(grads.materialize() / collection.batch_size), defer)

        collection.deliver = deliver
        return super().collect(collection)


def test_a_wrong_value_names_kind_parameter_error_and_fix():
    with pytest.raises(ConformanceError) as err:
        check_provider(Unscaled, **FAST)
    message = str(err.value)
    for part in ("batch_l2", "'0.weight' (Linear)", "problem 'mlp'", "max error", "batch_size"):
        assert part in message


class Yes(LoopProvider):
    name = "yes"

    def supports(self, slot, kind):  # noqa: D102
        return True  # wrong: None means supported


def test_supports_must_return_none_or_a_reason():
    with pytest.raises(ConformanceError, match=r"returned True .* non-empty string"):
        check_provider(Yes, **FAST)


class Fragile(LoopProvider):
    """Computes transforms itself, before the other statistics, and lets their errors escape."""

    name = "fragile"

    @contextlib.contextmanager
    def collect(self, collection):  # noqa: D102
        yield
        for stat in collection.statistics:
            if stat.kind == "transform":
                for i in collection.targets[stat.identity]:
                    p = self.params[i]
                    value = stat.fn(torch.zeros(1, *p.shape, dtype=p.dtype), p.detach())
                    collection.store(stat, i, value)
        with super().collect(collection):
            pass  # backward() has run already: the loop delivers the other statistics


def test_a_failing_statistic_must_not_escape_collect():
    with pytest.raises(ConformanceError, match=r"collect\(\) raised .*injected failure"):
        check_provider(Fragile, **FAST)


class Zeros(LoopProvider):
    """Delivers zeros for parameters without a gradient instead of leaving them out."""

    name = "zeros"

    @contextlib.contextmanager
    def collect(self, collection):  # noqa: D102
        with super().collect(collection):
            yield
        for i in collection.indices:
            if self.params[i].grad is None:
                size = collection.batch_size
                collection.deliver(i, DenseGrads(torch.zeros(size, *self.params[i].shape)))


def test_parameters_without_gradient_stay_none():
    with pytest.raises(ConformanceError, match="'spare.weight' .*got no gradient"):
        check_provider(Zeros, **FAST)


class Nameless(LoopProvider):
    name = "nameless"
    description = ""


class Claimless(StatisticProvider):
    name = "claimless"
    description = "claims nothing"


def test_class_attributes_are_checked():
    with pytest.raises(ConformanceError, match="description is empty"):
        check_provider(Nameless)
    with pytest.raises(ConformanceError, match="claims no kind"):
        check_provider(Claimless)
    with pytest.raises(ConformanceError, match="does not claim 'diag_hessian'"):
        check_provider(LoopProvider, kinds=["diag_hessian"])


class Picky(LoopProvider):
    name = "picky"

    def supports(self, slot, kind):  # noqa: D102
        return "never"


def test_a_provider_that_supports_nothing_cannot_pass():
    with pytest.raises(ConformanceError, match="accepted no parameter"):
        check_provider(Picky, **FAST)


def _linear_problem(loss: str) -> Problem:
    def make():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 3).double()

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, generator=gen, dtype=torch.float64)
    if loss == "mse":
        y = torch.randn(16, 3, generator=gen, dtype=torch.float64)
    else:
        y = torch.randint(0, 3, (16,), generator=gen)
    return Problem("linear", make, x, y, 5, loss)


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_explicit_ggn_equals_the_hessian_of_a_model_linear_in_its_parameters(loss):
    problem = _linear_problem(loss)
    model = problem.make_model()
    x, y = problem.batch(0)
    ggn = explicit_ggn(model, problem, x, y)
    assert ggn.shape == (15, 15)
    torch.testing.assert_close(ggn, explicit_hessian(model, problem, x, y), rtol=1e-12, atol=1e-14)
    assert torch.linalg.eigvalsh(ggn).min() > -1e-12  # positive semi-definite


def test_explicit_ggn_differs_from_the_hessian_of_a_nonlinear_model():
    problem = tiny_mlp()
    model = problem.make_model()
    x, y = problem.batch(0)
    ggn, hessian = explicit_ggn(model, problem, x, y), explicit_hessian(model, problem, x, y)
    torch.testing.assert_close(ggn, ggn.T, rtol=0, atol=1e-14)
    assert torch.linalg.eigvalsh(ggn).min() > -1e-12
    assert (ggn - hessian).abs().max() > 1e-3
