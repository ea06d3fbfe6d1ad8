"""``activations``: RMS, max |x| and zeros of module outputs against the outputs themselves."""

from __future__ import annotations

import fnmatch

import numpy as np
import pytest
import torch
from cockpit_activations import Activations
from cockpit_activations.activations import reduce_output
from torch import nn

from cockpit_core import Cockpit, ConfigError
from cockpit_core.testing.models import NanoGPT

from ._reference import assert_matches, capture, stats

VOCAB, T = 40, 8


def _tokens(seed: int, batch: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, T), generator=gen)


def _nanogpt() -> NanoGPT:
    torch.manual_seed(0)
    return NanoGPT(vocab=VOCAB).double()


NANOGPT_DEFAULT = {
    *(
        f"transformer.h.{i}{part}"
        for i in range(2)
        for part in (
            "",
            ".ln_1",
            ".ln_2",
            ".attn.c_attn",
            ".attn.c_proj",
            ".mlp.c_fc",
            ".mlp.c_proj",
        )
    ),
    "transformer.ln_f",
    "lm_head",
}
"""The default selection on NanoGPT: blocks, Linear layers and its own LayerNorm class."""


def _train(model, cp, names, forward, steps=3):
    """Train with SGD; before each step, the reference outputs of the step's batch."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    references = {}
    for step in range(steps):
        batch = _tokens(step)
        references[step] = capture(model, names, lambda batch=batch: forward(model, batch))
        loss = forward(model, batch)
        with cp(step, loss=loss):
            loss.backward()
        opt.step()
        opt.zero_grad()
    return references


def _nanogpt_loss(model, idx):
    return model(idx, idx.roll(-1, dims=1))[1]


def test_nanogpt_default_selection_matches_the_module_outputs():
    model = _nanogpt()
    cp = Cockpit(model, ["activations"])
    references = _train(model, cp, NANOGPT_DEFAULT, _nanogpt_loss)
    out = cp.get_output()
    assert not cp.errors and sorted(out) == [0, 1, 2]
    for step, reference in references.items():
        value = out[step]["activations"]
        assert set(value["modules"]) == NANOGPT_DEFAULT and len(value["modules"]) == 16
        assert value["rms"].dtype == np.float64 and value["rms"].shape == (16,)
        assert "underflow" not in value and "overflow" not in value
        assert_matches(value, reference)
    # the blocks' outputs are the residual stream: no exact zeros, sizes of order one
    rms = dict(zip(out[2]["activations"]["modules"], out[2]["activations"]["rms"]))
    assert 0.1 < rms["transformer.h.1"] < 10


def test_tiny_gpt2_default_selection_reads_conv1d_and_block_tuples():
    pytest.importorskip("transformers", reason="the tiny GPT-2 needs transformers")
    from cockpit_core.testing.models import tiny_gpt2

    model = tiny_gpt2(vocab=VOCAB).double()
    expected = NANOGPT_DEFAULT  # GPT-2 names its blocks, Conv1D layers and norms as nanoGPT
    cp = Cockpit(model, ["activations"])

    def forward(model, idx):
        return model(input_ids=idx, labels=idx).loss

    references = _train(model, cp, expected, forward, steps=2)
    out = cp.get_output()
    assert not cp.errors
    for step, reference in references.items():
        value = out[step]["activations"]
        assert set(value["modules"]) == expected
        assert_matches(value, reference)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            {"types": ["Linear"]},
            lambda m: {n for n, x in m.named_modules() if type(x) is nn.Linear},
        ),
        (
            {"names": ["transformer.h.1.*"]},
            lambda m: {
                n for n, _ in m.named_modules() if fnmatch.fnmatchcase(n, "transformer.h.1.*")
            },
        ),
        (
            {"types": ["LayerNorm"], "names": ["transformer.h.*"]},
            lambda m: {f"transformer.h.{i}.ln_{j}" for i in range(2) for j in (1, 2)},
        ),
        ({"names": ["lm_head", "transformer.h.0"]}, lambda m: {"lm_head", "transformer.h.0"}),
    ],
)
def test_types_and_names_select_exactly_what_they_say(options, expected):
    model = _nanogpt()
    want = expected(model)
    assert want  # the case selects something
    cp = Cockpit(model, [{"name": "activations", **options}])
    references = _train(model, cp, want, _nanogpt_loss, steps=1)
    value = cp.get_output()[0]["activations"]
    assert not cp.errors and set(value["modules"]) == want
    assert_matches(value, references[0])


def test_gradient_accumulation_combines_the_micro_batches_exactly():
    model = _nanogpt()
    cp = Cockpit(model, [{"name": "activations", "low_precision": ["float16"]}])
    first, second = _tokens(1, batch=2), _tokens(2, batch=4)  # of different sizes
    reference = capture(
        model,
        NANOGPT_DEFAULT,
        lambda: (_nanogpt_loss(model, first), _nanogpt_loss(model, second)),
    )
    with cp(0, accumulate=True) as run:
        for idx in (first, second):
            loss = _nanogpt_loss(model, idx) / 2
            run.micro_batch(loss=loss)
            loss.backward()
    value = cp.get_output()[0]["activations"]
    assert not cp.errors
    assert len(reference["lm_head"]) == (2 + 4) * T * VOCAB  # both calls captured
    assert_matches(value, reference)
    # every element of both calls counts: RMS over the union, not a mean of the two RMS
    one = capture(model, ["lm_head"], lambda: _nanogpt_loss(model, first))["lm_head"]
    i = value["modules"].index("lm_head")
    assert value["rms"][i] != pytest.approx(stats(one)["rms"], rel=1e-6)


class MyLinear(nn.Linear):
    """A subclass: ``types=["Linear"]`` selects it (a base class's name)."""


def _relu_mlp() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(
        MyLinear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3)
    ).double()


def test_relu_zero_fraction_is_exact_and_sequential_children_are_not_blocks():
    model = _relu_mlp()
    cp = Cockpit(
        model, ["activations", {"name": "activations", "label": "relu", "types": ["ReLU"]}]
    )
    x = torch.randn(50, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    reference = capture(model, ["0", "1", "2", "3", "4"], lambda: model(x))
    loss = model(x).square().mean()
    with cp(0, loss=loss):
        loss.backward()
    out = cp.get_output()[0]
    assert not cp.errors
    # the default: the three Linear layers (one a subclass); "1" and "3" are elements of a
    # Sequential, not of a ModuleList, so they are no blocks
    assert out["activations"]["modules"] == ["0", "2", "4"]
    assert_matches(out["activations"], {k: reference[k] for k in ("0", "2", "4")})
    relu = out["relu"]
    assert relu["modules"] == ["1", "3"]
    for i, name in enumerate(relu["modules"]):
        zeros = int(np.sum(reference[name] == 0))
        assert 0 < zeros < reference[name].size
        assert relu["zero_frac"][i] == zeros / reference[name].size  # exact
    cp = Cockpit(model, [{"name": "activations", "types": ["Linear"]}])
    loss = model(x).square().mean()
    with cp(0, loss=loss):
        loss.backward()
    assert cp.get_output()[0]["activations"]["modules"] == ["0", "2", "4"]


def test_transformer_encoder_layers_are_blocks():
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).double()
    cp = Cockpit(model, ["activations"])
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    # the attention's out_proj is a Linear, but MultiheadAttention reads its weight without
    # calling it: no output to read
    expected = {
        f"layers.{i}{part}"
        for i in range(2)
        for part in ("", ".linear1", ".linear2", ".norm1", ".norm2")
    }
    reference = capture(model, expected, lambda: model(x))
    loss = model(x).square().mean()
    with cp(0, loss=loss):
        loss.backward()
    value = cp.get_output()[0]["activations"]
    assert not cp.errors and set(value["modules"]) == expected
    assert_matches(value, reference)


class Emit(nn.Module):
    """Outputs fixed values (times a parameter equal to 1), in float32."""

    def __init__(self, values: torch.Tensor):
        super().__init__()
        self.register_buffer("values", values)
        self.one = nn.Parameter(torch.ones((), dtype=values.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.values * self.one + 0 * x.sum()


F16_TINY, BF16_TINY = 2.0**-14, 2.0**-126  # smallest normal numbers
KNOWN = torch.tensor(
    [
        0.0,
        0.0,
        -0.0,  # 3 zeros
        1e-5,
        -3e-6,
        1e-8,  # below float16's smallest normal
        1e-39,  # a float32 subnormal: below every smallest normal, bfloat16's too
        7e4,
        -1e5,  # beyond float16's max 65504
        1.0,
        -2.5,
        100.0,
        0.25,
        300.0,
        -449.0,  # representable (-449 is beyond float8_e4m3fn's 448)
    ],
    dtype=torch.float32,
)
# float8_e4m3fn: smallest normal 2^-6, max 448


def test_low_precision_shares_on_known_counts():
    model = nn.Sequential(Emit(KNOWN))
    cp = Cockpit(
        model,
        [
            {
                "name": "activations",
                "names": ["0"],
                "low_precision": ["float16", "bfloat16", "float8_e4m3fn"],
            }
        ],
    )
    loss = model(torch.ones(1)).sum()
    with cp(0, loss=loss):
        loss.backward()
    value = cp.get_output()[0]["activations"]
    assert not cp.errors and value["modules"] == ["0"]
    nonzero = 12
    assert value["zero_frac"][0] == 3 / 15
    assert value["underflow"]["float16"][0] == 4 / nonzero
    assert value["overflow"]["float16"][0] == 2 / nonzero
    assert value["underflow"]["bfloat16"][0] == 1 / nonzero
    assert value["overflow"]["bfloat16"][0] == 0.0
    assert value["underflow"]["float8_e4m3fn"][0] == 4 / nonzero
    assert value["overflow"]["float8_e4m3fn"][0] == 3 / nonzero
    ref = stats(KNOWN.double().numpy())
    assert value["amax"][0] == 1e5
    assert value["rms"][0] == pytest.approx(ref["rms"], rel=1e-6)  # a float32 sum
    # the definitions, element by element, in float64
    x = np.abs(KNOWN.double().numpy())
    for name, dtype in (("float16", torch.float16), ("float8_e4m3fn", torch.float8_e4m3fn)):
        info = torch.finfo(dtype)
        assert value["underflow"][name][0] == np.sum((x > 0) & (x < info.tiny)) / np.sum(x > 0)
        assert value["overflow"][name][0] == np.sum(x > info.max) / np.sum(x > 0)


def test_reduce_output_keeps_amax_exact_and_inf_and_nan_when_the_norm_overflows():
    big = torch.tensor([3e18, -2e18, 1e18], dtype=torch.bfloat16)  # squares fit float32
    norm, amax = reduce_output(big).stats[:2].tolist()
    assert norm / np.sqrt(3) == pytest.approx(np.sqrt(np.mean(big.double().numpy() ** 2)), 1e-6)
    huge = torch.tensor([3e38, -2e38, 1e38], dtype=torch.bfloat16)  # squares overflow float32
    norm, amax = reduce_output(huge).stats[:2].tolist()
    assert norm == np.inf  # documented: the float32 sum of squares overflows
    assert amax == float(huge.double().abs().max())
    for bad, want in ((float("inf"), np.inf), (float("nan"), np.nan)):
        norm, amax = reduce_output(torch.tensor([1.0, bad, 0.0])).stats[:2].tolist()
        np.testing.assert_equal(norm, want)
        np.testing.assert_equal(amax, want)
    zeros = reduce_output(torch.zeros(4, dtype=torch.float64))
    assert zeros.stats.tolist() == [0.0, 0.0, 4.0]
    assert reduce_output(torch.arange(3)) is None  # no floating-point tensor
    assert reduce_output((None, torch.ones(2), torch.zeros(2))).stats[2] == 0  # first tensor
    assert reduce_output(torch.ones(0)) is None


def test_options_are_validated():
    with pytest.raises(ConfigError, match="not a floating-point torch dtype"):
        Activations(low_precision=["int8"])
    with pytest.raises(ConfigError, match="not a floating-point torch dtype"):
        Activations(low_precision=["float17"])
    with pytest.raises(ConfigError):
        Activations(types="Linear")  # a list, not a string
    with pytest.raises(ConfigError):
        Activations(names=[])
    a = Activations(types=["Linear"], low_precision=["bfloat16"])
    b = Activations(types=["Linear"], low_precision=["bfloat16"], label="other")
    c = Activations(types=["Linear"])
    assert a.probe.key == b.probe.key != c.probe.key  # the key holds every option


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_reduction_does_not_wait_for_the_device():
    from cockpit_activations.logits import reduce_logits

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (3 * torch.randn(64, 257, device="cuda", generator=gen)).to(torch.bfloat16)
    torch.cuda.set_sync_debug_mode("error")  # a host synchronization raises
    try:
        call = reduce_output(x, (torch.float16, torch.float8_e4m3fn))
        logits = reduce_logits(x)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ref = stats(x.double().cpu().numpy())
    norm, amax = call.stats[:2].tolist()
    assert norm / np.sqrt(x.numel()) == pytest.approx(ref["rms"], rel=1e-6)
    assert amax == ref["amax"]
    log_z = torch.logsumexp(x.double(), dim=-1)
    assert logits.stats[0].item() == pytest.approx(float(log_z.sum()), rel=1e-6)


def test_bfloat16_autocast_outputs_are_summed_in_float32():
    torch.manual_seed(0)
    model = NanoGPT(vocab=VOCAB)  # float32 parameters, bfloat16 matmuls
    cp = Cockpit(model, ["activations"])
    idx = _tokens(0, batch=4)

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _nanogpt_loss(model, idx)

    reference = capture(model, NANOGPT_DEFAULT, forward)
    loss = forward()
    with cp(0, loss=loss):
        loss.backward()
    value = cp.get_output()[0]["activations"]
    assert not cp.errors
    assert_matches(value, reference, rtol=1e-5)  # amax and zero_frac exactly, rms to float32
    i = value["modules"].index("lm_head")
    assert value["amax"][i] == float(np.max(np.abs(reference["lm_head"])))
