"""The vectorized bin assignment counts exactly as ``torch.histc``, or is not used.

Reference: ``torch.histc`` itself (its float32 assignment is what the histograms promise),
on random values plus every bin edge and its float32 neighbours. Counts are compared
exactly.
"""

import numpy as np
import pytest
import torch
from cockpit_histograms import _fastbin

RANGES = [
    (-2.0, 2.0, 100),
    (-0.05, 0.02, 7),
    (0.1, 0.5, 11),
    (-1e-6, 1e-6, 1000),
    (-3.3, 7.1, 37),
    (-1.0, 1.0, 10_000),
]


@pytest.fixture(autouse=True)
def no_small_shortcut(monkeypatch):
    """Take the fast paths even for these small tensors (real layers are larger)."""
    monkeypatch.setattr(_fastbin, "SMALL", 0)


def edge_values(lo, hi, bins):
    edges = torch.linspace(lo, hi, bins + 1).float()
    below = torch.nextafter(edges, torch.tensor(-np.inf))
    above = torch.nextafter(edges, torch.tensor(np.inf))
    return torch.cat([edges, below, above]).clamp(lo, hi)


@pytest.mark.parametrize(("lo", "hi", "bins"), RANGES)
def test_counts_equal_histc(lo, hi, bins):
    assert _fastbin.exact_for(lo, hi, bins)
    gen = torch.Generator().manual_seed(0)
    values = torch.rand(50_000, generator=gen) * (hi - lo) + lo
    values = torch.cat([values.clamp(lo, hi), edge_values(lo, hi, bins)])
    expected = torch.histc(values, bins=bins, min=lo, max=hi).to(torch.float64)
    torch.testing.assert_close(_fastbin.bin_counts(values, lo, hi, bins), expected, rtol=0, atol=0)


@pytest.mark.parametrize("bins", [5, 100, 10_000])
def test_concentrated_values_over_many_pieces(monkeypatch, bins):
    """Striped sub-histograms (int16, or int32 for many bins) over pieces of uneven size."""
    monkeypatch.setattr(_fastbin, "PIECE", 1_000)
    gen = torch.Generator().manual_seed(1)
    values = (torch.randn(12_345, generator=gen) * 0.01).clamp(-1.0, 1.0)  # a few bins
    expected = torch.histc(values, bins=bins, min=-1.0, max=1.0).to(torch.float64)
    counts = _fastbin.bin_counts(values, -1.0, 1.0, bins)
    torch.testing.assert_close(counts, expected, rtol=0, atol=0)
    assert _fastbin._index_dtype(bins) == (torch.int16 if bins <= 100 else torch.int32)


def test_a_different_rounding_is_detected_and_histc_used(monkeypatch):
    """Multiplying by the reciprocal instead of dividing moves values at some edges."""

    def reciprocal(v, lo32, scale, r32, bins, out, work=None):
        return out.copy_(torch.sub(v, lo32).mul_(scale * (1.0 / r32)))

    monkeypatch.setattr(_fastbin, "_quantize", reciprocal)
    _fastbin.exact_for.cache_clear()
    try:
        detected = [not _fastbin.exact_for(lo, hi, bins) for lo, hi, bins in RANGES]
        assert any(detected)
        lo, hi, bins = RANGES[detected.index(True)]
        values = edge_values(lo, hi, bins)
        expected = torch.histc(values, bins=bins, min=lo, max=hi).to(torch.float64)
        torch.testing.assert_close(
            _fastbin.bin_counts(values, lo, hi, bins), expected, rtol=0, atol=0
        )
    finally:
        _fastbin.exact_for.cache_clear()
