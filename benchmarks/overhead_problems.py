"""The benchmark problems: models and synthetic batches (imported by the measured children).

``mlp`` and ``cnn`` are the problems of issue 7 (batch 128, inputs ``randn``); ``tf-small``
and ``tf-medium`` are the GPT-style transformer classifiers of issue 16 (batch 32, random
tokens). Every problem has 10 classes and random labels. This module imports torch, so
``overhead_child.py`` imports it only after measuring the RSS of ``import torch``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

N_CLASSES = 10


class GPTClassifier(nn.Module):
    """Token and learned position embeddings, pre-norm encoder layers, mean pool, linear head.

    As GPT-2: positions are an ``nn.Embedding`` over position ids, added to the token
    embeddings; each layer is ``nn.TransformerEncoderLayer(norm_first=True, activation=
    "gelu", batch_first=True, dropout=0.0)`` with an MLP of width ``4 * d_model`` and heads
    of width 64; a final LayerNorm precedes the pooling. The position ids are expanded to
    ``[B, T]`` (a ``[T]`` index tensor has no batch dimension, which per-sample statistics
    from module hooks need).
    """

    def __init__(self, vocab: int, seq_len: int, d_model: int, layers: int, classes: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(seq_len, d_model)
        self.blocks = nn.Sequential(
            *(
                nn.TransformerEncoderLayer(
                    d_model,
                    max(1, d_model // 64),
                    4 * d_model,
                    dropout=0.0,
                    activation="gelu",
                    batch_first=True,
                    norm_first=True,
                )
                for _ in range(layers)
            )
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)
        self.register_buffer("position_ids", torch.arange(seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, classes]`` of token ids ``[B, T]``."""
        positions = self.positions(self.position_ids[: tokens.shape[1]].expand(len(tokens), -1))
        hidden = self.blocks(self.tokens(tokens) + positions)
        return self.head(self.norm(hidden).mean(dim=1))


# name -> (vocab, seq_len, d_model, layers); vocabularies chosen for the sizes
TRANSFORMERS: dict[str, tuple[int, int, int, int]] = {
    "tf-small": (1000, 64, 128, 2),  # 534,282 parameters (issue: ~534k)
    "tf-medium": (2000, 128, 256, 4),  # 3,706,890 parameters (issue: ~3.7M)
}


@dataclass(frozen=True)
class Problem:
    """A model factory, the batch size, and a factory of one synthetic batch."""

    name: str
    batch_size: int
    make_model: Callable[[], nn.Module]
    make_batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    description: str


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, N_CLASSES))


def _cnn() -> nn.Module:
    """DeepOBS 3c3d for 3x32x32 inputs.

    conv 64 5x5 (valid) -> 28x28, max-pool 3/2 'same' -> 14, conv 96 3x3 (valid) -> 12,
    max-pool -> 6, conv 128 3x3 (padded) -> 6, max-pool -> 3, flatten 128*3*3 = 1152,
    linear 512, 256, 10, ReLU after every conv and hidden linear layer. ``MaxPool2d(3, 2,
    padding=1)`` gives the output sizes of TensorFlow's 'same' pooling used by DeepOBS.
    """
    return nn.Sequential(
        nn.Conv2d(3, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
        nn.Conv2d(64, 96, 3),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
        nn.Conv2d(96, 128, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
        nn.Flatten(),
        nn.Linear(1152, 512),
        nn.ReLU(),
        nn.Linear(512, 256),
        nn.ReLU(),
        nn.Linear(256, N_CLASSES),
    )


def _images(shape: tuple[int, ...], batch: int):
    def make(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.randn(batch, *shape, generator=gen),
            torch.randint(0, N_CLASSES, (batch,), generator=gen),
        )

    return make


def _tokens(vocab: int, seq_len: int, batch: int):
    def make(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.randint(0, vocab, (batch, seq_len), generator=gen),
            torch.randint(0, N_CLASSES, (batch,), generator=gen),
        )

    return make


def get_problem(name: str) -> Problem:
    """The problem called ``name`` (``mlp``, ``cnn``, ``tf-small``, ``tf-medium``)."""
    if name == "mlp":
        return Problem(name, 128, _mlp, _images((1, 28, 28), 128), "Flatten + Linear(784, 10)")
    if name == "cnn":
        return Problem(name, 128, _cnn, _images((3, 32, 32), 128), "DeepOBS 3c3d, 3x32x32")
    if name in TRANSFORMERS:
        vocab, seq_len, d_model, layers = TRANSFORMERS[name]

        def make() -> nn.Module:
            return GPTClassifier(vocab, seq_len, d_model, layers, N_CLASSES)

        text = (
            f"GPT-style classifier: vocab {vocab}, T {seq_len}, d_model {d_model}, "
            f"{layers} pre-norm layers, {max(1, d_model // 64)} heads, MLP {4 * d_model}"
        )
        return Problem(name, 32, make, _tokens(vocab, seq_len, 32), text)
    raise ValueError(f"unknown problem {name!r}: use mlp, cnn, {', '.join(TRANSFORMERS)}")


PROBLEMS = ("mlp", "cnn", *TRANSFORMERS)


def make_model(problem: str) -> nn.Module:
    """A fresh model of ``problem`` (weights from torch's global generator)."""
    return get_problem(problem).make_model()


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
