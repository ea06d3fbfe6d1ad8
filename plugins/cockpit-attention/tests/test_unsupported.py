"""Setups the probe cannot read record why; models without attention give an empty value."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from cockpit_core import Cockpit


class HiddenAttention(nn.Module):
    """Attention whose softmax is written out by hand (no call the probe reads)."""

    def __init__(self, d: int = 4):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):  # noqa: D102
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        e = torch.exp(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))
        return (e / e.sum(-1, keepdim=True)) @ v


def _train(model, quantities, make_loss, steps=3):
    cp = Cockpit(model, quantities)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        loss = make_loss()
        losses.append(float(loss.detach()))
        with cp(step, loss=loss):
            loss.backward()
        opt.step()
        opt.zero_grad()
    return cp, losses


def test_a_hidden_attention_kernel_records_why_and_training_goes_on():
    torch.manual_seed(0)
    model = nn.Sequential(HiddenAttention(), nn.Linear(4, 2)).double()
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    with pytest.warns(UserWarning, match="attention module"):
        cp, losses = _train(model, ["attention", "loss"], lambda: model(x).square().mean())
    assert [e["step"] for e in cp.errors] == [0, 1, 2]
    for error in cp.errors:
        assert error["quantity"] == "attention"
        assert "UnsupportedModelError" in error["error"]
        assert "'0'" in error["error"] and "attn_implementation='sdpa'" in error["error"]
    out = cp.get_output()
    assert all("loss" in out[s] and "attention" not in out[s] for s in range(3))
    assert losses[2] < losses[0]  # training went on
    assert torch._C._len_torch_function_stack() == 0
    # leaving the module out with `names` makes the step's value the (empty) rest
    cp, _ = _train(
        model, [{"name": "attention", "names": ["1"]}], lambda: model(x).square().mean(), 1
    )
    assert not cp.errors and cp.get_output()[0]["attention"]["modules"] == []


def test_multihead_attention_with_extra_key_bias_is_refused_with_the_reason():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(4, 2, batch_first=True, add_bias_kv=True).double()
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    with pytest.warns(UserWarning, match="add_bias_kv"):
        cp, _ = _train(mha, ["attention"], lambda: mha(x, x, x)[0].square().mean(), 2)
    assert len(cp.errors) == 2
    assert "add_bias_kv=True is not supported" in cp.errors[0]["error"]
    assert "at the model" in cp.errors[0]["error"]


def test_a_model_without_attention_gives_an_empty_value():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    x = torch.randn(6, 4, dtype=torch.float64)
    cp, _ = _train(model, ["attention"], lambda: model(x).square().mean(), 2)
    assert not cp.errors
    value = cp.get_output()[1]["attention"]
    assert value["modules"] == value["heads"] == value["max_logit"] == value["entropy"] == []
    assert math.isnan(value["max"]) and math.isnan(value["min_entropy"])
    assert value["sampled"] is None


def test_without_the_model_the_reason_is_recorded():
    torch.manual_seed(0)
    model = nn.MultiheadAttention(4, 2, batch_first=True).double()
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    with pytest.warns(UserWarning):
        cp = Cockpit(model.parameters(), ["attention"])
    loss = model(x, x, x)[0].square().mean()
    with pytest.warns(UserWarning, match="give it the model"):
        with cp(0, loss=loss):
            loss.backward()
    (error,) = cp.errors
    assert "cp.attach(model)" in error["error"]


def test_forward_passes_without_gradients_are_not_read():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(4, 2, batch_first=True).double()
    cp = Cockpit(mha, ["attention"])
    x, other = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(5, 7, 4).double()
    with torch.no_grad():
        mha(other, other, other)  # evaluation: another batch shape, not read
    loss = mha(x, x, x)[0].square().mean()
    with cp(0, loss=loss):
        loss.backward()
    with torch.no_grad():
        mha(other, other, other)
    value = cp.get_output()[0]["attention"]
    assert value["modules"] == [""] and not cp.errors
    # the same training pass alone: the passes under no_grad added nothing to the value
    cp2 = Cockpit(mha, ["attention"])
    loss = mha(x, x, x)[0].square().mean()
    with cp2(0, loss=loss):
        loss.backward()
    assert cp2.get_output()[0]["attention"]["entropy"] == value["entropy"]
