"""Conv2d statistics from blocks of samples against an autograd loop over samples (float64).

The backend forms a Conv2d weight's per-sample gradients a block of samples at a time when
every requested statistic is a sum or a concatenation over samples; with a budget of three
samples per block the batch of 7 splits into blocks of 3, 3 and 1. The values must equal
the loop's (``||g_n||^2``, ``sum_n g_n^2``, a ``reduce="sum"`` transform with maxima, a
``gather`` transform), and a request with ``batch_dot`` must fall back to the whole tensor.
"""

from __future__ import annotations

import pytest
import torch
from backpack import extend
from cockpit_backpack import BackpackProvider

from cockpit_core import Collection, ConvGrads, ParamSlot
from cockpit_core.requirements import (
    BATCH_DOT,
    BATCH_L2,
    BATCH_PROJECTION,
    SUM_GRAD_SQUARED,
    per_sample_transform,
)
from cockpit_core.statistics import per_sample as per_sample_module
from cockpit_core.statistics.conv import ConvWeightFactors

BATCH = 7
BLOCKS = [3, 3, 1]

CONVS = [
    {},
    {"stride": 2, "padding": 1, "dilation": 2},
    {"padding": (2, 0), "stride": (1, 2)},
    {"padding": "same", "dilation": 2},
    {"padding": 1, "padding_mode": "reflect"},
    {"groups": 2},  # BackPACK's own per-sample tensor: no blocks, same values
]


def cubes_and_maxima(per_sample: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``sum_n g_n^3`` (flat), then two maxima: ``max_n max_i |g_n,i|``, ``max_i |theta_i|``."""
    cubes = per_sample.pow(3).sum(0).flatten()
    return torch.cat([cubes, per_sample.abs().amax().reshape(1), param.abs().amax().reshape(1)])


def rows(per_sample: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``g_n . theta``, one row per sample."""
    return per_sample.flatten(1) @ param.flatten()


SUMMED = per_sample_transform("cubes", cubes_and_maxima, reduce="sum", max_last=2)
GATHERED = per_sample_transform("rows", rows, reduce="gather")


def setup(options: dict) -> tuple[torch.nn.Conv2d, torch.Tensor]:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 6, 3, **options).double()
    return conv, torch.randn(BATCH, 4, 9, 8, dtype=torch.float64)


def loop_gradients(conv: torch.nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``g_n = grad l_n`` of the weight, ``l_n = ||tanh(conv(x_n))||^2``, one sample at a time."""
    model = torch.nn.Sequential(conv, torch.nn.Tanh(), torch.nn.Flatten())
    return torch.stack(
        [
            torch.autograd.grad(model(x[n : n + 1]).pow(2).sum(), conv.weight)[0]
            for n in range(len(x))
        ]
    )


def expected_values(conv: torch.nn.Conv2d, x: torch.Tensor) -> dict:
    """Every statistic from per-sample gradients of an autograd loop over samples."""
    grads = loop_gradients(conv, x)
    flat, w = grads.flatten(1), conv.weight.detach()
    return {
        BATCH_L2.identity: flat.pow(2).sum(1),
        SUM_GRAD_SQUARED.identity: grads.pow(2).sum(0),
        SUMMED.identity: cubes_and_maxima(grads, w),
        GATHERED.identity: rows(grads, w),
        BATCH_DOT.identity: flat @ flat.T,
    }


def collect(conv: torch.nn.Conv2d, x: torch.Tensor, stats: list, monkeypatch) -> tuple:
    """``(values, missing, sizes)``: the weight's statistics, and the samples per formed block."""
    sizes: list[int] = []
    original = ConvWeightFactors.materialize

    def recording(self, start=0, stop=None):
        out = original(self, start, stop)
        sizes.append(out.shape[0])
        return out

    budget = 3 * ConvWeightFactors(conv, x, conv(x).detach()).sample_bytes() + 5
    monkeypatch.setattr(per_sample_module, "BLOCK_BYTES", budget)
    monkeypatch.setattr(ConvWeightFactors, "materialize", recording)
    model = extend(torch.nn.Sequential(conv, torch.nn.Tanh(), torch.nn.Flatten()))
    provider = BackpackProvider([conv.weight], ["weight"])
    collection = Collection(
        statistics=tuple(stats),
        targets={s.identity: frozenset({0}) for s in stats},
        slots=[ParamSlot(0, "weight", conv.weight)],
        batch_size=BATCH,
    )
    with provider.collect(collection):
        (model(x).pow(2).sum() / BATCH).backward()  # mean of l_n = ||f(x_n)||^2
    values = {ident: row[0] for ident, row in collection.results.items()}
    return values, collection.missing, sizes


def assert_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("options", CONVS, ids=str)
def test_blocked_statistics_equal_a_loop_over_samples(options, monkeypatch):
    conv, x = setup(options)
    expected = expected_values(conv, x)
    stats = [BATCH_L2, SUM_GRAD_SQUARED, SUMMED, GATHERED, BATCH_PROJECTION]
    values, missing, sizes = collect(conv, x, stats, monkeypatch)
    assert not missing
    assert sizes == (BLOCKS if options.get("groups", 1) == 1 else [])
    for stat in stats[:4]:
        assert_equal(values[stat.identity], expected[stat.identity])
    # maxima are combined by max: added over the three blocks they would be 3x too large
    assert values[SUMMED.identity][-1] == conv.weight.abs().max()
    # the deferred projection (after backward) uses the kept blocks
    vectors = torch.randn(2, *conv.weight.shape, dtype=torch.float64)
    grads = loop_gradients(conv, x).flatten(1)
    assert_equal(values[BATCH_PROJECTION.identity].dot(vectors), grads @ vectors.flatten(1).T)


def test_a_statistic_that_needs_the_whole_tensor_makes_all_share_it(monkeypatch):
    conv, x = setup({"stride": 2, "padding": 1})
    expected = expected_values(conv, x)
    stats = [BATCH_L2, SUMMED, BATCH_DOT]
    values, missing, sizes = collect(conv, x, stats, monkeypatch)
    assert not missing
    assert sizes == [BATCH]  # formed once, shared by all three
    for stat in stats:
        assert_equal(values[stat.identity], expected[stat.identity])


def test_declined_factored_transforms_use_fn_on_the_kept_blocks(monkeypatch):
    conv, x = setup({"padding": 1})
    expected = expected_values(conv, x)
    seen = []

    def projected(grads, param):
        seen.append(type(grads).__name__)
        return grads.dot(param.unsqueeze(0))[:, 0]

    def declined(grads, param):
        seen.append("declined")
        return NotImplemented  # no fast path for convolutions: fn on blocks of samples

    summed = per_sample_transform(
        "cubes", cubes_and_maxima, reduce="sum", max_last=2, factored_fn=declined
    )
    gathered = per_sample_transform("rows", rows, reduce="gather", factored_fn=projected)
    values, missing, sizes = collect(conv, x, [summed, gathered, BATCH_L2], monkeypatch)
    assert not missing
    assert sizes == BLOCKS and seen == ["declined", "ConvGrads"]
    for stat in (summed, gathered, BATCH_L2):
        assert_equal(values[stat.identity], expected[stat.identity])


def test_a_transform_failing_on_one_block_is_reported_and_the_others_computed(monkeypatch):
    conv, x = setup({})
    expected = expected_values(conv, x)

    def fails_on_the_last_block(per_sample, param):
        if per_sample.shape[0] < 3:
            raise ValueError("boom")
        return cubes_and_maxima(per_sample, param)

    bad = per_sample_transform("bad", fails_on_the_last_block, reduce="sum", max_last=2)
    values, missing, sizes = collect(conv, x, [bad, SUM_GRAD_SQUARED], monkeypatch)
    assert sizes == BLOCKS
    assert "ValueError: boom" in missing[bad.identity]
    assert values.get(bad.identity) is None
    assert_equal(values[SUM_GRAD_SQUARED.identity], expected[SUM_GRAD_SQUARED.identity])


@pytest.mark.parametrize("keep", [False, True])
def test_conv_grads_blocks_cover_the_batch_and_kept_blocks_serve_projections(keep):
    conv, x = setup({"stride": 2, "padding": 1, "dilation": 2})
    expected = loop_gradients(conv, x)
    out = conv(x)
    (grad_out,) = torch.autograd.grad(torch.tanh(out).pow(2).sum() / BATCH, out)
    factors = ConvWeightFactors(conv, x, grad_out.detach()).scaled(BATCH)  # undo the mean
    grads = ConvGrads(factors)
    blocks = list(grads.blocks(3 * factors.sample_bytes(), keep=keep))
    assert [len(b) for b in blocks] == BLOCKS
    assert_equal(torch.cat(blocks), expected)
    assert (grads.factors is None) == keep  # kept blocks replace the factors
    vectors = torch.randn(3, *conv.weight.shape, dtype=torch.float64)
    assert_equal(grads.dot(vectors), expected.flatten(1) @ vectors.flatten(1).T)
    assert_equal(grads.mean(), expected.mean(0))
    assert_equal(grads.materialize(), expected)
