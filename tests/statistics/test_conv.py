"""Convolution factors (:mod:`cockpit_core.statistics.conv`) against a per-sample autograd loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cockpit_core import ConvGrads, DenseGrads
from cockpit_core.statistics import per_sample
from cockpit_core.statistics.conv import ConvWeightFactors, supported_conv

TOL = 1e-10  # float64 sums of < 1000 products; a wrong patch or offset is off by O(1)


def _loop(conv: nn.Module, x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``g_n = d (conv(x_n)) / d W`` contracted with ``d_n``: one autograd call per sample."""
    out = []
    for n in range(len(x)):
        y = conv(x[n : n + 1])
        (g,) = torch.autograd.grad(y, conv.weight, d[n : n + 1])
        out.append(g)
    return torch.stack(out)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Conv1d(2, 3, 3, stride=2, dilation=2, padding=2),
        lambda: nn.Conv1d(2, 3, 4, padding="same", padding_mode="reflect"),
        lambda: nn.Conv2d(2, 3, (2, 3), stride=(2, 3), dilation=(2, 1), padding=(1, 2)),
        lambda: nn.Conv2d(2, 3, 3, padding="same", padding_mode="circular"),
    ],
)
def test_conv_grads_equal_the_loop(make, monkeypatch):
    torch.manual_seed(0)
    conv = make().double()
    spatial = (9,) if isinstance(conv, nn.Conv1d) else (7, 8)
    x = torch.randn(5, 2, *spatial, dtype=torch.float64)
    d = torch.randn_like(conv(x))
    expected = _loop(conv, x, d)
    monkeypatch.setattr(per_sample, "BLOCK_BYTES", 1)  # one sample a block
    grads = ConvGrads(ConvWeightFactors(conv, x, d))
    vectors = torch.randn(2, *conv.weight.shape, dtype=torch.float64)
    ref = DenseGrads(expected)

    def close(a, e):
        assert float((a - e).abs().max()) <= TOL * float(e.abs().max())

    close(grads.dot(vectors), ref.dot(vectors))  # by convolution, before any block
    close(grads.mean(), expected.mean(0))
    close(torch.cat(list(grads.blocks())), expected)
    close(grads.batch_l2(), ref.batch_l2())
    close(grads.sum_grad_squared(), ref.sum_grad_squared())
    close(grads.batch_dot(), ref.batch_dot())


def test_grouped_convolution_is_refused():
    assert supported_conv(nn.Conv2d(4, 4, 3, groups=2)) == "grouped convolution (groups=2)"
    assert supported_conv(nn.Conv1d(2, 2, 3), torch.zeros(2, 5)) == "input without a batch axis"
    assert "not nn.Conv1d or nn.Conv2d" in supported_conv(nn.Conv3d(1, 1, 1))
