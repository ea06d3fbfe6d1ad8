"""``nn.Embedding`` and the normalization layers through a real Cockpit against a per-sample loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

B = 4


def _loss(out: torch.Tensor) -> torch.Tensor:
    return (torch.sin(out) ** 2 + 0.3 * out).flatten(1).sum(1)


class Lookup(nn.Module):
    """An embedding followed by a linear read-out (so that rows get distinct gradients)."""

    def __init__(self, **options):
        super().__init__()
        self.embed = nn.Embedding(7, 3, **options)
        self.out = nn.Linear(3, 2)

    def forward(self, idx):
        return self.out(torch.tanh(self.embed(idx)))


# sample 0 repeats index 2; index 0 is the padding row where one is set
_INDICES = [
    torch.tensor([[2, 2, 5], [0, 1, 2], [6, 6, 6], [3, 0, 4]]),
    torch.tensor([[1, 2, 1], [0, 0, 0], [5, 4, 6], [2, 3, 2]]),
]


@pytest.mark.parametrize(
    "options",
    [{}, {"padding_idx": 0}, {"max_norm": 1.0}, {"padding_idx": -1, "max_norm": 0.5}],
    ids=["plain", "padding_idx", "max_norm", "both"],
)
def test_embedding_every_kind(h, options):
    torch.manual_seed(0)
    model = Lookup(**options).double()
    r = h.run(model, lambda m, s: _loss(m(_INDICES[s])), steps=2)
    h.check(r, "embedding")


def test_embedding_one_index_per_sample(h):
    """Indices ``[B]`` (no sequence axis)."""
    torch.manual_seed(0)
    model = Lookup().double()
    idx = torch.tensor([3, 3, 0, 6])
    r = h.run(model, lambda m, s: _loss(m(idx)))
    h.check(r, "embedding")


def test_embedding_closed_forms_do_not_materialize(h, monkeypatch):
    from cockpit_core import EmbeddingGrads

    def forbidden(self, *args):
        raise AssertionError("materialized")

    monkeypatch.setattr(EmbeddingGrads, "materialize", forbidden)
    monkeypatch.setattr(EmbeddingGrads, "_dense", forbidden)
    stats = [h.BATCH_L2, h.SUM_GRAD_SQUARED, h.BATCH_DOT, h.BATCH_PROJECTION, h.PROJECTION, h.DOTS]
    torch.manual_seed(0)
    r = h.run(Lookup(padding_idx=2).double(), lambda m, s: _loss(m(_INDICES[s])), stats)
    h.check(r, "embedding", stats, only=["embed.weight"])


class Normed(nn.Module):
    """``norm`` between two linear layers, on inputs of shape ``[B, *shape]``."""

    def __init__(self, norm: nn.Module, features: int):
        super().__init__()
        self.norm = norm
        self.out = nn.Linear(features, 2)

    def forward(self, x):
        return self.out(self.norm(x))


_RMS = getattr(nn, "RMSNorm", None)
_NORMS = [
    ("layernorm", lambda: nn.LayerNorm(4), (3, 4)),
    ("layernorm-2d", lambda: nn.LayerNorm((3, 4)), (2, 3, 4)),
    ("layernorm-no-bias", lambda: nn.LayerNorm(4, bias=False), (3, 4)),
    ("layernorm-flat", lambda: nn.LayerNorm(4), (4,)),
    ("groupnorm-3d", lambda: nn.GroupNorm(2, 4), (4, 5)),
    ("groupnorm-4d", lambda: nn.GroupNorm(2, 4), (4, 3, 2)),
    ("groupnorm-one-group", lambda: nn.GroupNorm(1, 4, eps=1e-3), (4, 3)),
]
if _RMS is not None:
    _NORMS += [
        ("rmsnorm", lambda: _RMS(4), (3, 4)),
        ("rmsnorm-eps", lambda: _RMS((3, 4), eps=1e-2), (2, 3, 4)),
    ]


@pytest.mark.parametrize(("label", "make", "shape"), _NORMS, ids=[n[0] for n in _NORMS])
def test_norm_every_kind(h, label, make, shape):
    torch.manual_seed(0)
    norm = make()
    for p in norm.parameters():  # not the initial ones and zeros
        p.data.normal_()
    model = Normed(norm, shape[-1]).double()
    gen = torch.Generator().manual_seed(1)
    data = [3 * torch.randn(B, *shape, generator=gen, dtype=torch.float64) + 1 for _ in range(2)]
    r = h.run(model, lambda m, s: _loss(m(data[s])), steps=2)
    h.check(r, label.split("-")[0])


class SharedWithin(nn.Module):
    """An embedding and a LayerNorm each used twice in one forward pass."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(6, 4, padding_idx=5)
        self.norm = nn.LayerNorm(4)
        self.out = nn.Linear(4, 2)

    def forward(self, idx, other):
        x = self.norm(self.embed(idx)).sum(1) + self.norm(2 * self.embed(other))
        return self.out(torch.tanh(x))


def test_embedding_and_norm_used_twice(h):
    torch.manual_seed(0)
    model = SharedWithin().double()
    for p in model.norm.parameters():
        p.data.normal_()
    idx = [torch.tensor([[1, 5, 1], [0, 2, 2], [4, 4, 3], [5, 5, 0]]) for _ in range(2)]
    other = [torch.tensor([1, 3, 5, 4]), torch.tensor([0, 0, 2, 1])]
    r = h.run(model, lambda m, s: _loss(m(idx[s], other[s])), steps=2)
    h.check(r, "embedding")
