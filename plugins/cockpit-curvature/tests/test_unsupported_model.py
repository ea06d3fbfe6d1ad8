"""A model BackPACK's second-order extensions cannot handle (LayerNorm, GELU).

``diag_hessian`` gives a clear error and training goes on; the Hessian-vector-product
methods (``hutchinson``, ``hess_max_ev``) still work.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from cockpit_backpack import extend
from cockpit_curvature import HessMaxEV, HessTrace, TICDiag

from cockpit_core import CockpitWarning
from cockpit_core.testing import Problem, run_cockpit
from cockpit_core.testing.reference import explicit_hessian


def _layernorm_problem() -> Problem:
    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.GELU(), torch.nn.Linear(8, 3)
        )
        return extend(model.double())

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (64,), generator=gen)
    return Problem("layernorm-gelu", make, x, y, batch_size=8)


def _run(quantities, steps=3):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_cockpit(_layernorm_problem(), quantities, steps=steps)
    return result, [w for w in caught if issubclass(w.category, CockpitWarning)]


def test_diag_hessian_fails_clearly_and_training_continues():
    result, cockpit_warnings = _run(
        [HessTrace(), TICDiag(), HessTrace(method="diag_ggn_exact", label="ggn")]
    )
    errors = {(e["quantity"], e["step"]): e["error"] for e in result.cockpit.errors}
    assert set(errors) == {(q, s) for q in ("hess_trace", "tic_diag", "ggn") for s in range(3)}
    message = errors[("hess_trace", 0)]
    assert message.startswith(
        "UnsupportedModelError: BackPACK's DiagHessian does not support module GELU"
    )
    for name in ("'0.weight'", "'1.weight'", "'1.bias'"):  # the layers before the GELU
        assert name in message
    assert "'3.weight'" not in message  # the last layer got its diagonal
    assert "method='hutchinson'" in message  # what to do instead
    assert "DiagGGNExact does not support module GELU" in errors[("ggn", 0)]
    assert "hutchinson" in errors[("tic_diag", 0)]
    # one warning per quantity and error type, not one per step
    assert len(cockpit_warnings) == 3
    assert "training continues" in str(cockpit_warnings[0].message)
    # the user's backward pass was not disturbed: gradients and updates are exact
    problem = result.problem
    for step, snap in enumerate(result.snapshots):
        model = result.model_at(step)
        loss = problem.loss_module()(model(snap.x), snap.y)
        expected = torch.autograd.grad(loss, list(model.parameters()))
        for got, want in zip(snap.grads, expected):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
        assert not torch.equal(snap.params[0], snap.params_after[0])


def test_hutchinson_and_hess_max_ev_work_on_the_unsupported_model():
    probes = 400
    quantities = [HessTrace(method="hutchinson", probes=probes), HessMaxEV(tol=1e-8)]
    result, cockpit_warnings = _run(quantities, steps=2)
    assert not result.cockpit.errors and not cockpit_warnings
    for step in range(2):
        snap = result.snapshots[step]
        hessian = explicit_hessian(result.model_at(step), result.problem, snap.x, snap.y)
        trace = torch.trace(hessian).item()
        # Rademacher probes: Var[v^T H v] = 2 (||H||_F^2 - sum_i H_ii^2)
        variance = 2 * ((hessian**2).sum() - (torch.diagonal(hessian) ** 2).sum()).item()
        stderr = np.sqrt(variance / probes)
        assert abs(result.output[step]["hess_trace"]["total"] - trace) <= 4 * stderr
        top = torch.linalg.eigvalsh(hessian)[-1].item()
        np.testing.assert_allclose(result.output[step]["hess_max_ev"]["value"], top, rtol=1e-7)
