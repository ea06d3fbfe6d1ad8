"""``nn.Linear`` through a real Cockpit (``backend="hooks"``) against a per-sample loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

B = 5


def _loss(out: torch.Tensor) -> torch.Tensor:
    """A nonlinear per-sample loss, so that output gradients differ across positions."""
    return (torch.sin(out) ** 2 + 0.3 * out).flatten(1).sum(1)


class Head(nn.Module):
    """``lin`` on an input of the given shape, then the loss."""

    def __init__(self, n_in: int, n_out: int, bias: bool = True, inplace_relu: bool = False):
        super().__init__()
        self.lin = nn.Linear(n_in, n_out, bias=bias)
        self.act = nn.ReLU(inplace=True) if inplace_relu else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x))


def _make(*args, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    return Head(*args, **kwargs).double()


def _data(*shape: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize(
    ("lead", "n_in", "n_out"),
    [
        ((), 6, 4),  # [B, in]: closed forms from d and a
        ((8,), 6, 5),  # [B, T, in], T (in + out) > in out: factored, sums block-wise
        ((3,), 16, 12),  # [B, T, in], T (in + out) < in out: the T x T Gram form
        ((2, 3), 4, 3),  # [B, T1, T2, in]: leading axes flattened into T
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_every_kind(h, lead, n_in, n_out, bias):
    data = _data(B, *lead, n_in)
    r = h.run(_make(n_in, n_out, bias), lambda m, s: _loss(m(data[s])), steps=2)
    h.check(r, "linear")


def test_linear_inplace_activation_and_keyword_input(h):
    """An in-place ReLU on the output, and ``lin(input=x)``: the hooks see the right tensors."""
    data = _data(B, 4, 6)

    def losses(m, s):
        return _loss(m.act(m.lin(input=data[s])))

    r = h.run(_make(6, 3, inplace_relu=True), losses)
    h.check(r, "linear")


class Twice(nn.Module):
    """One ``nn.Linear`` used twice in a forward pass (shared within the module)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.other = nn.Linear(4, 4)

    def forward(self, x, seq):
        y = self.lin(torch.tanh(self.lin(x)))  # [B, 4] twice
        z = self.lin(seq).sum(1)  # and once more on [B, T, 4]
        self.other(x)  # an output that gets no gradient
        return y + z


def test_linear_used_twice_and_unused_output(h):
    torch.manual_seed(0)
    model = Twice().double()
    x, seq, _ = _data(B, 4)
    seqs = _data(B, 3, 4)
    r = h.run(model, lambda m, s: _loss(m(x + s, seqs[s])), steps=2)
    h.check(r, "linear (shared)", only=["lin.weight", "lin.bias"])
    for step in (0, 1):
        for stat_values in r.values(step).values():
            assert stat_values[r.names.index("other.weight")] is None  # no gradient, no value


class PartlyUnused(nn.Module):
    """A Linear whose first use's output is dropped: the statistics come at the end."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        self.lin(x * 2)
        return self.lin(x)


def test_linear_use_without_gradient(h):
    torch.manual_seed(0)
    data = _data(B, 3)
    r = h.run(PartlyUnused().double(), lambda m, s: _loss(m(data[s])))
    h.check(r, "linear (shared)")


def test_linear_closed_forms_do_not_materialize(h, monkeypatch):
    """Norms, Gram matrix, sums of squares and projections of a 2-D Linear need no ``[B, out, in]``."""
    from cockpit_core import OuterProductGrads

    def forbidden(self):
        raise AssertionError("materialized")

    monkeypatch.setattr(OuterProductGrads, "materialize", forbidden)
    stats = [s for s in h.ALL_STATS if str(s.kind) != "grad_batch" and s.fn is None] + [
        h.PROJECTION,
        h.DOTS,
    ]
    data = _data(B, 6)
    r = h.run(_make(6, 4), lambda m, s: _loss(m(data[s])), stats)
    h.check(r, "linear", stats)
    gram = _data(B, 3, 16)  # the Gram form for norms and the Gram matrix
    stats = [s for s in stats if str(s.kind) != "sum_grad_squared"]
    r = h.run(_make(16, 12), lambda m, s: _loss(m(gram[s])), stats)
    h.check(r, "linear", stats)


def test_linear_sequence_sums_go_block_wise(h, monkeypatch):
    """Sums of squares and element-wise transforms with a sequence axis: a block at a time."""
    from cockpit_core import OuterProductGrads

    blocks = []
    original = OuterProductGrads.blocks

    def counted(self, *args, **kwargs):
        for block in original(self, *args, **kwargs):
            blocks.append(block.shape[0])
            yield block

    def forbidden(self):
        raise AssertionError("materialized")

    monkeypatch.setattr(OuterProductGrads, "blocks", counted)
    monkeypatch.setattr(OuterProductGrads, "materialize", forbidden)
    monkeypatch.setattr("cockpit_core.statistics.per_sample.BLOCK_BYTES", 2 * 5 * 6 * 8)
    stats = [h.BATCH_L2, h.SUM_GRAD_SQUARED, h.CUBES, h.ABS_MAX, h.BATCH_PROJECTION]
    data = _data(B, 8, 6)
    r = h.run(_make(6, 5), lambda m, s: _loss(m(data[s])), stats)
    h.check(r, "linear", stats)
    assert blocks and max(blocks) == 2  # two samples per block, never the whole batch


class KeyBias(nn.Module):
    """Softmax attention with biased key projections: the key bias's gradient is exactly zero
    (softmax ignores a shift shared by all keys), so autograd and the hooks both give rounding
    noise, whose two summation orders differ by O(1) relative to each other (BERT)."""

    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(4, 4) for _ in range(3))
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        q, k, v = self.query(x), self.key(x), self.value(x)
        weights = torch.softmax(q @ k.transpose(1, 2), dim=-1)
        return self.out(weights @ v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_bias_whose_gradient_is_rounding_noise_is_served(h, dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 6, 4, dtype=dtype)
    r = h.run(KeyBias().to(dtype), lambda m, s: (m(x) ** 2).flatten(1).sum(1), steps=2)
    assert not r.missing(0) and not r.missing(1)  # the mean check accepts rounding noise
    noise = float(r.grads[0][r.names.index("key.bias")].norm())
    assert noise < 1e3 * torch.finfo(dtype).eps * float(r.grads[0][0].norm())
    if dtype == torch.float64:  # the other parameters' statistics stay exact
        h.check(r, "linear", only=[n for n in r.names if n != "key.bias"])
    r.cockpit.close()
