"""Tied weights, tensors broadcast into the batch, functional calls and the generic rule.

Every statistic kind (``h.ALL_STATS``: norms, sums of squares, Gram matrices, per-sample
gradients, projections, transforms) against the per-sample autograd loop in float64, on
small models that use each pattern the way model code does.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

B, T, V, D = 4, 5, 9, 6


def _losses(out: torch.Tensor) -> torch.Tensor:
    return (torch.sin(out) ** 2 + 0.3 * out).flatten(1).sum(1)


def _ids(step: int, batch: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(step))


def _x(step: int, *shape: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


class TiedLM(nn.Module):
    """Embedding tied to the head, positions looked up once (``[T]``, ``[1, T]`` or a view)."""

    def __init__(self, positions: str = "arange"):
        super().__init__()
        self.wte = nn.Embedding(V, D, padding_idx=0)
        self.wpe = nn.Embedding(T, D)
        self.mix = nn.Linear(D, D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.wte.weight
        self.positions = positions

    def forward(self, idx):
        t = idx.shape[1]
        if self.positions == "arange":  # [T, D], broadcast over the batch by rank
            pos = self.wpe(torch.arange(t))
        elif self.positions == "row":  # [1, T, D]
            pos = self.wpe(torch.arange(t).unsqueeze(0))
        else:  # a view of [T, D] before the broadcast
            pos = self.wpe(torch.arange(t)).unsqueeze(0).to(torch.float64)
        x = self.wte(idx) + pos
        return self.head(torch.tanh(self.mix(x)))


@pytest.mark.parametrize("positions", ["arange", "row", "view"])
def test_tied_embedding_and_broadcast_positions(h, positions):
    torch.manual_seed(0)
    r = h.run(TiedLM(positions).double(), lambda m, s: _losses(m(_ids(s))), steps=2)
    h.check(r, "tied + broadcast positions")
    r.cockpit.close()


def test_positions_when_the_sequence_is_as_long_as_the_batch(h):
    """``wpe(arange(T))`` is ``[T, D]``: with ``T == B`` it looks batched, but is broadcast."""
    torch.manual_seed(0)
    r = h.run(TiedLM("arange").double(), lambda m, s: _losses(m(_ids(s, B, B))), steps=2)
    h.check(r, "tied + broadcast positions")
    r.cockpit.close()


class BareParameters(nn.Module):
    """A ViT-style ``cls`` token and position table, a layer scale, an in-place addition."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, D)
        self.cls = nn.Parameter(torch.randn(1, 1, D))
        self.pos = nn.Parameter(torch.randn(1, T + 1, D))
        self.scale = nn.Parameter(torch.rand(D) + 0.5)
        self.shift = nn.Parameter(torch.randn(D))
        self.head = nn.Linear(D, 2)

    def forward(self, x):
        x = self.proj(x)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.pos
        x = torch.tanh(x) * self.scale
        x += self.shift
        return self.head(x[:, 0] + x.mean(1))


def test_bare_parameters_broadcast_into_the_batch(h):
    torch.manual_seed(0)
    r = h.run(BareParameters().double(), lambda m, s: _losses(m(_x(s, B, T, 3))), steps=2)
    h.check(r, "bare parameters")
    how = {n: r.cockpit._router.providers["hooks"].describe(s) for n, s in _slots(r)}
    assert how["cls"] == "captured where broadcast into the batch (TensorBase.expand)"
    assert "TensorBase.__iadd__" in how["shift"] or "TensorBase.add_" in how["shift"]
    r.cockpit.close()


class SlicedParameters(nn.Module):
    """Position tables longer than the sequence, cut to it: ``pos[:, :T]``, ``narrow``, a row."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, D)
        self.pos = nn.Parameter(torch.randn(1, T + 3, D))
        self.table = nn.Parameter(torch.randn(T + 2, D))
        self.rows = nn.Parameter(torch.randn(4, D))
        self.head = nn.Linear(D, 2)

    def forward(self, x):
        t = x.shape[1]
        x = self.proj(x) + self.pos[:, :t]
        x = torch.tanh(x) * self.table.narrow(0, 1, t)
        x = x + self.rows[2] + self.rows[-1, None]
        return self.head(torch.sin(x).mean(1))


def test_parameters_cut_to_the_sequence_then_broadcast(h):
    torch.manual_seed(0)
    r = h.run(SlicedParameters().double(), lambda m, s: _losses(m(_x(s, B, T, 3))), steps=2)
    h.check(r, "sliced bare parameters")
    how = {n: r.cockpit._router.providers["hooks"].describe(s) for n, s in _slots(r)}
    for name in ("pos", "table", "rows"):
        assert how[name].startswith("captured where broadcast into the batch"), how[name]
    r.cockpit.close()


class RelativeBias(nn.Module):
    """A Swin-style relative position bias (a table gathered by an index, viewed, permuted)
    added to attention logits, and a transposed bare table broadcast into the batch."""

    def __init__(self, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qk = nn.Linear(3, 2 * heads * 3)
        self.table = nn.Parameter(torch.randn(2 * T - 1, heads))
        offsets = torch.arange(T)[:, None] - torch.arange(T)[None, :] + T - 1
        self.register_buffer("index", offsets)  # [T, T], each row of the table used often
        self.pos_t = nn.Parameter(torch.randn(T, T))
        self.head = nn.Linear(T, 2)

    def forward(self, x):
        b, t, _ = x.shape
        q, k = self.qk(x).view(b, t, 2, self.heads, 3).unbind(2)
        logits = q.transpose(1, 2) @ k.permute(0, 2, 3, 1)  # [B, H, T, T]
        bias = self.table[self.index.view(-1)].view(t, t, self.heads).permute(2, 0, 1)
        attn = torch.softmax(logits + bias, dim=-1).sum(1)  # [B, T, T]
        return self.head(attn + self.pos_t.t())


def test_gathered_and_permuted_tables_broadcast_into_the_batch(h):
    torch.manual_seed(0)
    r = h.run(RelativeBias().double(), lambda m, s: _losses(m(_x(s, B, T, 3))), steps=2)
    h.check(r, "relative position bias")
    how = {n: r.cockpit._router.providers["hooks"].describe(s) for n, s in _slots(r)}
    for name in ("table", "pos_t"):
        assert how[name].startswith("captured where broadcast into the batch"), how[name]
    r.cockpit.close()


class T5Bias(nn.Module):
    """T5-style attention: a relative position bias looked up once (an ``nn.Embedding`` over
    ``[T, T]`` buckets), permuted, scaled, causally masked with ``torch.where`` and passed to
    ``scaled_dot_product_attention`` as ``attn_mask`` (broadcast over the batch inside)."""

    def __init__(self, heads: int = 2, causal: bool = True):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(3, 3 * heads * 4)
        self.bias = nn.Embedding(2 * T - 1, heads)
        self.out = nn.Linear(heads * 4, 2)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, 4).permute(2, 0, 3, 1, 4)
        buckets = torch.arange(t)[None, :] - torch.arange(t)[:, None] + t - 1
        bias = self.bias(buckets).permute([2, 0, 1]).unsqueeze(0) * 0.5 - 1.0  # [1, H, T, T]
        if self.causal:
            allowed = torch.ones(t, t, dtype=torch.bool).tril()
            bias = torch.where(allowed, bias, -1e4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # [B, H, T, 4]
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


@pytest.mark.parametrize("causal", [False, True])
def test_a_bias_masked_and_passed_to_attention_as_its_mask(h, causal):
    torch.manual_seed(0)
    model = T5Bias(causal=causal).double()
    r = h.run(model, lambda m, s: _losses(m(_x(s, B, T, 3))), steps=2)
    h.check(r, "attention mask bias")
    how = r.cockpit._router.providers["hooks"].describe(dict(_slots(r))["bias.weight"])
    assert "captured where broadcast into the batch" in how, how
    r.cockpit.close()


class ScaledEmbedding(nn.Embedding):
    """Gemma's word embedding: the looked-up rows times ``sqrt(dim)``."""

    def forward(self, ids):
        return super().forward(ids) * D**0.5


class PlainSubclass(nn.Embedding):
    """A subclass that keeps ``nn.Embedding``'s forward."""


class ScaledLM(nn.Module):
    """A scaled embedding tied to the output head, positions from a plain subclass."""

    def __init__(self):
        super().__init__()
        self.wte = ScaledEmbedding(V, D)
        self.wpe = PlainSubclass(T, D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        pos = self.wpe(torch.arange(idx.shape[1]).expand(idx.shape[0], -1))
        return self.head(torch.tanh(self.wte(idx) + pos))


def test_embedding_subclasses_tied_to_the_head(h):
    torch.manual_seed(0)
    r = h.run(ScaledLM().double(), lambda m, s: _losses(m(_ids(s))), steps=2)
    h.check(r, "tied + broadcast positions")
    how = {n: r.cockpit._router.providers["hooks"].describe(s) for n, s in _slots(r)}
    assert how["wte.weight"].startswith("Embedding + Linear rules (tied"), how["wte.weight"]
    assert how["wpe.weight"].startswith("Embedding rule"), how["wpe.weight"]
    r.cockpit.close()


def _slots(r):
    return [(slot.name, slot) for slot in r.cockpit._router.slots]


class MatmulParameter(nn.Module):
    """A parameter the model multiplies as a matrix: no broadcast to capture."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 2))
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x @ self.w)


def test_a_parameter_used_as_a_matrix_is_reported_then_served_by_torch_func(h):
    torch.manual_seed(0)
    xs = [_x(s, B, 3) for s in range(2)]
    r = h.run(MatmulParameter().double(), lambda m, s: _losses(m(xs[s])), [h.BATCH_L2])
    text = r.missing(0)[h.BATCH_L2.identity]
    assert "'w' (MatmulParameter): MatmulParameter.forward uses its parameter 'w' in" in text
    assert "matmul" in text and "torch.func" in text
    r.cockpit.close()
    with pytest.warns(Warning, match="the 'func' provider recomputed them"):
        r = h.run(
            MatmulParameter().double(),
            lambda m, s: _losses(m(xs[s])),
            backend="auto",
            loss_fn=_losses,
            inputs=xs,
            steps=2,
        )
    h.check(r, "bare parameters")
    r.cockpit.close()


class OwnNorm(nn.Module):
    """nanoGPT's LayerNorm class: ``F.layer_norm`` with its own weight and bias."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(D) + 0.5)
        self.bias = nn.Parameter(torch.randn(D))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class OwnRMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(D) + 0.5)

    def forward(self, x):
        return F.rms_norm(x, (D,), self.weight, 1e-6)


class OwnLinear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) / n_in**0.5)
        self.bias = nn.Parameter(torch.randn(n_out))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + F.linear(x.flip(1), self.weight)


class OwnEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(V, D))

    def forward(self, idx):
        return F.embedding(idx, self.table, padding_idx=-1)


class Functionals(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = OwnEmbedding()
        self.norm = OwnNorm()
        self.rms = OwnRMSNorm()
        self.lin = OwnLinear(D, 3)

    def forward(self, idx):
        return self.lin(self.rms(torch.tanh(self.norm(self.embed(idx)))))


def test_own_modules_calling_functionals(h):
    torch.manual_seed(0)
    r = h.run(Functionals().double(), lambda m, s: _losses(m(_ids(s))), steps=2)
    h.check(r, "functional calls")
    how = {n: r.cockpit._router.providers["hooks"].describe(s) for n, s in _slots(r)}
    assert how["embed.table"] == "functional rule (F.embedding)"
    assert how["norm.bias"] == "functional rule (F.layer_norm)"
    assert how["rms.weight"] == "functional rule (F.rms_norm)"
    assert how["lin.weight"] == "functional rule (F.linear)"
    r.cockpit.close()


class Generic(nn.Module):
    """Modules without a dedicated rule: PReLU, Bilinear, a grouped convolution."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, groups=2, padding=1)
        self.act = nn.PReLU(4)
        self.bilinear = nn.Bilinear(4, 4, 3)

    def forward(self, x):
        h = self.act(self.conv(x)).mean(-1)
        return self.bilinear(h, torch.cos(h))


def test_generic_rule(h):
    torch.manual_seed(0)
    r = h.run(Generic().double(), lambda m, s: _losses(m(_x(s, B, 4, T))), steps=2)
    h.check(r, "generic rule")
    how = {n: r.cockpit._router.providers["hooks"].describe(s) for n, s in _slots(r)}
    assert how["conv.weight"] == "generic rule (vmap of Conv1d's vjp)"
    assert how["act.weight"] == "generic rule (vmap of PReLU's vjp)"
    r.cockpit.close()


class NoisyLeaf(nn.Module):
    """A leaf module that draws random numbers in its forward: a re-run would differ."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D, 3))

    def forward(self, x):
        return torch.matmul(F.dropout(x, 0.5, training=True), self.weight)


def test_generic_rule_refuses_random_modules(h):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, D), NoisyLeaf()).double()
    r = h.run(model, lambda m, s: _losses(m(_x(s, B, 3))), [h.BATCH_L2], on_error="warn")
    text = r.missing(0)[h.BATCH_L2.identity]
    assert "'1.weight' (NoisyLeaf)" in text and "random" in text.lower()
    assert "'0.weight'" not in text  # the Linear layer is served
    r.cockpit.close()


def _bn_model(train: bool) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    return model.double().train(train)


def test_batchnorm_in_eval_mode_is_served(h):
    r = h.run(_bn_model(False), lambda m, s: _losses(m(_x(s, B, 3))), steps=2)
    h.check(r, "batchnorm (eval)")
    r.cockpit.close()


def test_batchnorm_in_training_mode_is_refused_at_each_step(h):
    r = h.run(_bn_model(True), lambda m, s: _losses(m(_x(s, B, 3))), [h.BATCH_L2])
    text = r.missing(0)[h.BATCH_L2.identity]
    assert "'1.weight' (BatchNorm1d)" in text
    assert "in training mode BatchNorm normalizes with the statistics of the batch" in text
    assert "model.eval()" in text
    r.cockpit.close()
