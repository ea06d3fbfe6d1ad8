"""The transformer problem of the DDP tests: every parameter is served by module hooks.

:class:`~cockpit_core.testing.transformer.TinyTransformer` with its learned positions
``pos`` (a parameter owned by the model itself, which only ``torch.func`` can serve)
replaced by an ``nn.Embedding`` over the position ids, so that the module-hook provider
serves every parameter through its embedding, attention, LayerNorm and linear rules.
"""

from __future__ import annotations

import torch

from cockpit_core.testing.transformer import TinyTransformer

STEPS = 3
GLOBAL_BATCH = 24
VOCAB, SEQ_LEN, CLASSES = 7, 4, 3
QUANTITIES = [
    "loss",
    "grad_norm",
    "distance",
    "update_size",
    "norm_test",
    "inner_test",
    "ortho_test",
    "mean_gsnr",
    "early_stopping",
    {"name": "cabs", "lr": 0.05},
    "grad_hist_1d",
    {"name": "grad_hist_2d", "every": 2},
    "alpha",
]
CONFIGS = [(12, 12), (15, 9)]
"""Local batch sizes of the 2 processes (float64)."""


class HookedTransformer(TinyTransformer):
    """TinyTransformer whose positional embedding is an ``nn.Embedding`` of position ids."""

    def __init__(self, **sizes: int):
        super().__init__(**sizes)
        seq_len, d_model = self.pos.shape
        del self.pos
        self.positions = torch.nn.Embedding(seq_len, d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        h = self.encoder(self.embed(tokens) + self.positions(ids))
        return self.head(h.mean(dim=1))


def make_model() -> torch.nn.Module:
    """Embeddings (tokens, positions), one encoder layer, linear head; float64."""
    torch.manual_seed(0)
    return HookedTransformer(vocab=VOCAB, seq_len=SEQ_LEN, classes=CLASSES).double()


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: token sequences ``[24, 4]`` and their classes."""
    gen = torch.Generator().manual_seed(2000 + step)
    x = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ_LEN), generator=gen)
    y = torch.randint(0, CLASSES, (GLOBAL_BATCH,), generator=gen)
    return x, y


def owner_types(model: torch.nn.Module) -> dict[str, str]:
    """``parameter name -> class name of the module that registers it``."""
    return {
        f"{prefix}.{attr}" if prefix else attr: type(module).__name__
        for prefix, module in model.named_modules()
        for attr, _ in module.named_parameters(recurse=False)
    }
