"""Lets the plugin's tests run from a source checkout without installing it; shared fixtures."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _reference_2d(grads, params, ranges, bins):
    """Brute-force 2-D counts [P, xbins, ybins] of per-sample gradients with numpy."""
    (xlo, xhi), (ylo, yhi) = ranges
    wx, wy = (xhi - xlo) / bins[0], (yhi - ylo) / bins[1]
    out = []
    for g, p in zip(grads, params):
        gx = g.detach().numpy().astype(np.float32).reshape(len(g), -1)
        py = np.broadcast_to(p.detach().numpy().astype(np.float32).ravel(), gx.shape)
        gx = np.clip(gx, np.float32(xlo + wx / 2), np.float32(xhi - wx / 2))
        py = np.clip(py, np.float32(ylo + wy / 2), np.float32(yhi - wy / 2))
        h, _, _ = np.histogram2d(gx.ravel(), py.ravel(), bins=bins, range=ranges)
        out.append(h.astype(np.int64))
    return np.stack(out)


@pytest.fixture
def reference_2d():
    """The brute-force 2-D histogram of per-sample gradients (``numpy.histogram2d``)."""
    return _reference_2d
