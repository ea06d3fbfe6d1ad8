"""The 1-D histogram of an embedding's per-sample gradients counts the untouched rows' zeros."""

import pytest
import torch
from cockpit_histograms._binning import hist1d_layer
from cockpit_histograms.grad_hist_1d import GradHist1d

from cockpit_core import EmbeddingGrads


@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize(
    "value_range", [(-1.5, 1.5), (0.5, 2.0)], ids=["zero inside", "zero below"]
)
def test_embedding_histogram_equals_the_dense_one(padding_idx, value_range):
    torch.manual_seed(0)
    idx = torch.randint(0, 7, (5, 6))
    idx[0, :3] = 3  # a row touched three times by one sample: summed once
    d = torch.randn(5, 6, 4, dtype=torch.float64)
    grads = EmbeddingGrads(idx, d, 7, padding_idx=padding_idx)
    quantity = GradHist1d(range=value_range, bins=13)
    fast = quantity._factored(grads, torch.zeros(7, 4))
    dense = hist1d_layer(grads.materialize(), *value_range, 13)
    assert torch.equal(fast, dense)  # counts are integers: exactly equal


def test_only_padding_rows_give_zeros_and_a_zero_maximum():
    idx = torch.full((2, 3), 2)
    grads = EmbeddingGrads(idx, torch.randn(2, 3, 4), 5, padding_idx=2)
    fast = GradHist1d(bins=10)._factored(grads, torch.zeros(5, 4))
    assert torch.equal(fast, hist1d_layer(grads.materialize(), -2.0, 2.0, 10))
    assert fast[:10].sum() == 2 * 5 * 4 and fast[-1] == 0
