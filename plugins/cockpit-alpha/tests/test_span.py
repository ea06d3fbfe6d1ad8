"""The batched span fit of alpha's end point against a per-layer float64 least-squares loop."""

from __future__ import annotations

import pytest
import torch
from cockpit_alpha import _span
from cockpit_alpha._span import StartGroup, fit_updates_in_span, same_shape_groups, stack

BATCH = 5


def _layers(seed: int, shapes, in_span: bool):
    """Start-point basis, projections, sums of squares, end parameters and gradients.

    The projections are formed in float64 from the basis (also for the float32 layer), so
    the fitted slopes do not depend on how a parallel pair of directions is merged.
    """
    gen = torch.Generator().manual_seed(seed)
    basis, proj, sum_sq, params, end_grads = [], [], [], [], []
    for i, (shape, dtype) in enumerate(shapes):
        g, theta, direction = (torch.randn(shape, generator=gen, dtype=dtype) for _ in range(3))
        if i == 1:  # plain SGD: the predicted update is parallel to the gradient
            direction = -0.1 * g
        per_sample = torch.randn(BATCH, *shape, generator=gen, dtype=torch.float64)
        rows = torch.stack([g, theta, direction]).reshape(3, -1).double()
        proj.append(per_sample.reshape(BATCH, -1) @ rows.T)
        sum_sq.append((per_sample**2).sum(0).to(dtype))
        update = -0.01 * g + 0.002 * direction
        if not in_span and i != 1:
            update = update + 1e-3 * torch.randn(shape, generator=gen, dtype=dtype)
        if i == 2:  # a layer that did not move
            update = torch.zeros(shape, dtype=dtype)
        basis.append((g, theta, direction))
        params.append(theta + update)
        end_grads.append(torch.randn(shape, generator=gen, dtype=dtype))
    return basis, proj, sum_sq, params, end_grads


def _fit(basis, proj, sum_sq, params, end_grads, rtol):
    """The fit on the layers stacked by groups of same-shaped parameters, as alpha keeps them."""
    grad, theta, direction = zip(*basis)
    groups = [
        StartGroup(
            indices,
            theta=stack(theta, indices),
            grad=stack(grad, indices),
            direction=[direction[i] for i in indices],
            sum_sq=[sum_sq[i] for i in indices],
        )
        for indices in same_shape_groups(params)
    ]
    order = [i for group in groups for i in group.indices]
    return fit_updates_in_span(groups, stack(proj, order), params, end_grads, BATCH, rtol)


def _reference(basis, proj, sum_sq, params, end_grads, rtol):
    """The documented rule, layer by layer in float64 with ``torch.linalg.lstsq``."""
    in_span = torch.zeros(BATCH, dtype=torch.float64)
    diagonal, exact = 0.0, True
    step_sq = start_dot = end_dot = 0.0
    for (g, theta, direction), p, ps, sq, ge in zip(basis, params, proj, sum_sq, end_grads):
        d = (p.double() - theta.double()).reshape(-1)
        step_sq += float(d @ d)
        start_dot += float(g.double().reshape(-1) @ d)
        end_dot += float(ge.double().reshape(-1) @ d)
        if float(d.norm()) == 0.0:
            continue
        rows = torch.stack([g, theta, direction]).reshape(3, -1).double()
        coeff = torch.linalg.lstsq(rows.T, d[:, None], rcond=1e-6, driver="gelsd").solution[:, 0]
        residual = d - coeff @ rows
        in_span += ps.double() @ coeff
        rounding = torch.finfo(p.dtype).eps * float(p.double().norm())
        if float(residual.norm()) > rtol * float(d.norm()) + rounding:
            exact = False
            gd = g.double().reshape(-1)
            var = ((sq.double().reshape(-1) - BATCH * gd * gd) / (BATCH - 1)).clamp(min=0.0)
            diagonal += float((residual**2 * var).sum())
    return in_span, diagonal, exact, step_sq, start_dot, end_dot


F64, F32 = torch.float64, torch.float32
SHAPES = [
    ((7, 3), F64),
    ((4,), F64),  # parallel pair
    ((7, 3), F64),  # did not move
    ((5, 2), F64),
    ((4,), F64),
    ((7, 3), F32),  # same shape, another dtype: another group
    ((6,), F64),
    ((3, 3, 2), F64),
    ((7, 3), F64),
    ((4,), F64),
]


@pytest.mark.parametrize("in_span", [True, False])
# one chunk per group, all kept; chunks of two (7, 3) layers, the first kept; of one
# (7, 3) or five (4,) layers, each formed again for the residuals
@pytest.mark.parametrize("group_elements", [1 << 21, 45, 20])
def test_equals_a_per_layer_least_squares_loop(monkeypatch, in_span, group_elements):
    monkeypatch.setattr(_span, "GROUP_ELEMENTS", group_elements)
    layers = _layers(0, SHAPES, in_span)
    fit = _fit(*layers, rtol=1e-6)
    ref = _reference(*layers, rtol=1e-6)
    # float64 sums over a few dozen entries, two solvers of the same least-squares problem
    torch.testing.assert_close(fit.in_span, ref[0], rtol=1e-9, atol=1e-12)
    assert fit.diagonal == pytest.approx(ref[1], rel=1e-9, abs=1e-15)
    assert fit.exact is ref[2] is in_span
    assert (fit.step_sq, fit.start_dot, fit.end_dot) == pytest.approx(ref[3:], rel=1e-12)


def test_no_update_at_all():
    layers = list(_layers(1, SHAPES, True))
    layers[3] = [theta for _, theta, _ in layers[0]]  # parameters unchanged
    fit = _fit(*layers, rtol=1e-6)
    assert fit.step_sq == 0.0 and fit.exact and fit.diagonal == 0.0
    assert torch.equal(fit.in_span, torch.zeros(BATCH, dtype=torch.float64))
