"""Exact values against the brute-force definition, for every way attention is called."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from cockpit_core import Cockpit
from cockpit_core.testing.models import NanoGPT

from ._reference import assert_layer, attention_reference, causal, heads


def _one_step(model: nn.Module, forward, quantity="attention") -> dict:
    """A tracked step of ``model`` (``forward()`` returns the loss); the attention value."""
    cp = Cockpit(model, [quantity])
    loss = forward()
    with cp(0, loss=loss):
        loss.backward()
    assert not cp.errors, cp.errors
    return cp.get_output()[0]["attention"]


# -- nanoGPT: F.scaled_dot_product_attention(q, k, v, is_causal=True) ---------------------


def nanogpt_reference(model: NanoGPT, idx: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each block's q and k recomputed by hand from the residual stream, no hooks."""
    out = []
    with torch.no_grad():
        t = idx.shape[1]
        tr = model.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(t))
        for block in tr.h:
            attn = block.attn
            q, k, _ = attn.c_attn(block.ln_1(x)).split(attn.d, dim=2)
            q, k = heads(q, attn.heads), heads(k, attn.heads)
            out.append(attention_reference(q, k, 1 / math.sqrt(q.shape[-1]), causal(t)))
            x = block(x)
    return out


def test_nanogpt_in_a_training_loop():
    torch.manual_seed(0)
    model = NanoGPT(vocab=40, block_size=16, d=24, heads=3, layers=2).double()
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    cp = Cockpit(model, [{"name": "attention", "every": 2}])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(0)
    expected = {}
    for step in range(5):
        idx = torch.randint(0, 40, (3, 10), generator=gen)
        if step % 2:  # untracked: nothing of cockpit's on the model
            assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.transformer.h)
        else:
            expected[step] = nanogpt_reference(model, idx)
        before = len(calls)
        loss = model(idx, idx)[1]
        with cp(step, loss=loss):
            loss.backward()
        assert len(calls) == before + 1  # the model ran once in the step
        opt.step()
        opt.zero_grad()
    assert not cp.errors
    out = cp.get_output()
    assert sorted(out) == [0, 2, 4]
    for step, layers in expected.items():
        value = out[step]["attention"]
        assert value["modules"] == ["transformer.h.0.attn", "transformer.h.1.attn"]
        assert value["sampled"] is None
        assert value["entropy_se"] == [[0.0] * 3] * 2
        for layer, ref in enumerate(layers):
            assert_layer(value, layer, ref)
        assert value["max"] == max(max(r[0]) for r in layers)
        assert value["min_entropy"] == pytest.approx(min(min(r[1]) for r in layers), rel=1e-12)
        assert 0 < value["min_entropy"] < math.log(10)


def test_without_entropy_only_the_max_logit_is_taken():
    torch.manual_seed(0)
    model = NanoGPT(vocab=40, block_size=16, d=24, heads=3, layers=2).double()
    idx = torch.randint(0, 40, (3, 10), generator=torch.Generator().manual_seed(0))
    layers = nanogpt_reference(model, idx)
    value = _one_step(model, lambda: model(idx, idx)[1], {"name": "attention", "entropy": False})
    for layer, (max_logit, _) in enumerate(layers):
        np.testing.assert_allclose(value["max_logit"][layer], max_logit, rtol=1e-12)
        assert np.isnan(value["entropy"][layer]).all()
        assert np.isnan(value["entropy_se"][layer]).all()
    assert value["max"] == max(max(r[0]) for r in layers)
    assert math.isnan(value["min_entropy"])


# -- nn.MultiheadAttention: F.multi_head_attention_forward ------------------------------------


class MHAModel(nn.Module):
    """One ``nn.MultiheadAttention`` (batch first) and a loss-friendly output."""

    def __init__(self, embed: int = 6, count: int = 3, kdim: int | None = None):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed, count, batch_first=True, kdim=kdim, vdim=kdim)

    def forward(self, x, y=None, **kwargs):  # noqa: D102
        y = x if y is None else y
        return self.attn(x, y, y, **kwargs)[0]


def mha_reference(mha: nn.MultiheadAttention, x, y, allowed=None, bias=None):
    """Projections by hand from the module's weights."""
    e, count = mha.embed_dim, mha.num_heads
    if mha._qkv_same_embed_dim:
        w_q, w_k = mha.in_proj_weight[:e], mha.in_proj_weight[e : 2 * e]
    else:
        w_q, w_k = mha.q_proj_weight, mha.k_proj_weight
    q = x @ w_q.T + mha.in_proj_bias[:e]
    k = y @ w_k.T + mha.in_proj_bias[e : 2 * e]
    return attention_reference(
        heads(q, count), heads(k, count), 1 / math.sqrt(e // count), allowed, bias
    )


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("mask", ["padding", "padding_float", "causal", "additive", "cross"])
def test_multihead_attention(need_weights, mask):
    torch.manual_seed(1)
    cross = mask == "cross"
    model = MHAModel(kdim=5 if cross else None).double()
    b, t, s = 3, 5, 4 if cross else 5
    x = torch.randn(b, t, 6, dtype=torch.float64)
    y = torch.randn(b, s, 5, dtype=torch.float64) if cross else x
    pad = torch.zeros(b, s, dtype=torch.bool)
    pad[0, -2:] = pad[2, -1] = True  # True: padding, masked out
    kwargs: dict = {"need_weights": need_weights}
    allowed = bias = None
    if mask in ("padding", "cross"):
        kwargs["key_padding_mask"] = pad
        allowed = ~pad[:, None, None, :]
    elif mask == "padding_float":
        kwargs["key_padding_mask"] = torch.zeros(b, s).masked_fill(pad, -math.inf).double()
        allowed = ~pad[:, None, None, :]
    elif mask == "causal":
        kwargs["attn_mask"] = ~causal(t)  # True: masked out
        kwargs["is_causal"] = True
        allowed = causal(t)
    else:
        bias = torch.randn(t, s, dtype=torch.float64)
        bias[0, 1] = -math.inf
        kwargs["attn_mask"] = bias
    value = _one_step(model, lambda: model(x, None if not cross else y, **kwargs).square().sum())
    with torch.no_grad():
        ref = mha_reference(model.attn, x, y, allowed, bias)
    assert value["modules"] == ["attn"]
    assert_layer(value, 0, ref)


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_computed_by_the_module_hook_provider(need_weights):
    pytest.importorskip("cockpit_hooks")  # its rule computes the module's attention itself
    torch.manual_seed(1)
    model = MHAModel().double()
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, -2:] = True
    cp = Cockpit(model, ["attention", "norm_test"], backend="hooks")
    loss = model(x, key_padding_mask=pad, need_weights=need_weights).square().mean()
    with cp(0, loss=loss):
        loss.backward()
    assert not cp.errors, cp.errors
    value = cp.get_output()[0]
    assert "norm_test" in value  # the provider ran
    with torch.no_grad():
        ref = mha_reference(model.attn, x, x, ~pad[:, None, None, :])
    assert value["attention"]["modules"] == ["attn"]
    assert_layer(value["attention"], 0, ref)


def test_transformer_encoder_layer_with_padding():
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(6, 2, 12, dropout=0.0, batch_first=True).double()
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    pad = torch.tensor([[False, False, False, True], [False, False, False, False]])
    value = _one_step(layer, lambda: layer(x, src_key_padding_mask=pad).square().sum())
    with torch.no_grad():
        ref = mha_reference(layer.self_attn, x, x, ~pad[:, None, None, :])
    assert value["modules"] == ["self_attn"]
    assert_layer(value, 0, ref)


# -- direct calls of F.scaled_dot_product_attention ----------------------------------------


class Direct(nn.Module):
    """``F.scaled_dot_product_attention`` on given queries, keys and values, times a gain."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.ones((), dtype=torch.float64))

    def forward(self, q, k, v, **kwargs):  # noqa: D102
        return self.gain * F.scaled_dot_product_attention(q, k, v, **kwargs)


def _leaves(*shapes):
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(*s, dtype=torch.float64, generator=gen).requires_grad_() for s in shapes]


@pytest.mark.parametrize(
    "case",
    ["bool", "additive", "scale", "gqa", "causal_rect", "three_d", "one_key_head", "broadcast"],
)
def test_sdpa_arguments(case):
    b, h, t, s, e = 2, 4, 5, 6, 3
    q, k, v = _leaves((b, h, t, e), (b, h, s, e), (b, h, s, e))
    kwargs: dict = {}
    allowed = bias = None
    scale = 1 / math.sqrt(e)
    ref_k = k
    if case == "bool":
        keep = torch.rand(b, 1, t, s, generator=torch.Generator().manual_seed(4)) > 0.3
        keep[..., 0] = True  # every query sees a key
        kwargs["attn_mask"] = allowed = keep
    elif case == "additive":
        bias = torch.randn(t, s, dtype=torch.float64)
        bias[1, 2] = bias[3, 0] = -math.inf
        kwargs["attn_mask"] = bias
    elif case == "scale":
        kwargs["scale"] = scale = 0.37
        kwargs["is_causal"] = True
        allowed = causal(t, s)
    elif case in ("gqa", "one_key_head"):
        groups = 2 if case == "gqa" else 1
        k, v = _leaves((b, groups, s, e), (b, groups, s, e))
        kwargs["enable_gqa"] = True
        ref_k = k.repeat_interleave(h // groups, dim=1)
    elif case == "causal_rect":  # L != S: top-left aligned
        kwargs["is_causal"] = True
        allowed = causal(t, s)
    elif case == "broadcast":  # one query set for every sample and head
        (q,) = _leaves((1, 1, t, e))
    ref_q = q.expand(b, h, t, e)
    model = Direct()
    if case == "three_d":
        q3, k3, v3 = (x.detach().flatten(0, 1).requires_grad_() for x in (q, k, v))
        value = _one_step(model, lambda: model(q3, k3, v3).square().sum())
        ref = attention_reference(q3[:, None], k3[:, None], scale)
        assert value["heads"] == [1]
        np.testing.assert_allclose(value["max_logit"][0], [ref[0].max()], rtol=1e-12)
        np.testing.assert_allclose(value["entropy"][0], [ref[1].mean()], rtol=1e-12)
        return
    value = _one_step(model, lambda: model(q, k, v, **kwargs).square().sum())
    assert value["modules"] == [""]
    assert_layer(value, 0, attention_reference(ref_q, ref_k, scale, allowed, bias))


# -- transformers' GPT-2, attn_implementation "sdpa" and "eager" ----------------------------


def _gpt2(implementation: str):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(5)
    config = transformers.GPT2Config(
        vocab_size=40,
        n_positions=16,
        n_embd=24,
        n_layer=2,
        n_head=3,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation=implementation,
    )
    return transformers.GPT2LMHeadModel(config).double()


class _Spy(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.sdpa = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.sdpa += func is F.scaled_dot_product_attention
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("padding", [True, False])
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_gpt2(implementation, padding):
    model = _gpt2(implementation)
    assert model.config._attn_implementation == implementation
    idx = torch.randint(0, 40, (3, 7), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(3, 7, dtype=torch.long)
    if padding:  # right padding: every query sees a real token
        mask[1, 5:] = mask[2, 6:] = 0
    captured = []
    handles = [
        block.attn.register_forward_pre_hook(
            lambda m, a, kw: captured.append(a[0] if a else kw["hidden_states"]),
            with_kwargs=True,
        )
        for block in model.transformer.h
    ]
    with torch.no_grad(), _Spy() as spy:
        model(input_ids=idx, attention_mask=mask)
    for handle in handles:
        handle.remove()
    assert (spy.sdpa > 0) == (implementation == "sdpa")
    value = _one_step(model, lambda: model(input_ids=idx, attention_mask=mask, labels=idx).loss)
    assert value["modules"] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    allowed = causal(7)[None, None] & mask.bool()[:, None, None, :]
    for layer, (block, hidden) in enumerate(zip(model.transformer.h, captured)):
        q, k, _ = block.attn.c_attn(hidden).split(24, dim=2)
        ref = attention_reference(heads(q, 3), heads(k, 3), 1 / math.sqrt(8), allowed)
        assert_layer(value, layer, ref)
