"""``torch.compile``: exact statistics, no recompilation by cockpit, Hessian products work.

While a tracked forward pass is coming, cockpit runs compiled code eagerly
(``torch.compiler.set_stance("force_eager")``, :mod:`cockpit_core.engine.compiled`), so hooks,
``TorchFunctionMode``s and double backward see the model's own Python code; untracked
steps run the compiled graph with no hook installed. The checks: the statistics of a
compiled nanoGPT equal those of the same model uncompiled (same float64 arithmetic, same
batches), alternating tracked and untracked steps compiles the model once, Hessian-vector
products run, and ``retain_graph=cp.retain_graph(step)`` never breaks a compiled backward.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cockpit_core import Cockpit
from cockpit_core.testing.models import NanoGPT

torch_dynamo = pytest.importorskip("torch._dynamo")

B, T, V = 4, 8, 40
QUANTITIES = [
    {"name": "norm_test", "every": 2},
    {"name": "mean_gsnr", "every": 2},
    {"name": "grad_norm", "every": 2},
    {"name": "hess_max_ev", "every": 2, "tol": 1e-6},
]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return NanoGPT(vocab=V, block_size=16, d=16, layers=1).double()


def _losses(model: torch.nn.Module, step: int) -> torch.Tensor:
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(step))
    logits = model(ids)[0]
    shifted = F.cross_entropy(
        logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1), reduction="none"
    )
    return shifted.view(B, -1).mean(1)


@pytest.fixture(autouse=True)
def _no_other_cockpit():
    """Cockpits of earlier tests that were never closed withdraw their eager wish when collected."""
    gc.collect()
    assert torch_dynamo.eval_frame._stance.stance == "default"


def _train(compile_with: str | None, steps: int = 6) -> tuple[Cockpit, list[int]]:
    """Train; returns the Cockpit and the number of compiled graphs after each step."""
    torch_dynamo.reset()
    model = _model()
    forward = model if compile_with is None else torch.compile(model, backend=compile_with)
    cp = Cockpit(model, QUANTITIES, on_error="raise")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    graphs = []
    start = torch_dynamo.utils.counters["stats"]["unique_graphs"]
    for step in range(steps):
        opt.zero_grad()
        losses = _losses(forward, step)
        loss = losses.mean()
        info = {"loss": loss, "individual_losses": losses.detach(), "batch_size": B}
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
        graphs.append(torch_dynamo.utils.counters["stats"]["unique_graphs"] - start)
    cp.close()
    return cp, graphs


def _assert_same(out, expected) -> None:
    assert out.keys() == expected.keys()
    for step in expected:
        assert out[step].keys() == expected[step].keys(), step
        for key, value in expected[step].items():
            if key == "hess_max_ev":
                assert out[step][key]["converged"], out[step][key]
                np.testing.assert_allclose(out[step][key]["value"], value["value"], rtol=1e-5)
                continue
            for part in ("total", "per_param"):
                np.testing.assert_allclose(out[step][key][part], value[part], rtol=1e-6)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_model_equals_eager_and_compiles_once(backend):
    eager, _ = _train(None)
    compiled, graphs = _train(backend)
    assert not compiled.errors, compiled.errors[:1]
    _assert_same(compiled.get_output(), eager.get_output())
    assert sorted(compiled.get_output()) == [0, 2, 4]
    # the untracked steps 1, 3, 5 run the graph compiled at step 1; tracked steps add none
    assert graphs[0] == 0 and graphs[1] >= 1 and graphs[-1] == graphs[1], graphs


def test_compiled_code_runs_compiled_again_after_close():
    torch_dynamo.reset()
    model = _model()
    forward = torch.compile(model, backend="aot_eager")
    cp = Cockpit(model, ["norm_test"])
    stance = torch_dynamo.eval_frame._stance
    assert stance.stance == "force_eager"  # step 0 is tracked
    cp.close()
    assert torch_dynamo.eval_frame._stance.stance == "default"
    _losses(forward, 0)
    assert torch_dynamo.utils.counters["stats"]["unique_graphs"] >= 1


def test_an_unclosed_cockpit_gives_the_stance_back_when_collected():
    model = _model()
    torch.compile(model, backend="aot_eager")
    cp = Cockpit(model, ["norm_test"])
    assert torch_dynamo.eval_frame._stance.stance == "force_eager"
    del cp
    gc.collect()
    assert torch_dynamo.eval_frame._stance.stance == "default"


def test_a_compiled_model_is_tracked_under_its_own_names():
    torch_dynamo.reset()
    model = _model()
    compiled = torch.compile(model, backend="aot_eager")
    cp = Cockpit(compiled, ["norm_test"])
    assert cp.param_names == [n for n, _ in model.named_parameters()]
    assert not any("_orig_mod" in n for n in cp.param_names)
    assert cp._router.model is model
    cp.attach(compiled)
    assert cp._router.model is model
    cp.close()
