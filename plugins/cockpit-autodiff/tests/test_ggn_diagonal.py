"""The GGN diagonal by per-sample VJPs against the explicit float64 GGN (Schraudolph, 2002)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch
from torch.func import functional_call

from cockpit_core.testing import Problem, tiny_mlp, tiny_transformer
from cockpit_core.testing.reference import explicit_ggn, flat

try:
    from cockpit_autodiff.ggn_diagonal import ggn_diagonal
except ImportError:  # the package is not installed yet: load the module from its file
    _path = Path(__file__).resolve().parents[1] / "cockpit_autodiff" / "ggn_diagonal.py"
    _spec = importlib.util.spec_from_file_location("_ggn_diagonal_under_test", _path)
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    ggn_diagonal = _module.ggn_diagonal


def _mlp_grid_problem() -> Problem:
    """An MLP regression problem with ``[B, 2, 3]`` outputs (``C = 6`` entries per sample)."""

    def make() -> torch.nn.Module:
        torch.manual_seed(3)
        return torch.nn.Sequential(
            torch.nn.Linear(4, 5),
            torch.nn.Tanh(),
            torch.nn.Linear(5, 6),
            torch.nn.Unflatten(1, (2, 3)),
        ).double()

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(32, 4, generator=gen, dtype=torch.float64)
    y = torch.randn(32, 2, 3, generator=gen, dtype=torch.float64)
    return Problem("mlp_grid", make, x, y, 5, "mse", 3)


PROBLEMS = {
    "mlp_ce": lambda: tiny_mlp(),
    "mlp_mse": lambda: tiny_mlp(loss="mse"),
    "mlp_grid_mse": _mlp_grid_problem,
    "transformer_ce": lambda: tiny_transformer(extended=False),
    # BackPACK's hooks on the encoder and head (when cockpit-backpack is installed)
    "transformer_ce_extended": lambda: tiny_transformer(extended=True),
}


def _setup(name: str, step: int = 0):
    problem = PROBLEMS[name]()
    model = problem.make_model()
    x, y = problem.batch(step)
    params = {n: p.detach() for n, p in model.named_parameters()}
    return problem, model, params, x, y


def _flat(diag: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> torch.Tensor:
    assert list(diag) == list(params)
    for k, p in params.items():
        assert diag[k].shape == p.shape and diag[k].dtype == p.dtype
    return flat(list(diag.values()))


@pytest.mark.parametrize("name", list(PROBLEMS))
@pytest.mark.parametrize("step", [0, 1])
def test_exact_matches_explicit_ggn(name, step):
    problem, model, params, x, y = _setup(name, step)
    got = _flat(ggn_diagonal(model, params, x, y, problem.loss), params)
    expected = torch.diagonal(explicit_ggn(model, problem, x, y))
    torch.testing.assert_close(got, expected, rtol=1e-8, atol=1e-14)
    assert expected.abs().max() > 1e-3  # not trivially zero


def test_mse_scale_is_torch_mse_loss_mean():
    """For a model linear in its parameters the GGN is the Hessian of ``nn.MSELoss()``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).double()
    x = torch.randn(7, 4, dtype=torch.float64)
    y = torch.randn(7, 3, dtype=torch.float64)
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    theta = flat([p.detach() for p in model.parameters()])

    def loss_of(vec: torch.Tensor) -> torch.Tensor:
        parts = torch.split(vec, [s.numel() for s in shapes])
        params = {n: t.reshape(s) for n, t, s in zip(names, parts, shapes)}
        return torch.nn.MSELoss()(functional_call(model, params, (x,)), y)

    hessian = torch.autograd.functional.hessian(loss_of, theta)
    params = {n: p.detach() for n, p in model.named_parameters()}
    got = _flat(ggn_diagonal(model, params, x, y, "mse"), params)
    torch.testing.assert_close(got, torch.diagonal(hessian), rtol=1e-10, atol=1e-14)


def test_subset_of_parameters():
    problem, model, params, x, y = _setup("transformer_ce")
    full = ggn_diagonal(model, params, x, y, problem.loss)
    subset = {k: params[k] for k in ("head.weight", "pos", "encoder.self_attn.in_proj_weight")}
    part = ggn_diagonal(model, subset, x, y, problem.loss)
    assert list(part) == list(subset)
    for k in subset:
        torch.testing.assert_close(part[k], full[k], rtol=1e-12, atol=1e-15)


def _per_draw(name: str, draws: int, seed: int):
    """``draws`` independent one-sample MC estimates ``[R, D]`` and the exact diagonal."""
    problem, model, params, x, y = _setup(name)
    exact = _flat(ggn_diagonal(model, params, x, y, problem.loss), params)
    gen = torch.Generator().manual_seed(seed)
    values = torch.stack(
        [
            _flat(ggn_diagonal(model, params, x, y, problem.loss, 1, gen), params)
            for _ in range(draws)
        ]
    )
    return problem, model, params, x, y, exact, values


@pytest.mark.parametrize(
    ("name", "draws"), [("mlp_ce", 400), ("mlp_mse", 400), ("transformer_ce", 150)]
)
def test_monte_carlo_is_unbiased(name, draws):
    problem, model, params, x, y, exact, values = _per_draw(name, draws, seed=1)
    std = values.std(dim=0)
    # the mean of independent one-vector draws
    se = std / len(values) ** 0.5
    assert ((values.mean(0) - exact).abs() <= 4 * se + 1e-12).all()
    # one call with M = 2000 vectors per sample: the mean of 2000 such draws
    gen = torch.Generator().manual_seed(2)
    mc = _flat(ggn_diagonal(model, params, x, y, problem.loss, 2000, gen), params)
    se_2000 = std / 2000**0.5
    assert ((mc - exact).abs() <= 4 * se_2000 + 1e-12).all()
    assert (std > 0).any()  # a real estimator, not the exact value
    assert ((mc - exact).abs() > 0).any()


@pytest.mark.parametrize("name", ["mlp_ce", "mlp_mse", "transformer_ce"])
def test_monte_carlo_reproducible(name):
    problem, model, params, x, y = _setup(name)

    def estimate(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return _flat(ggn_diagonal(model, params, x, y, problem.loss, 3, generator=gen), params)

    first, again, other = estimate(5), estimate(5), estimate(6)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_unknown_loss_raises():
    problem, model, params, x, y = _setup("mlp_ce")
    with pytest.raises(ValueError, match="cross_entropy.*mse"):
        ggn_diagonal(model, params, x, y, "nll")
    with pytest.raises(ValueError, match="mc_samples"):
        ggn_diagonal(model, params, x, y, "cross_entropy", mc_samples=0)


def test_float32_and_hooks_kept():
    """Works in the parameters' dtype; BackPACK-style hooks are hidden and put back."""
    problem = tiny_mlp()
    model = problem.make_model().float()
    seen = []
    handle = model[0].register_full_backward_hook(lambda *args: seen.append(1))
    before = [(dict(m._forward_hooks), dict(m._backward_hooks)) for m in model.modules()]
    x, y = problem.batch(0)
    params = {n: p.detach() for n, p in model.named_parameters()}
    diag = ggn_diagonal(model, params, x.float(), y, "cross_entropy")
    assert all(d.dtype == torch.float32 for d in diag.values())
    expected = ggn_diagonal(
        problem.make_model(), problem.make_model().state_dict(), x, y, "cross_entropy"
    )
    torch.testing.assert_close(
        _flat(diag, params), flat(list(expected.values())).float(), rtol=1e-4, atol=1e-6
    )
    after = [(dict(m._forward_hooks), dict(m._backward_hooks)) for m in model.modules()]
    assert before == after and not seen
    handle.remove()


def test_timings_tiny_transformer(capsys):
    problem, model, params, x, y = _setup("transformer_ce")
    ggn_diagonal(model, params, x, y, problem.loss)  # warm-up
    rows = []
    runs = {"exact (C=3 VJPs/sample)": None, "mc M=1": 1, "mc M=100": 100}
    for label, mc in runs.items():
        gen = torch.Generator().manual_seed(0)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            ggn_diagonal(model, params, x, y, problem.loss, mc, gen)
            times.append(time.perf_counter() - start)
        rows.append(f"{label}: best of 5 {min(times) * 1e3:.1f} ms")
    start = time.perf_counter()
    explicit_ggn(model, problem, x, y)
    rows.append(f"explicit_ggn reference: {(time.perf_counter() - start) * 1e3:.1f} ms")
    with capsys.disabled():
        print(
            f"\nggn_diagonal, tiny transformer (D={sum(p.numel() for p in params.values())}, B={len(x)}):"
        )
        for row in rows:
            print("  " + row)
