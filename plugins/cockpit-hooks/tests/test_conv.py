"""``nn.Conv1d``/``nn.Conv2d`` through a real Cockpit against a per-sample loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

B = 3


class ConvNet(nn.Module):
    """``conv``, a nonlinearity, and a linear read-out of the flattened output."""

    def __init__(self, conv: nn.Module, features: int):
        super().__init__()
        self.conv = conv
        self.out = nn.LazyLinear(2)
        self.features = features

    def forward(self, x):
        return self.out(torch.tanh(self.conv(x)).flatten(1))


_CASES = [
    ("conv1d", lambda: nn.Conv1d(2, 3, 3), (2, 9)),
    (
        "conv1d-stride-dilation",
        lambda: nn.Conv1d(2, 3, 3, stride=2, dilation=2, padding=1),
        (2, 11),
    ),
    ("conv1d-same-even", lambda: nn.Conv1d(2, 3, 4, padding="same", bias=False), (2, 8)),
    ("conv1d-circular", lambda: nn.Conv1d(2, 3, 3, padding=2, padding_mode="circular"), (2, 7)),
    ("conv2d", lambda: nn.Conv2d(2, 3, 3), (2, 5, 6)),
    ("conv2d-stride", lambda: nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 0)), (2, 7, 5)),
    ("conv2d-dilation-no-bias", lambda: nn.Conv2d(2, 3, 2, dilation=2, bias=False), (2, 6, 6)),
    ("conv2d-same", lambda: nn.Conv2d(2, 3, (3, 4), padding="same", dilation=(1, 2)), (2, 5, 6)),
    ("conv2d-valid", lambda: nn.Conv2d(2, 3, 3, padding="valid", stride=2), (2, 7, 7)),
    ("conv2d-reflect", lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"), (2, 5, 5)),
    (
        "conv2d-replicate",
        lambda: nn.Conv2d(2, 3, 3, padding=(2, 1), padding_mode="replicate"),
        (2, 4, 5),
    ),
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize(("label", "make", "shape"), _CASES, ids=[c[0] for c in _CASES])
def test_conv_every_kind(h, label, make, shape):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randn(B, *shape, generator=gen, dtype=torch.float64) for _ in range(2)]
    model = ConvNet(make(), 0).double()
    model(data[0])  # materialize the lazy read-out
    r = h.run(model, lambda m, s: (torch.sin(m(data[s])) ** 2).sum(1), steps=2)
    h.check(r, label.split("-")[0])


def test_conv_used_twice(h):
    """One convolution applied to two inputs: the per-sample gradients add up."""

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 3, padding=1)

        def forward(self, x):
            return torch.tanh(self.conv(torch.tanh(self.conv(x)))).flatten(1)

    torch.manual_seed(0)
    x = torch.randn(B, 2, 4, 4, dtype=torch.float64)
    r = h.run(Twice().double(), lambda m, s: (m(x) ** 2).sum(1))
    h.check(r, "conv2d")


def test_conv_norms_and_projections_go_block_wise(h, monkeypatch):
    """Norms and sums of squares of a convolution need no whole ``[B, *weight]`` tensor."""
    from cockpit_core import ConvGrads

    def forbidden(self):
        raise AssertionError("materialized")

    monkeypatch.setattr(ConvGrads, "materialize", forbidden)
    monkeypatch.setattr("cockpit_core.statistics.per_sample.BLOCK_BYTES", 1000)
    stats = [h.BATCH_L2, h.SUM_GRAD_SQUARED, h.BATCH_PROJECTION, h.PROJECTION, h.CUBES, h.ABS_MAX]
    torch.manual_seed(0)
    x = torch.randn(5, 2, 6, 6, dtype=torch.float64)
    model = ConvNet(nn.Conv2d(2, 3, 3), 0).double()
    model(x)
    r = h.run(model, lambda m, s: (torch.sin(m(x)) ** 2).sum(1), stats)
    h.check(r, "conv2d", stats)


def test_unbatched_convolution_is_reported(h):
    """A ``[C, L]`` input with ``C == B``: refused, not read as a batch."""
    torch.manual_seed(0)
    model = nn.Conv1d(3, 2, 2).double()
    x = torch.randn(3, 5, dtype=torch.float64)

    def losses(m, s):
        return (m(x) ** 2).sum().reshape(1).expand(3)

    r = h.run(model, losses, [h.BATCH_L2])
    text = r.missing(0)[h.BATCH_L2.identity]
    assert "Conv1d: input without a batch axis" in text
