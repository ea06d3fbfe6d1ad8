"""The typed per-sample gradients against their materialized tensors (float64).

Every operation of a factored form (norms, sums of squares, Gram matrix, projections, mean,
blocks) must equal the same operation on ``[B, *shape]`` formed by definition; small block
budgets force several blocks. Tolerance 1e-10 relative: float64 sums of a few hundred terms
round near 1e-15, a wrong formula is off by O(1).
"""

from __future__ import annotations

import pytest
import torch

from cockpit_core import DenseGrads, EmbeddingGrads, OuterProductGrads
from cockpit_core.statistics import per_sample

TOL = 1e-10


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    scale = max(float(expected.abs().max()), 1e-300)
    assert float((actual - expected).abs().max()) / scale <= TOL


def _check_all(grads, dense: torch.Tensor) -> None:
    """Every operation of ``grads`` against :class:`DenseGrads` of ``dense``."""
    ref = DenseGrads(dense)
    gen = torch.Generator().manual_seed(5)
    vectors = torch.randn(3, *dense.shape[1:], generator=gen, dtype=dense.dtype)
    _close(grads.batch_l2(), ref.batch_l2())
    _close(grads.sum_grad_squared(), ref.sum_grad_squared())
    _close(grads.batch_dot(), ref.batch_dot())
    _close(grads.dot(vectors), ref.dot(vectors))
    _close(grads.dot(vectors[:1]), ref.dot(vectors[:1]))  # one direction: its own contraction
    _close(grads.mean(), dense.mean(0))
    _close(torch.cat(list(grads.blocks())), dense)
    _close(grads.materialize(), dense)


def _outer(shape_a, n_out, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(*shape_a, generator=gen, dtype=torch.float64)
    d = torch.randn(*shape_a[:-1], n_out, generator=gen, dtype=torch.float64)
    flat_a = a.reshape(a.shape[0], -1, a.shape[-1])
    flat_d = d.reshape(d.shape[0], -1, n_out)
    dense = torch.stack([flat_d[n].T @ flat_a[n] for n in range(a.shape[0])])
    return a, d, dense


@pytest.mark.parametrize(
    ("shape_a", "n_out", "closed"),
    [
        ((4, 6), 5, {"batch_l2", "sum_grad_squared", "batch_dot", "dot"}),
        ((4, 9, 3), 2, {"dot"}),  # long sequence, small layer: from g_n
        ((3, 2, 12), 10, {"batch_l2", "batch_dot", "dot"}),  # short sequence: Gram forms
        ((4, 2, 3, 5), 4, {"dot"}),  # two leading axes
    ],
)
def test_outer_product_forms(shape_a, n_out, closed, monkeypatch):
    a, d, dense = _outer(shape_a, n_out)
    grads = OuterProductGrads(a, d)
    assert set(grads.closed_forms) == closed
    monkeypatch.setattr(per_sample, "BLOCK_BYTES", 8 * dense[0].numel())  # one sample a block
    assert len(list(grads.blocks())) == a.shape[0]
    _check_all(grads, dense)


def test_outer_product_gram_forms_in_blocks(monkeypatch):
    """The Gram forms of norms and of the Gram matrix, a few samples at a time."""
    a, d, dense = _outer((7, 3, 20), 16, seed=1)
    monkeypatch.setattr(per_sample, "BLOCK_BYTES", 2 * 3 * 3 * 8 * 2)  # two samples a block
    grads = OuterProductGrads(a, d)
    assert {"batch_l2", "batch_dot"} <= grads.closed_forms

    def forbidden(self, *args, **kwargs):
        raise AssertionError("formed g_n")

    monkeypatch.setattr(OuterProductGrads, "materialize", forbidden)
    monkeypatch.setattr(OuterProductGrads, "blocks", forbidden)
    ref = DenseGrads(dense)
    _close(grads.batch_l2(), ref.batch_l2())
    _close(grads.batch_dot(), ref.batch_dot())


def test_outer_product_gram_matrix_cost_choice():
    """The Gram matrix's Gram form is chosen only when it beats forming ``g_n``."""
    a, d, _ = _outer((32, 64, 256), 256)  # norms: Gram form; Gram matrix: 10x costlier
    grads = OuterProductGrads(a, d)
    assert "batch_l2" in grads.closed_forms and "batch_dot" not in grads.closed_forms


def _embedding(batch, seq, vocab, dim, padding_idx=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (batch, seq), generator=gen)
    d = torch.randn(batch, seq, dim, generator=gen, dtype=torch.float64)
    dense = torch.zeros(batch, vocab, dim, dtype=torch.float64)
    for n in range(batch):
        for t in range(seq):
            if idx[n, t] != padding_idx:
                dense[n, idx[n, t]] += d[n, t]
    return idx, d, dense


@pytest.mark.parametrize("padding_idx", [None, 1])
def test_embedding_forms(padding_idx, monkeypatch):
    idx, d, dense = _embedding(5, 7, 4, 3, padding_idx)  # many repeated indices
    monkeypatch.setattr(per_sample, "BLOCK_BYTES", 2 * 3 * 8 * 5)  # pairs in several blocks
    grads = EmbeddingGrads(idx, d, 4, padding_idx)
    _check_all(grads, dense)


def test_embedding_without_rows():
    """Every index is the padding row: all statistics are zero."""
    idx = torch.zeros(3, 2, dtype=torch.long)
    d = torch.randn(3, 2, 4, dtype=torch.float64)
    grads = EmbeddingGrads(idx, d, 5, padding_idx=0)
    _check_all(grads, torch.zeros(3, 5, 4, dtype=torch.float64))
