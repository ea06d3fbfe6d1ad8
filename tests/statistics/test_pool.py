"""Small parameters reduced together (``cockpit_core.statistics.pool``) against the definitions.

A :class:`Collection` with ``pooling`` holds small parameters' per-sample gradients and
computes each statistic for all parameters of one shape at once. Every value must equal
the definition on the per-sample gradients formed one sample at a time (float64,
tolerance 1e-12 relative: sums of at most a few hundred products round near 1e-15; a wrong
row or axis is off by O(1)), and equal what the same collection without pooling computes.
"""

from __future__ import annotations

import pytest
import torch

from cockpit_core import (
    BATCH_L2,
    BATCH_PROJECTION,
    SUM_GRAD_SQUARED,
    Collection,
    DenseGrads,
    OuterProductGrads,
    ParamSlot,
    PooledGrads,
    per_sample_projection,
    per_sample_transform,
)
from cockpit_core.statistics import pool
from cockpit_core.statistics.projection import project

TOL = 1e-12
SHAPES = [(3, 4), (5,), (3, 4), (4, 3), (5,), (3, 4)]  # pools: (3, 4) x3, (5,) x2, (4, 3)
B = 6


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    scale = max(float(expected.abs().max()), 1e-300)
    assert float((actual - expected).abs().max()) / scale <= TOL


def _cubes(per_sample: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A transform: ``sum_n g_n^3 + theta``, parameter shape."""
    return (per_sample**3).sum(0) + param


def _cubes_pooled(p: PooledGrads) -> torch.Tensor:
    return ((p.grads**3).sum(1) + p.stack(p.params)).view(p.count, *p.shape)


def _three(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    return torch.stack([grad, param, grad * param])


CUBES = per_sample_transform("cubes", _cubes, reduce="sum", pooled_fn=_cubes_pooled)
CUBES_DECLINED = per_sample_transform(
    "cubes_declined", _cubes, reduce="sum", pooled_fn=lambda p: NotImplemented
)


def _three_pooled(grads: torch.Tensor, params: tuple[torch.Tensor, ...]) -> torch.Tensor:
    theta = torch.stack(params)
    return torch.stack([grads, theta, grads * theta], dim=1)


THREE = per_sample_projection("three", _three)
THREE_POOLED = per_sample_projection("three_pooled", _three, pooled_directions=_three_pooled)
THREE_DECLINED = per_sample_projection(
    "three_declined", _three, pooled_directions=lambda grads, params: NotImplemented
)
PROJECTIONS = (THREE, THREE_POOLED, THREE_DECLINED)
STATS = (BATCH_L2, SUM_GRAD_SQUARED, BATCH_PROJECTION, CUBES, CUBES_DECLINED, *PROJECTIONS)


def _problem():
    """Parameters, and per parameter its per-sample gradients ``[B, *shape]`` and a form.

    Linear weights come as ``OuterProductGrads`` with a sequence axis (formed one sample at
    a time by definition for the reference), the rest dense.
    """
    gen = torch.Generator().manual_seed(0)
    params, dense, forms = [], [], []
    for shape in SHAPES:
        params.append(torch.nn.Parameter(torch.randn(*shape, generator=gen, dtype=torch.float64)))
        if len(shape) == 2:
            a = torch.randn(B, 7, shape[1], generator=gen, dtype=torch.float64)
            d = torch.randn(B, 7, shape[0], generator=gen, dtype=torch.float64)
            dense.append(torch.stack([d[n].T @ a[n] for n in range(B)]))
            forms.append(lambda a=a, d=d: OuterProductGrads(a, d))
        else:
            g = torch.randn(B, *shape, generator=gen, dtype=torch.float64)
            dense.append(g)
            forms.append(lambda g=g: DenseGrads(g))
    return params, dense, forms


def _collection(params, stats, pooling: bool, eager: bool = True) -> Collection:
    """Every statistic wanted of every parameter; ``eager``: projections during backward."""
    slots = [ParamSlot(i, f"p{i}", p) for i, p in enumerate(params)]
    everyone = frozenset(range(len(params)))
    return Collection(
        statistics=stats,
        targets={s.identity: everyone for s in stats},
        slots=slots,
        batch_size=B,
        eager=eager,
        pooling=pooling,
    )


def _collect(
    params, forms, pooling: bool, stats=STATS, eager: bool = True, reverse: bool = False
) -> Collection:
    """Deliver every parameter's form (``reverse``: last first, as backward), then reduce."""
    col = _collection(params, stats, pooling, eager)
    order = range(len(forms) - 1, -1, -1) if reverse else range(len(forms))
    for i in order:
        col.deliver(i, forms[i]())
    col.flush()
    return col


@pytest.mark.parametrize("reverse", [False, True])
def test_pooled_values_equal_the_definitions(reverse):
    params, dense, forms = _problem()
    col = _collect(params, forms, pooling=True, reverse=reverse)
    assert not col.missing
    for i, (p, g) in enumerate(zip(params, dense)):
        flat = g.reshape(B, -1)
        mean = g.mean(0)
        _close(col.results[BATCH_L2.identity][i], (flat**2).sum(1))
        _close(col.results[SUM_GRAD_SQUARED.identity][i], (g**2).sum(0))
        _close(col.results[BATCH_PROJECTION.identity][i], flat @ mean.reshape(-1))
        expected = _cubes(g, p.detach())
        _close(col.results[CUBES.identity][i], expected)
        _close(col.results[CUBES_DECLINED.identity][i], expected)
        directions = _three(mean, p.detach()).reshape(3, -1)
        for stat in PROJECTIONS:
            _close(col.results[stat.identity][i], flat @ directions.T)


def test_pooled_values_equal_the_per_parameter_path():
    params, _, forms = _problem()
    pooled = _collect(params, forms, pooling=True)
    alone = _collect(params, forms, pooling=False)
    for stat in STATS:
        for a, b in zip(pooled.results[stat.identity], alone.results[stat.identity]):
            _close(a, b)


def test_a_small_budget_reduces_pools_on_the_way(monkeypatch):
    """Pools reduced whenever they hold more than POOL_BYTES give the same values."""
    params, dense, forms = _problem()
    monkeypatch.setattr(pool, "POOL_BYTES", 8 * B * 12)  # about one parameter at a time
    reduced = []
    original = pool.reduce_pool
    monkeypatch.setattr(pool, "reduce_pool", lambda held: reduced.append(1) or original(held))
    col = _collect(params, forms, pooling=True, stats=(BATCH_L2,))
    assert len(reduced) >= 3
    for i, g in enumerate(dense):
        _close(col.results[BATCH_L2.identity][i], (g.reshape(B, -1) ** 2).sum(1))


def test_large_parameters_and_transforms_without_a_pooled_form_are_not_pooled(monkeypatch):
    params, dense, forms = _problem()
    held = []
    original = pool.reduce_pool
    monkeypatch.setattr(pool, "reduce_pool", lambda p: held.append(list(p.indices)) or original(p))
    plain = per_sample_transform("cubes_plain", _cubes, reduce="sum")
    _collect(params, forms, pooling=True, stats=(BATCH_L2, plain))
    assert held == []  # one statistic cannot be pooled: no parameter is
    monkeypatch.setattr(pool, "MEMBER_BYTES", 8 * B * 5)  # only the (5,) parameters fit
    col = _collect(params, forms, pooling=True, stats=(BATCH_L2,))
    assert sorted(i for group in held for i in group) == [1, 4]
    for i, g in enumerate(dense):
        _close(col.results[BATCH_L2.identity][i], (g.reshape(B, -1) ** 2).sum(1))


def test_a_failing_pooled_form_loses_only_its_statistic():
    params, dense, forms = _problem()

    def broken(p: PooledGrads) -> torch.Tensor:
        raise SystemExit("pooled form broke")

    failing = per_sample_transform("broken", _cubes, reduce="sum", pooled_fn=broken)
    col = _collect(params, forms, pooling=True, stats=(BATCH_L2, failing))
    assert "pooled form broke" in col.missing[failing.identity]
    assert BATCH_L2.identity not in col.missing
    for i, g in enumerate(dense):
        _close(col.results[BATCH_L2.identity][i], (g.reshape(B, -1) ** 2).sum(1))


def test_failing_pooled_directions_lose_only_their_statistic():
    params, dense, forms = _problem()

    def broken(grads: torch.Tensor, params: tuple[torch.Tensor, ...]) -> torch.Tensor:
        raise ValueError("pooled directions broke")

    failing = per_sample_projection("broken", _three, pooled_directions=broken)
    col = _collect(params, forms, pooling=True, stats=(BATCH_L2, failing))
    assert "pooled directions broke" in col.missing[failing.identity]
    for i, g in enumerate(dense):
        _close(col.results[BATCH_L2.identity][i], (g.reshape(B, -1) ** 2).sum(1))


def test_received_reduces_what_is_held():
    """A provider asking ``received`` inside its ``collect`` sees pooled parameters' values."""
    params, _, forms = _problem()
    col = _collection(params, (BATCH_L2,), pooling=True)
    col.deliver(0, forms[0]())
    assert BATCH_L2.identity not in col.results  # held
    assert col.received(BATCH_L2, 0)


@pytest.mark.parametrize("pooled", [True, False])
def test_deferred_projections_keep_each_parameter_alone(pooled, monkeypatch):
    """Without the final gradient (DDP, accumulation) a projection is not pooled."""
    params, _, forms = _problem()
    col = _collect(params, forms, pooling=pooled, stats=(BATCH_PROJECTION,), eager=False)
    values = col.results[BATCH_PROJECTION.identity]
    assert all(not isinstance(v, torch.Tensor) for v in values)  # deferred compact forms


def test_deferred_projections_stay_compact_while_the_rest_is_pooled(monkeypatch):
    """Under DDP or accumulation: norms pooled, projections kept for after backward."""
    params, dense, forms = _problem()
    held = []
    original = pool.reduce_pool
    monkeypatch.setattr(pool, "reduce_pool", lambda p: held.append(list(p.indices)) or original(p))
    col = _collect(params, forms, pooling=True, stats=(BATCH_L2, BATCH_PROJECTION), eager=False)
    assert sorted(i for group in held for i in group) == list(range(len(params)))
    gen = torch.Generator().manual_seed(3)
    for i, (p, g) in enumerate(zip(params, dense)):
        _close(col.results[BATCH_L2.identity][i], (g.reshape(B, -1) ** 2).sum(1))
        deferred = col.results[BATCH_PROJECTION.identity][i]
        if isinstance(deferred, OuterProductGrads):  # no [B, *shape] tensor kept alive
            assert deferred._materialized is None and deferred._blocks is None
        final = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        projected = project(BATCH_PROJECTION, deferred, final, p)
        _close(projected, g.reshape(B, -1) @ final.reshape(-1))
