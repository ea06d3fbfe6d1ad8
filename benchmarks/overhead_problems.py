"""The benchmark problems: models and synthetic batches (imported by the measured children).

``mlp`` and ``cnn`` are the problems of issue 7 (batch 128, inputs ``randn``); ``tf-small``
and ``tf-medium`` are the GPT-style transformer classifiers of issue 16 (batch 32, random
tokens); ``tf-post`` and ``tf-post-bare`` the post-norm transformer classifiers of issue 32
(positions as an ``nn.Embedding`` or as a bare parameter); ``gpt2``, ``nanogpt`` and ``vit``
the models people train of issue 28 (``cockpit_core.testing.models``, at ``real_models.py``'s
``small`` size), the language models with their causal LM loss. Classifiers have 10 classes
and random labels. Each problem gives its per-sample losses (``Problem.per_sample``); the
training loss is their mean. This module imports torch, so ``overhead_child.py`` imports it
only after measuring the RSS of ``import torch``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

N_CLASSES = 10
Batch = tuple[torch.Tensor, torch.Tensor]
PerSample = Callable[[Any, torch.Tensor], torch.Tensor]


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


class PostNormClassifier(nn.Module):
    """Token embedding and learned positions, post-norm encoder layers, mean pool, linear head.

    The post-norm transformer of issue 32: each layer is ``nn.TransformerEncoderLayer(
    norm_first=False, activation="gelu", batch_first=True, dropout=0.0)`` with an MLP of
    width ``4 * d_model`` and heads of width 32 (its output is already normalized, so no
    final LayerNorm). Positions are either an ``nn.Embedding`` over position ids expanded to
    ``[B, T]`` (``bare=False``, as :class:`GPTClassifier`) or a bare ``nn.Parameter``
    ``[T, d_model]`` added whole in ``forward`` and broadcast over the batch (``bare=True``;
    inputs have exactly ``seq_len`` tokens), initialized alike (``N(0, 1)``, ``nn.Embedding``'s
    default).
    """

    def __init__(
        self, vocab: int, seq_len: int, d_model: int, layers: int, classes: int, bare: bool
    ):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions: nn.Module | nn.Parameter = (
            nn.Parameter(torch.randn(seq_len, d_model)) if bare else nn.Embedding(seq_len, d_model)
        )
        self.blocks = nn.Sequential(
            *(
                nn.TransformerEncoderLayer(
                    d_model,
                    max(1, d_model // 32),
                    4 * d_model,
                    dropout=0.0,
                    activation="gelu",
                    batch_first=True,
                    norm_first=False,
                )
                for _ in range(layers)
            )
        )
        self.head = nn.Linear(d_model, classes)
        self.register_buffer("position_ids", torch.arange(seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, classes]`` of token ids ``[B, T]``."""
        if isinstance(self.positions, nn.Parameter):
            positions = self.positions  # [T, d], broadcast over the batch by the sum
        else:
            ids = self.position_ids[: tokens.shape[1]]
            positions = self.positions(ids.expand(len(tokens), -1))
        return self.head(self.blocks(self.tokens(tokens) + positions).mean(dim=1))


# name -> (vocab, seq_len, d_model, layers); vocabularies chosen for the sizes
TRANSFORMERS: dict[str, tuple[int, int, int, int]] = {
    "tf-small": (1000, 64, 128, 2),  # 534,282 parameters (issue: ~534k)
    "tf-medium": (2000, 128, 256, 4),  # 3,706,890 parameters (issue: ~3.7M)
}
# issue 32's post-norm transformer: name -> (vocab, seq_len, d_model, layers, batch, bare)
POST_NORM: dict[str, tuple[int, int, int, int, int, bool]] = {
    "tf-post": (1000, 48, 96, 3, 24, False),
    "tf-post-bare": (1000, 48, 96, 3, 24, True),
}
# the models of issue 28 (``real_models.py``): widths, layers, sequence length (ViT: patches
# of a 32x32 image), batch sizes; ``small`` steps take ~10 ms plain on 2 CPU threads
REAL_MODELS = ("gpt2", "nanogpt", "vit")
REAL_SIZES = {
    "small": {"d": 64, "layers": 2, "length": 64, "batch": 8, "vit_batch": 16},
    "medium": {"d": 128, "layers": 4, "length": 128, "batch": 16, "vit_batch": 32},
}
LM_VOCAB = 256


def classification_losses(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy ``[B]`` of logits ``[B, classes]`` and labels ``[B]``."""
    return F.cross_entropy(outputs, labels, reduction="none")


def causal_lm_losses(outputs: Any, ids: torch.Tensor) -> torch.Tensor:
    """Per-sample causal LM loss ``[B]``: each sample's mean next-token cross-entropy.

    ``outputs`` are logits ``[B, T, vocab]``, a ``transformers`` output with ``.logits`` or
    nanoGPT's ``(logits, loss)``; ``ids`` ``[B, T]``. Position ``t`` predicts ``ids[:, t + 1]``,
    so ``loss_b = mean_{t < T-1} -log softmax(logits[b, t])[ids[b, t + 1]]``; all samples have
    ``T - 1`` targets, so the mean of the ``loss_b`` is the mean over every token.
    """
    if hasattr(outputs, "logits"):
        logits = outputs.logits
    else:
        logits = outputs[0] if isinstance(outputs, tuple) else outputs
    flat = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
    )
    return flat.view(ids.shape[0], -1).mean(1)


class MeanLoss(nn.Module):
    """The training loss of a problem without a loss module: the mean of its per-sample losses."""

    def __init__(self, per_sample: PerSample):
        super().__init__()
        self.per_sample = per_sample

    def forward(self, outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        """``mean_b per_sample(outputs, targets)_b``."""
        return self.per_sample(outputs, targets).mean()


@dataclass(frozen=True)
class Problem:
    """A model factory, the batch size, a factory of one synthetic batch, and the loss.

    A batch is ``(inputs, targets)``: the model runs on ``inputs``, ``per_sample(outputs,
    targets)`` gives every sample's loss ``[B]`` and the training loss is their mean.
    ``classifier``: the outputs are logits ``[B, classes]`` of integer labels, so the loss
    is ``nn.CrossEntropyLoss()`` (a module BackPACK can extend); BackPACK's path, Cockpit
    1.0.2 and the per-sample-norm peers (``norm_peers.py``) need that.
    """

    name: str
    batch_size: int
    make_model: Callable[[], nn.Module]
    make_batch: Callable[[torch.Generator], Batch]
    description: str
    per_sample: PerSample = classification_losses
    classifier: bool = True

    def loss_module(self) -> nn.Module:
        """The training loss as a module ``loss(outputs, targets)``: the per-sample mean."""
        return nn.CrossEntropyLoss() if self.classifier else MeanLoss(self.per_sample)

    def losses(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Per-sample losses ``[B]`` of ``model`` on ``batch`` (differentiable)."""
        return self.per_sample(model(batch[0]), batch[1])


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
    def make(gen: torch.Generator) -> Batch:
        return (
            torch.randn(batch, *shape, generator=gen),
            torch.randint(0, N_CLASSES, (batch,), generator=gen),
        )

    return make


def _tokens(vocab: int, seq_len: int, batch: int):
    def make(gen: torch.Generator) -> Batch:
        return (
            torch.randint(0, vocab, (batch, seq_len), generator=gen),
            torch.randint(0, N_CLASSES, (batch,), generator=gen),
        )

    return make


def _lm_tokens(vocab: int, seq_len: int, batch: int):
    """Batches ``(ids, ids)``: a language model's inputs are its targets (shifted by the loss)."""

    def make(gen: torch.Generator) -> Batch:
        ids = torch.randint(0, vocab, (batch, seq_len), generator=gen)
        return ids, ids

    return make


def real_model_problem(name: str, size: str = "small") -> Problem:
    """``gpt2``, ``nanogpt`` or ``vit`` of issue 28 at ``size`` (``REAL_SIZES``).

    The models of ``cockpit_core.testing.models``: a ``transformers`` ``GPT2LMHeadModel``
    (2 heads) and a nanoGPT (4 heads) on random tokens of a vocabulary of 256 with the
    causal LM loss (:func:`causal_lm_losses`), and a ViT (patches 4x4 of 3x32x32 images, 4
    heads, 10 classes) with cross-entropy. The weights come from torch's global seed. The
    models are imported when built: Cockpit 1.0.2's environment (``kind`` ``reference`` of
    ``overhead_child.py``) imports this module but has no ``cockpit_core``.
    """
    dims = REAL_SIZES[size]
    d, layers, length, batch = dims["d"], dims["layers"], dims["length"], dims["batch"]
    if name == "vit":
        vit_batch = dims["vit_batch"]

        def make_vit() -> nn.Module:
            from cockpit_core.testing.models import ViT

            return ViT(image=32, patch=4, channels=3, d=d, heads=4, layers=layers, classes=10)

        text = f"ViT: 3x32x32 images, patches 4x4, d {d}, {layers} layers, 4 heads, 10 classes"
        return Problem(name, vit_batch, make_vit, _images((3, 32, 32), vit_batch), text)
    if name == "gpt2":

        def make_lm() -> nn.Module:
            from cockpit_core.testing.models import tiny_gpt2

            # tiny_gpt2 seeds torch itself: hand it the global seed
            return tiny_gpt2(
                seed=torch.initial_seed(), vocab=LM_VOCAB, positions=length, d=d, layers=layers
            )

        text = "transformers GPT2LMHeadModel (Conv1D, tied head, positions [1, T])"
    elif name == "nanogpt":

        def make_lm() -> nn.Module:
            from cockpit_core.testing.models import NanoGPT

            return NanoGPT(vocab=LM_VOCAB, block_size=length, d=d, heads=4, layers=layers)

        text = "nanoGPT (tied head, wpe(arange(T)), own LayerNorm)"
    else:
        raise ValueError(f"unknown model {name!r}: use {', '.join(REAL_MODELS)}")
    text += f": vocab {LM_VOCAB}, T {length}, d {d}, {layers} layers, causal LM loss"
    return Problem(
        name,
        batch,
        make_lm,
        _lm_tokens(LM_VOCAB, length, batch),
        text,
        per_sample=causal_lm_losses,
        classifier=False,
    )


def get_problem(name: str) -> Problem:
    """The problem called ``name`` (one of ``PROBLEMS``)."""
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
    if name in POST_NORM:
        vocab, seq_len, d_model, layers, batch, bare = POST_NORM[name]

        def make_post() -> nn.Module:
            return PostNormClassifier(vocab, seq_len, d_model, layers, N_CLASSES, bare)

        where = "a bare parameter [T, d]" if bare else "an nn.Embedding over position ids"
        text = (
            f"post-norm classifier: vocab {vocab}, T {seq_len}, d_model {d_model}, {layers} "
            f"layers, {max(1, d_model // 32)} heads, MLP {4 * d_model}, positions {where}"
        )
        return Problem(name, batch, make_post, _tokens(vocab, seq_len, batch), text)
    if name in REAL_MODELS:
        return real_model_problem(name)
    raise ValueError(f"unknown problem {name!r}: use {', '.join(PROBLEMS)}")


PROBLEMS = ("mlp", "cnn", *TRANSFORMERS, *POST_NORM, *REAL_MODELS)


def make_model(problem: str) -> nn.Module:
    """A fresh model of ``problem`` (weights from torch's global generator)."""
    return get_problem(problem).make_model()


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
