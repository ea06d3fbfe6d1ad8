"""``nn.MultiheadAttention`` (standalone and in encoder layers) against a per-sample loop."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

B, T, S, E = 3, 4, 5, 6


def _causal(t: int) -> torch.Tensor:
    return torch.triu(torch.full((t, t), float("-inf"), dtype=torch.float64), diagonal=1)


class Attend(nn.Module):
    """``mha`` on inputs built from ``x`` (``[B, T, E]``) and ``ctx`` (``[B, S, E]``).

    ``mode``: ``"self"`` (query, key and value are one tensor), ``"kv"`` (cross-attention,
    key is value), ``"cross"`` (three different tensors).
    """

    def __init__(self, mha: nn.MultiheadAttention, mode: str = "self", **call):
        super().__init__()
        self.mha, self.mode, self.call = mha, mode, call
        self.kdim, self.vdim = mha.kdim, mha.vdim

    def forward(self, x, ctx):
        first = self.mha.batch_first or x.dim() == 2
        if not first:
            x, ctx = x.transpose(0, 1), ctx.transpose(0, 1)
        if self.mode == "self":
            q = k = v = x
        elif self.mode == "kv":
            q, k = x, ctx[..., : self.kdim]
            v = k
        else:
            q, k, v = x, ctx[..., : self.kdim], torch.tanh(ctx[..., : self.vdim])
        out, weights = self.mha(q, k, v, **self.call)
        if not first:
            out = out.transpose(0, 1)
        self.weights = weights
        return out


def _losses(out: torch.Tensor) -> torch.Tensor:
    if out.dim() == 2:  # unbatched: one sample
        out = out.unsqueeze(0)
    return (torch.sin(out) ** 2 + 0.3 * out).flatten(1).sum(1)


def _data(b: int = B, ctx_dim: int = E, unbatched: bool = False):
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(b, T, E, generator=gen, dtype=torch.float64) for _ in range(2)]
    cs = [torch.randn(b, S, ctx_dim, generator=gen, dtype=torch.float64) for _ in range(2)]
    if unbatched:
        xs, cs = [x[0] for x in xs], [c[0] for c in cs]
    return xs, cs


def _mha(**options) -> nn.MultiheadAttention:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, 2, **options).double()
    for p in mha.parameters():  # biases start at zero
        p.data.normal_(0, 0.5)
    return mha


_PADDING = torch.tensor([[False] * S, [False, False, True, False, True], [True] + [False] * 4])
_CASES = {
    "self": ({}, "self", {}),
    "self-seq-first": ({"batch_first": False}, "self", {}),
    "self-weights": ({}, "self", {"need_weights": True, "average_attn_weights": False}),
    "self-no-bias": ({"bias": False}, "self", {"need_weights": False}),
    "causal-mask": (
        {},
        "self",
        {"attn_mask": _causal(T), "is_causal": True, "need_weights": False},
    ),
    "causal-mask-weights": ({}, "self", {"attn_mask": _causal(T), "is_causal": True}),
    "bool-mask-seq-first": (
        {"batch_first": False},
        "self",
        {"attn_mask": torch.rand(T, T, generator=torch.Generator().manual_seed(3)) > 0.7},
    ),
    "kv": ({}, "kv", {}),
    "kv-padding": ({}, "kv", {"key_padding_mask": _PADDING, "need_weights": False}),
    "cross": ({}, "cross", {"need_weights": False}),
    "cross-seq-first-padding": (
        {"batch_first": False},
        "cross",
        {
            "key_padding_mask": torch.zeros(B, S, dtype=torch.float64).masked_fill(_PADDING, -1e9),
            "attn_mask": torch.randn(B * 2, T, S, dtype=torch.float64),
        },
    ),
    "kdim-vdim": ({"kdim": 4, "vdim": 5}, "cross", {}),
    "kdim-vdim-no-bias-seq-first": (
        {"kdim": 4, "vdim": 3, "bias": False, "batch_first": False},
        "cross",
        {"need_weights": False},
    ),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_attention_every_kind(h, case):
    options, mode, call = _CASES[case]
    batch_first = options.pop("batch_first", True)
    mha = _mha(batch_first=batch_first, **options)
    xs, cs = _data()
    model = Attend(mha, mode, **call)
    r = h.run(model, lambda m, s: _losses(m(xs[s], cs[s])), steps=2)
    h.check(r, "attention")


@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_unbatched(h, need_weights):
    xs, cs = _data(unbatched=True)
    model = Attend(_mha(), "cross", need_weights=need_weights)
    r = h.run(model, lambda m, s: _losses(m(xs[s], cs[s])), steps=2)
    h.check(r, "attention")


@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_dropout_matches_the_loop_under_the_same_seed(h, need_weights):
    """Dropout in attention: the rule draws the same mask as PyTorch (same RNG calls)."""
    xs, cs = _data()
    model = Attend(_mha(dropout=0.3), "kv", need_weights=need_weights)
    r = h.run(model, lambda m, s: _losses(m(xs[s], cs[s])), steps=2)
    h.check(r, "attention")


@pytest.mark.parametrize("case", ["self-weights", "causal-mask", "cross-seq-first-padding", "kv"])
def test_recomputed_attention_equals_pytorch(h, case):
    """With the hooks armed, outputs, attention weights and ``p.grad`` equal PyTorch's own."""
    from cockpit_core import Cockpit

    options, mode, call = copy.deepcopy(_CASES[case])
    batch_first = options.pop("batch_first", True)
    model = Attend(_mha(batch_first=batch_first, dropout=0.2, **options), mode, **call)
    plain = copy.deepcopy(model)
    cp = Cockpit(model.named_parameters(), [h.recorder([h.BATCH_L2])], backend="hooks")
    cp.attach(model)
    xs, cs = _data()
    torch.manual_seed(7)
    out = model(xs[0], cs[0])
    torch.manual_seed(7)
    expected = plain(xs[0], cs[0])
    assert (out - expected).abs().max() <= 1e-12
    if model.weights is not None:
        assert (model.weights - plain.weights).abs().max() <= 1e-12
    loss = _losses(out).mean()
    with cp(0, info={"loss": loss, "batch_size": B}):
        loss.backward()
    _losses(expected).mean().backward()
    for p, q in zip(model.parameters(), plain.parameters()):
        assert (p.grad - q.grad).abs().max() <= 1e-12
    assert cp.quantities[0].missing[0] == {}
    cp.close()


class Encoder(nn.Module):
    """A pre-norm encoder layer with GELU, and a linear head on the mean over positions."""

    def __init__(self, batch_first: bool, dropout: float = 0.0):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            E, 2, 8, dropout=dropout, activation="gelu", batch_first=batch_first, norm_first=True
        )
        self.head = nn.Linear(E, 2)
        self.batch_first = batch_first

    def forward(self, x):
        if not self.batch_first:
            x = x.transpose(0, 1)
        y = self.layer(x, src_mask=_causal(T), is_causal=True)
        return self.head(y.mean(1 if self.batch_first else 0))


def _head_losses(out: torch.Tensor, targets=None) -> torch.Tensor:
    return (torch.sin(out) ** 2 + 0.3 * out).sum(1)


def test_encoder_layer_batch_first(h):
    torch.manual_seed(0)
    xs, _ = _data()
    model = Encoder(batch_first=True, dropout=0.1).double()
    r = h.run(model, lambda m, s: _head_losses(m(xs[s])), steps=2)
    h.check(r, "attention (encoder)")


def test_encoder_layer_sequence_first_is_reported_and_routed(h):
    """batch_first=False: the layer's Linear/LayerNorm get [T, B, d]; hooks must not serve them."""
    torch.manual_seed(0)
    xs, _ = _data()
    model = Encoder(batch_first=False).double()
    cp = h.Cockpit(model.named_parameters(), [h.recorder([h.BATCH_L2])], backend="hooks")
    report = str(cp.check(model))
    assert "with batch_first=False its input is [T, B, ...] (sequence first)" in report
    assert "build the layer with batch_first=True" in report
    cp.close()
    stats = [h.BATCH_L2, h.BATCH_PROJECTION]
    r = h.run(
        model,
        lambda m, s: _head_losses(m(xs[s])),
        stats,
        backend="auto",
        loss_fn=_head_losses,
        inputs=xs,
    )
    h.check(r, "attention (encoder)", stats)
    routes = {p.names: p.served for p in r.cockpit.check(model).params}
    by_name = {n: served for names, served in routes.items() for n in names}
    assert by_name["layer.self_attn.in_proj_weight"] == "hooks"
    assert by_name["layer.linear1.weight"] == "func"
    assert by_name["layer.norm1.weight"] == "func"


def test_cross_attention_projections_stay_factored(h, monkeypatch):
    """Query rows and key/value rows of the packed weight: no ``[B, 3E, E]`` for norms."""
    from cockpit_core import OuterProductGrads

    def forbidden(self):
        raise AssertionError("materialized")

    monkeypatch.setattr(OuterProductGrads, "materialize", forbidden)
    monkeypatch.setattr("cockpit_core.statistics.per_sample.BLOCK_BYTES", 1)  # blocks of one
    stats = [h.BATCH_L2, h.SUM_GRAD_SQUARED, h.BATCH_PROJECTION, h.PROJECTION, h.CUBES]
    xs, cs = _data()
    for mode in ("kv", "cross"):
        model = Attend(_mha(), mode, need_weights=False)
        r = h.run(model, lambda m, s: _losses(m(xs[s], cs[s])), stats)
        h.check(r, "attention", stats)


def test_attention_module_used_twice(h):
    """Self-attention, then cross-attention with the same module: one weight, two uses."""

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = _mha(batch_first=True)

        def forward(self, x, ctx):
            y = self.mha(x, x, x, need_weights=False)[0]
            return self.mha(torch.tanh(y), ctx, ctx)[0]

    xs, cs = _data()
    r = h.run(Twice(), lambda m, s: _losses(m(xs[s], cs[s])), steps=2)
    h.check(r, "attention")
