"""Issue 28's acceptance: the models people train get every statistic in their own pass.

A stock ``transformers`` GPT-2 (``Conv1D``, ``lm_head`` tied to ``wte``, positions
``[1, T]``), a ``transformers`` Llama (its own RMSNorm class, gated MLP), a nanoGPT-style
GPT (tied weights, ``wpe(arange(T))``, its own LayerNorm class, causal SDPA), a ViT (bare
``cls``/``pos`` parameters), a model with a custom leaf module and a CNN with BatchNorm in
eval mode: ``Cockpit(model, ...)`` with nothing attached computes every first-order
quantity of ``economy`` plus ``mean_gsnr``, ``cabs`` and ``early_stopping`` through module
hooks, equal (float64, ``rtol=1e-6``; histogram counts within 4) to the same quantities
from the reference provider ``autograd_loop`` (one ``torch.autograd.grad`` per sample
loss of the same forward pass), and the model's forward runs once per tracked step.

The two runs are separate trainings from the same initial weights on the same batches;
their parameters agree to float64 rounding (about 1e-15), far below the tolerance, while
a wrong per-sample term (a missed cross term of the tied weights, a broadcast summed over
the batch) is of order one.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cockpit_core import BATCH_L2, Cockpit, Registry
from cockpit_core.testing.models import NanoGPT, ViT, tiny_gpt2, tiny_llama

QUANTITIES = ["economy", "mean_gsnr", "cabs", "early_stopping"]
STEPS = 3
B, T, VOCAB = 4, 8, 40


def _loop_registry() -> Registry:
    path = Path(__file__).with_name("autograd_loop_provider.py")
    spec = importlib.util.spec_from_file_location("cockpit_test_autograd_loop", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry = Registry.from_entry_points()
    info = registry.add_plugin(module, name="autograd_loop")
    assert info.ok, info.error
    return registry


def causal_lm_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean next-token cross-entropy, ``[B]``."""
    shifted = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
    )
    return shifted.view(ids.shape[0], -1).mean(1)


class GatedMLP(torch.nn.Module):
    """A leaf module with its own parameters and no dedicated rule (SwiGLU-style)."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.w_gate = torch.nn.Parameter(0.3 * torch.randn(hidden, d))
        self.w_up = torch.nn.Parameter(0.3 * torch.randn(hidden, d))
        self.w_down = torch.nn.Parameter(0.3 * torch.randn(d, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, self.w_gate)) * F.linear(x, self.w_up), self.w_down)


class CustomLeafNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(6, 8)
        self.mlp = GatedMLP(8, 12)
        self.bilinear = torch.nn.Bilinear(8, 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = h + self.mlp(h)
        return self.bilinear(h, torch.tanh(h))


def _batchnorm_cnn() -> torch.nn.Module:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 8),
        torch.nn.BatchNorm1d(8),
        torch.nn.Linear(8, 5),
    )
    with torch.no_grad():  # running statistics that are not the defaults
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model.eval()


def _lm(make: Callable[[], torch.nn.Module], call: Callable) -> dict[str, Any]:
    def losses(model, step):
        ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(step))
        return causal_lm_losses(call(model, ids), ids)

    return {"make": make, "losses": losses}


def _classifier(make: Callable[[], torch.nn.Module], shape: tuple, classes: int) -> dict:
    def losses(model, step):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(B, *shape, generator=gen, dtype=torch.float64)
        y = torch.randint(0, classes, (B,), generator=gen)
        return F.cross_entropy(model(x), y, reduction="none")

    return {"make": make, "losses": losses}


def tiny_t5() -> torch.nn.Module:
    """A ``transformers`` T5 from a tiny config: relative position bias tables (an embedding
    over ``[T, T]`` buckets, permuted, causally masked with ``torch.where`` in the decoder,
    passed to ``scaled_dot_product_attention`` as its mask), RMS norms, tied embeddings."""
    import transformers

    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
        dropout_rate=0.0,
    )
    return transformers.T5ForConditionalGeneration(config)


def _seeded(factory: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return factory()

    return make


MODELS = {
    "gpt2": _lm(lambda: tiny_gpt2(), lambda m, ids: m(input_ids=ids).logits),
    "llama": _lm(lambda: tiny_llama(), lambda m, ids: m(input_ids=ids).logits),
    "llama_tied": _lm(lambda: tiny_llama(tie=True), lambda m, ids: m(input_ids=ids).logits),
    "nanogpt": _lm(_seeded(NanoGPT), lambda m, ids: m(ids)[0]),
    "t5": _lm(tiny_t5, lambda m, ids: m(input_ids=ids, decoder_input_ids=ids).logits),
    "vit": _classifier(_seeded(ViT), (3, 8, 8), 5),
    "custom_leaf": _classifier(_seeded(CustomLeafNet), (6,), 5),
    "batchnorm_eval": _classifier(_seeded(_batchnorm_cnn), (3, 8, 8), 5),
}
"""name -> model factory and per-sample losses of a step."""

NEEDS_TRANSFORMERS = {"gpt2", "llama", "llama_tied", "t5"}

RULES = {
    "gpt2": {
        "transformer.wte.weight": "Embedding + Linear rules (tied: 'transformer.wte', 'lm_head')",
        "transformer.wpe.weight": "Embedding rule, its output captured where broadcast",
        "transformer.h.0.attn.c_attn.weight": "Conv1D rule",
        "transformer.h.1.mlp.c_proj.bias": "Conv1D rule",
    },
    "llama": {"model.norm.weight": "captured where broadcast into the batch (TensorBase.mul)"},
    "llama_tied": {"model.embed_tokens.weight": "Embedding + Linear rules (tied"},
    "nanogpt": {
        "transformer.wte.weight": "Embedding + Linear rules (tied",
        "transformer.wpe.weight": "Embedding rule, its output captured where broadcast",
        "transformer.h.0.ln_1.weight": "functional rule (F.layer_norm)",
    },
    "t5": {
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": (
            "Embedding rule, its output captured where broadcast"
        ),
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": (
            "Embedding rule, its output captured where broadcast"
        ),
    },
    "vit": {
        "cls_token": "captured where broadcast into the batch (TensorBase.expand)",
        "pos_embed": "captured where broadcast into the batch (TensorBase.add)",
    },
    "custom_leaf": {
        "mlp.w_gate": "functional rule (F.linear)",
        "bilinear.weight": "generic rule (vmap of Bilinear's vjp)",
    },
    "batchnorm_eval": {"1.weight": "BatchNorm2d rule", "5.bias": "BatchNorm1d rule"},
}
"""What ``describe`` says serves some parameters of each model: every path is exercised."""


def _train(case: dict, backend: str, registry: Registry | None = None) -> tuple[Cockpit, int]:
    """Train ``STEPS`` tracked steps; returns the Cockpit and how often the model's forward ran."""
    model = case["make"]().double()
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    cp = Cockpit(model, QUANTITIES, backend=backend, registry=registry, on_error="raise")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        opt.zero_grad()
        losses = case["losses"](model, step)
        loss = losses.mean()
        reference = backend == "autograd_loop"
        info = {
            "loss": loss,
            "individual_losses": losses if reference else losses.detach(),
            "batch_size": B,
            "optimizer": opt,
        }
        with cp(step, info=info):
            loss.backward(retain_graph=reference)
        opt.step()
    return cp, len(calls)


def _compare(actual: Any, expected: Any, path: str = "") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), path
        for key in expected:
            _compare(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, (list, tuple)) and not all(
        isinstance(v, (int, float)) for v in expected
    ):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, f"{path}[{i}]")
    elif isinstance(expected, str) or expected is None or isinstance(expected, bool):
        assert actual == expected, path
    else:
        a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
        if ".hist" in path or ".per_param" in path and "grad_hist" in path:
            np.testing.assert_allclose(a, e, atol=4, rtol=0, err_msg=path)  # counts
        else:
            np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-12, err_msg=path, equal_nan=True)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_statistic_in_the_users_own_pass_equals_the_per_sample_loop(name):
    if name in NEEDS_TRANSFORMERS:
        pytest.importorskip("transformers")
    case = MODELS[name]
    hooks, forwards = _train(case, "auto")
    loop, _ = _train(case, "autograd_loop", _loop_registry())
    assert forwards == STEPS  # the model ran once per tracked step: nothing re-ran it
    assert not hooks.errors, hooks.errors[:1]
    router = hooks._router
    assert {r.provider for r in router.routes(BATCH_L2)} == {"hooks"}
    slots = {slot.name: slot for slot in router.slots}
    for param, text in RULES[name].items():
        assert router.providers["hooks"].describe(slots[param]).startswith(text), param
    out, expected = hooks.get_output(), loop.get_output()
    assert sorted(out) == list(range(STEPS))
    for step in range(STEPS):
        assert "norm_test" in out[step] and "grad_hist_1d" in out[step]
    for key in ("time",):
        for row in (*out.values(), *expected.values()):
            row.pop(key, None)
    _compare(out, expected)
