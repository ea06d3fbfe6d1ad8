"""``logits``: log Z, max logit and z-loss against torch.logsumexp of the model's output."""

from __future__ import annotations

import cockpit_activations.logits as logits_module
import pytest
import torch
from cockpit_activations import Logits
from cockpit_activations.logits import reduce_logits
from torch import nn

from cockpit_core import Cockpit
from cockpit_core.testing.models import NanoGPT

VOCAB, T = 40, 8


def _tokens(seed: int, batch: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, T), generator=gen)


def _reference(logits: torch.Tensor, coef: float = 1e-4) -> dict[str, float]:
    """The definitions in float64 on the whole logits tensor."""
    z = logits.detach().double()
    log_z = torch.logsumexp(z, dim=-1)
    return {
        "log_z_mean": float(log_z.mean()),
        "log_z_max": float(log_z.max()),
        "max_logit": float(z.max()),
        "z_loss": float(coef * log_z.square().mean()),
    }


def _nanogpt() -> NanoGPT:
    torch.manual_seed(0)
    model = NanoGPT(vocab=VOCAB).double()
    with torch.no_grad():  # logits of several units, so that log Z is not just log(vocab)
        model.lm_head.weight.mul_(20)
    return model


def test_nanogpt_tuple_output_over_steps():
    model = _nanogpt()
    cp = Cockpit(model, ["logits", {"name": "logits", "label": "strong", "coef": 0.5}])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = {}
    for step in range(3):
        idx = _tokens(step)
        with torch.no_grad():
            logits = model(idx)[0]  # the separate pass of the reference
        expected[step] = (_reference(logits), _reference(logits, coef=0.5))
        loss = model(idx, idx.roll(-1, dims=1))[1]
        with cp(step, loss=loss):
            loss.backward()
        opt.step()
        opt.zero_grad()
    out = cp.get_output()
    assert not cp.errors
    for step, (ref, strong) in expected.items():
        assert out[step]["logits"] == pytest.approx(ref, rel=1e-10, abs=0)
        assert out[step]["strong"] == pytest.approx(strong, rel=1e-10, abs=0)
        assert all(type(v) is float for v in out[step]["logits"].values())
        assert ref["log_z_max"] > ref["log_z_mean"] > 0


def test_tiny_gpt2_model_output_logits():
    pytest.importorskip("transformers", reason="the tiny GPT-2 needs transformers")
    from cockpit_core.testing.models import tiny_gpt2

    model = tiny_gpt2(vocab=VOCAB).double()
    cp = Cockpit(model, ["logits"])
    idx = _tokens(7)
    with torch.no_grad():
        ref = _reference(model(input_ids=idx).logits)
    out = model(input_ids=idx, labels=idx)  # with labels the ModelOutput's first item is the loss
    with cp(0, loss=out.loss):
        out.loss.backward()
    assert not cp.errors
    assert cp.get_output()[0]["logits"] == pytest.approx(ref, rel=1e-10, abs=0)


def test_micro_batches_are_combined_over_all_positions():
    model = _nanogpt()
    cp = Cockpit(model, ["logits"])
    first, second = _tokens(1, batch=2), _tokens(2, batch=5)
    with torch.no_grad():
        ref = _reference(torch.cat([model(first)[0], model(second)[0]]))
    with cp(0, accumulate=True) as run:
        for idx in (first, second):
            loss = model(idx, idx)[1] / 2
            run.micro_batch(loss=loss)
            loss.backward()
    assert not cp.errors
    assert cp.get_output()[0]["logits"] == pytest.approx(ref, rel=1e-10, abs=0)


def test_low_precision_logits_are_reduced_in_float32_chunks(monkeypatch):
    monkeypatch.setattr(logits_module, "CHUNK_ELEMENTS", 100)  # 2 rows of 40 per chunk
    gen = torch.Generator().manual_seed(0)
    z = (8 * torch.randn(3, 7, VOCAB, generator=gen)).to(torch.bfloat16)
    call = reduce_logits((z, None))
    ref = _reference(z)
    total, _, log_z_max, max_logit = call.stats.tolist()
    assert call.positions == 21 and call.stats.dtype == torch.float64
    assert total / 21 == pytest.approx(ref["log_z_mean"], rel=1e-6)
    assert log_z_max == pytest.approx(ref["log_z_max"], rel=1e-6)
    assert max_logit == ref["max_logit"]  # exact: the largest bfloat16 value itself


def test_a_classifier_output_and_logits_without_classes():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5)).double()
    x = torch.randn(9, 4, dtype=torch.float64)
    with torch.no_grad():
        ref = _reference(model(x))
    cp = Cockpit(model, ["logits"])
    loss = nn.functional.cross_entropy(model(x), torch.arange(9) % 5)
    with cp(0, loss=loss):
        loss.backward()
    assert cp.get_output()[0]["logits"] == pytest.approx(ref, rel=1e-10, abs=0)

    scalar = nn.Sequential(nn.Linear(4, 1), nn.Flatten(0))  # [B] -> each sample one "class"
    scalar = nn.Sequential(scalar, SumAll())
    cp = Cockpit(scalar, ["logits"])
    loss = scalar(x.float())
    with pytest.warns(UserWarning, match="no classes"):
        with cp(0, loss=loss):
            loss.backward()
    (error,) = cp.errors
    assert "logits" in error["quantity"] and "no classes to normalize over" in error["error"]


class SumAll(nn.Module):
    """A model that returns a scalar: no logits."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return x.sum()


def test_the_probe_is_shared_by_every_logits_quantity():
    assert Logits().probe.key == Logits(coef=1.0, label="b").probe.key
