"""Per-sample gradients of Conv2d from unfold + bmm against an autograd loop (float64).

The loop computes ``g_n = grad l_n`` one sample at a time; the backend's values must agree
to float64 rounding (``1e-12`` relative: sums of ~100 products). String padding and the
non-zero padding modes are included: BackPACK 1.7.1's own computation was wrong for them.
Projections ``g_n . V`` (by convolution) and means are checked against the same loop.
"""

import pytest
import torch
from backpack import backpack, extend
from backpack.extensions import BatchGrad
from cockpit_backpack.conv2d import UnfoldConv2d

from cockpit_core.statistics.conv import ConvGrads, ConvWeightFactors
from cockpit_core.statistics.per_sample import FactoredLinearGrads, MaterializedGrads

CONVS = [
    {},
    {"stride": 2, "padding": 1, "dilation": 2},
    {"padding": (2, 0), "stride": (1, 2)},
    {"padding": "same"},
    {"padding": "same", "dilation": 2},
    {"padding": 1, "padding_mode": "reflect"},
    {"padding": (1, 2), "padding_mode": "circular", "stride": 2},
    {"padding": 1, "padding_mode": "replicate", "bias": False},
    {"groups": 2},  # BackPACK's own computation
]


@pytest.mark.parametrize("options", CONVS, ids=str)
def test_per_sample_conv_gradients_equal_a_loop_over_samples(options):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 6, 3, **options).double()
    model = extend(torch.nn.Sequential(conv, torch.nn.Tanh(), torch.nn.Flatten()))
    x = torch.randn(5, 4, 9, 8, dtype=torch.float64)
    expected = []
    for n in range(len(x)):
        grads = torch.autograd.grad(model(x[n : n + 1]).pow(2).sum(), conv.weight)
        expected.append(grads[0])
    expected = torch.stack(expected)
    extension = BatchGrad()
    extension.set_module_extension(torch.nn.Conv2d, UnfoldConv2d(), overwrite=True)
    with backpack(extension):
        model(x).pow(2).sum().backward()
    saved = conv.weight.grad_batch
    if not isinstance(saved, ConvWeightFactors):  # grouped: BackPACK's own tensor
        torch.testing.assert_close(saved, expected, rtol=1e-12, atol=1e-12)
        return
    grads = ConvGrads(saved)
    torch.testing.assert_close(grads.materialize(), expected, rtol=1e-12, atol=1e-12)
    # projections by convolution, before and after the per-sample tensor exists
    vectors = torch.randn(3, *conv.weight.shape, dtype=torch.float64)
    projections = expected.flatten(1) @ vectors.flatten(1).T
    fresh = ConvGrads(saved)
    torch.testing.assert_close(fresh.dot(vectors), projections, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fresh.mean(), expected.mean(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads.dot(vectors), projections, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads.mean(), expected.mean(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        grads.batch_l2(), expected.flatten(1).pow(2).sum(1), rtol=1e-12, atol=0
    )


@pytest.mark.parametrize("n_out, n_in", [(3, 5), (5, 3)], ids=["out<in", "out>in"])
def test_linear_projections_equal_the_materialized_ones(n_out, n_in):
    """Both contraction orders of ``FactoredLinearGrads.dot`` (a first, d first)."""
    torch.manual_seed(1)
    a, d = torch.randn(4, n_in, dtype=torch.float64), torch.randn(4, n_out, dtype=torch.float64)
    factored = FactoredLinearGrads(a, d)
    g = d[:, :, None] * a[:, None, :]  # g_n = d_n a_n^T
    vectors = torch.randn(2, n_out, n_in, dtype=torch.float64)
    torch.testing.assert_close(factored.dot(vectors), g.flatten(1) @ vectors.flatten(1).T)
    torch.testing.assert_close(factored.mean(), g.mean(0))
    torch.testing.assert_close(
        MaterializedGrads(g).dot(vectors), g.flatten(1) @ vectors.flatten(1).T
    )


@pytest.mark.parametrize("options", [{}, {"stride": 2, "padding": 1, "dilation": 2}], ids=str)
@pytest.mark.parametrize("kind", ["diag_hessian", "diag_ggn_exact", "diag_ggn_mc"])
@pytest.mark.parametrize("one_sample_blocks", [False, True])
def test_curvature_diagonals_equal_backpack(options, kind, one_sample_blocks, monkeypatch):
    """The fast Conv2d curvature diagonals equal BackPACK's own (itself tested upstream;
    the curvature plugin compares with explicit Hessians), in one block or sample by sample."""
    import copy

    from backpack.extensions import DiagGGNExact, DiagGGNMC, DiagHessian
    from cockpit_backpack.conv2d import DiagGGNConv2dFast, DiagHConv2dFast

    from cockpit_core.statistics import conv as conv_grads

    if one_sample_blocks:
        monkeypatch.setattr(conv_grads, "CURVATURE_BLOCK", 1)

    extension, fast, field = {
        "diag_hessian": (DiagHessian, DiagHConv2dFast, "diag_h"),
        "diag_ggn_exact": (DiagGGNExact, DiagGGNConv2dFast, "diag_ggn_exact"),
        "diag_ggn_mc": (DiagGGNMC, DiagGGNConv2dFast, "diag_ggn_mc"),
    }[kind]
    torch.manual_seed(0)
    base = torch.nn.Sequential(
        torch.nn.Conv2d(3, 5, 3, **options), torch.nn.Sigmoid(), torch.nn.Flatten()
    ).double()
    x = torch.randn(6, 3, 8, 8, dtype=torch.float64)
    base.append(torch.nn.Linear(base(x).shape[1], 4).double())
    y = torch.randint(0, 4, (6,))
    values = []
    for use_fast in (False, True):
        model = extend(copy.deepcopy(base))
        ext = extension()
        if use_fast:
            ext.set_module_extension(torch.nn.Conv2d, fast(), overwrite=True)
        torch.manual_seed(1)  # the same Monte-Carlo samples
        with backpack(ext):
            extend(torch.nn.CrossEntropyLoss())(model(x), y).backward()
        values.append(getattr(model[0].weight, field))
    torch.testing.assert_close(values[1], values[0], rtol=1e-12, atol=1e-15)
