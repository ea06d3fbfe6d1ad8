"""Sampled queries: unbiased entropy, a standard error that matches the spread, a max below."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cockpit_attention import Attention
from cockpit_attention.attention import summarize
from cockpit_attention.calls import SDPA
from cockpit_attention.reduction import Scores, reduce_scores

from cockpit_core import Cockpit, FunctionCall
from cockpit_core.testing.models import NanoGPT

from ._reference import attention_reference, causal

B, H, T, E = 3, 2, 48, 4


def _inputs():
    gen = torch.Generator().manual_seed(0)
    q = 2.0 * torch.randn(B, H, T, E, dtype=torch.float64, generator=gen)
    k = torch.randn(B, H, T, E, dtype=torch.float64, generator=gen)
    return q, k, torch.randn(B, H, T, E, dtype=torch.float64, generator=gen)


def _value(seed: int, q, k, v, queries: int = 6) -> dict:
    """The quantity's value for one causal SDPA call, sampled with ``seed``."""
    quantity = Attention(max_elements=1000, queries=queries, seed=seed)
    call = FunctionCall(SDPA, (q, k, v), {"is_causal": True})
    found = quantity.probe.reduce(torch.nn.Identity(), call, None)
    assert found is not None
    return summarize({"attn": [found]})


def test_sampled_entropy_is_unbiased_with_a_matching_standard_error():
    q, k, v = _inputs()
    exact_max, exact_entropy = attention_reference(q, k, 1 / math.sqrt(E), causal(T))
    seeds = 300
    values = [_value(seed, q, k, v) for seed in range(seeds)]
    assert all(v["sampled"] == 6 for v in values)
    entropy = np.array([v["entropy"][0] for v in values])  # [seeds, H]
    se = np.array([v["entropy_se"][0] for v in values])
    top = np.array([v["max_logit"][0] for v in values])
    spread = entropy.std(axis=0, ddof=1)
    # unbiased: the mean over seeds is within 3 standard errors of the exact value
    assert np.all(np.abs(entropy.mean(0) - exact_entropy) <= 3 * spread / math.sqrt(seeds))
    # the reported standard error is the spread over seeds (root mean square: within 20%)
    reported = np.sqrt((se**2).mean(0))
    np.testing.assert_allclose(reported, spread, rtol=0.2)
    assert np.all(spread > 0.01)  # the sampling noise is there to be measured
    # the max over sampled queries bounds the exact max from below, and reaches it at times
    assert np.all(top <= exact_max + 1e-12)
    assert np.any(np.isclose(top, exact_max, rtol=1e-12), axis=0).all()
    assert np.all(top.mean(0) < exact_max)


def test_within_max_elements_every_query_is_used():
    q, k, v = _inputs()
    quantity = Attention(max_elements=B * H * T * T, queries=6)
    found = quantity.probe.reduce(
        torch.nn.Identity(), FunctionCall(SDPA, (q, k, v), {"is_causal": True}), None
    )
    value = summarize({"attn": [found]})
    ref = attention_reference(q, k, 1 / math.sqrt(E), causal(T))
    assert value["sampled"] is None and value["entropy_se"] == [[0.0, 0.0]]
    np.testing.assert_allclose(value["max_logit"][0], ref[0], rtol=1e-12)
    np.testing.assert_allclose(value["entropy"][0], ref[1], rtol=1e-12)


def _generator(seed: int):
    gens: dict = {}

    def get(device):
        return gens.setdefault(device, torch.Generator(device=device).manual_seed(seed))

    return get


@pytest.mark.parametrize("max_elements", [10**9, 1000])
@pytest.mark.parametrize("chunk", [7, 60, 500])
def test_chunks_do_not_change_the_result(max_elements, chunk):
    q, k, _ = _inputs()
    keep = torch.rand(B, 1, T, T, generator=torch.Generator().manual_seed(1)) > 0.4
    keep[..., 0] = True
    bias = torch.randn(1, H, T, T, dtype=torch.float64)
    scores = Scores(q=q, k=k[:, :1], scale=0.4, allowed=keep, bias=bias, causal=True)
    whole = reduce_scores(scores, max_elements, 6, _generator(3))
    pieces = reduce_scores(scores, max_elements, 6, _generator(3), chunk=chunk)
    assert whole.sampled == pieces.sampled == (None if max_elements > 10**6 else 6)
    torch.testing.assert_close(pieces.stats, whole.stats, rtol=1e-12, atol=1e-12)


def _variants() -> dict[str, Scores]:
    """Calls of every shape the entropy-free path takes: masks, GQA, scales, dtypes, logits."""
    q, k, _ = _inputs()
    gen = torch.Generator().manual_seed(2)
    keep = torch.rand(B, 1, T, T, generator=gen) > 0.4
    keep[..., 0] = True
    bias = torch.randn(1, H, T, T, dtype=torch.float64, generator=gen)
    bias[..., 3] = -torch.inf
    bias[..., 5] = torch.finfo(torch.float64).min
    logits = (q @ k.transpose(-1, -2)).masked_fill(~keep, -torch.inf)
    k_inf = k.clone()
    k_inf[:, :, -1, 0] = torch.inf  # +-inf logits, masked for every query but the last
    k_inf[0, 0, -2, 1] = torch.nan
    return {
        "nonfinite": Scores(q=q, k=k_inf, scale=0.4, causal=True),
        "causal": Scores(q=q, k=k, scale=0.4, causal=True),
        "plain": Scores(q=q, k=k, scale=1.0 / math.sqrt(E)),
        "masks": Scores(q=q, k=k[:, :1], scale=0.4, allowed=keep, bias=bias, causal=True),
        "negative_scale": Scores(q=q, k=k, scale=-0.3, causal=True),
        "float32": Scores(q=q.float(), k=k.float(), scale=0.4, bias=bias.float(), causal=True),
        "logits": Scores(logits=logits),
    }


@pytest.mark.parametrize("variant", sorted(_variants()))
@pytest.mark.parametrize(("max_elements", "chunk"), [(10**9, 2**22), (10**9, 60), (1000, 7)])
def test_without_entropy_the_max_logit_is_the_same_to_the_last_bit(variant, max_elements, chunk):
    scores = _variants()[variant]
    full = reduce_scores(scores, max_elements, 6, _generator(3), chunk=chunk)
    lean = reduce_scores(scores, max_elements, 6, _generator(3), chunk=chunk, entropy=False)
    assert lean.sampled == full.sampled
    # the scale folded in, the masks applied otherwise: exactly the same numbers
    np.testing.assert_array_equal(lean.stats[0].numpy(), full.stats[0].numpy())
    assert lean.stats.shape == full.stats.shape and not lean.stats[1:].any()
    if lean.sampled is None and variant in ("causal", "masks", "float32"):  # the definition
        assert scores.q is not None and scores.k is not None
        allowed = causal(T) if scores.allowed is None else causal(T) & scores.allowed
        if scores.bias is not None:  # finfo.min stands for -inf
            allowed = allowed & (scores.bias > torch.finfo(scores.bias.dtype).min / 2)
        k = scores.k.expand(B, H, T, E)
        expected, _ = attention_reference(scores.q, k, scores.scale, allowed)
        np.testing.assert_allclose(lean.stats[0].numpy(), expected, rtol=1e-6)  # float32: 1e-7


def test_a_sampled_run_in_training():
    torch.manual_seed(0)
    model = NanoGPT(vocab=40, block_size=32, d=16, heads=2, layers=2).double()
    cp = Cockpit(model, [{"name": "attention", "max_elements": 500, "queries": 4, "seed": 1}])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.randint(0, 40, (2, 24), generator=torch.Generator().manual_seed(2))
    exact = []
    for step in range(2):
        with torch.no_grad():  # the exact max, from all queries' logits
            seen = []
            handles = [
                b.attn.register_forward_hook(lambda m, a, o, seen=seen: seen.append(a[0]))
                for b in model.transformer.h
            ]
            model(idx)
            for handle in handles:
                handle.remove()
            tops = []
            for block, x in zip(model.transformer.h, seen):
                q, k, _ = block.attn.c_attn(x).split(16, dim=2)  # x: the attention's input
                q = q.view(2, 24, 2, 8).transpose(1, 2)
                k = k.view(2, 24, 2, 8).transpose(1, 2)
                logits = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(
                    ~causal(24), -math.inf
                )
                tops.append(logits.amax((0, 2, 3)).numpy())
            exact.append(tops)
        loss = model(idx, idx)[1]
        with cp(step, loss=loss):
            loss.backward()
        opt.step()
        opt.zero_grad()
    assert not cp.errors
    out = cp.get_output()
    for step in range(2):
        value = out[step]["attention"]
        assert value["sampled"] == 4
        assert all(se > 0 for layer in value["entropy_se"] for se in layer)
        for layer in range(2):
            assert np.all(np.asarray(value["max_logit"][layer]) <= exact[step][layer] + 1e-12)
