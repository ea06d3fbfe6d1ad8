"""Two BackPACK contexts around one backward pass: the inner one's statistics say why not."""

from __future__ import annotations

import pytest
from backpack import backpack
from backpack.extensions import DiagGGNExact

from cockpit_core import Cockpit
from cockpit_core.testing import tiny_mlp


def test_a_cockpit_inside_another_backpack_context_records_why():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.named_parameters(), ["grad_norm", "norm_test"], on_error="warn")
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y)
    with backpack(DiagGGNExact()):  # the user's own context around the Cockpit's
        with cp(0, info={"loss": loss, "batch_size": len(x)}):
            loss.backward()
    out = cp.get_output()[0]
    expected = float(sum(p.grad.pow(2).sum() for p in model.parameters()) ** 0.5)
    assert out["grad_norm"]["total"] == pytest.approx(expected, rel=1e-12)
    (error,) = cp.errors
    assert error["quantity"] == "norm_test"
    assert "another BackPACK context is active around this backward pass" in error["error"]
    assert all(hasattr(p, "diag_ggn_exact") for p in model.parameters())  # the user's
