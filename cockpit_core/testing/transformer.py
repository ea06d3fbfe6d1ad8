"""A tiny transformer encoder classifier: a model BackPACK only partly supports.

Token embedding plus a learned positional embedding, one post-norm encoder layer
(multi-head self-attention, LayerNorm, GELU MLP), mean pooling and a linear head (Vaswani
et al., 2017, "Attention is all you need"). BackPACK's ``BatchGrad`` supports only the
``nn.Linear`` layers; every other parameter needs the ``torch.func`` path.
"""

from __future__ import annotations

import torch

from cockpit_core.testing.problems import Problem, prepared


class TinyTransformer(torch.nn.Module):
    """Embedding -> encoder layer (attention, LayerNorm, GELU MLP) -> mean pool -> linear.

    Args:
        vocab: Number of tokens.
        seq_len: Sequence length (positional embeddings).
        d_model: Width.
        heads: Attention heads.
        ff: Width of the MLP.
        classes: Output classes.

    """

    def __init__(
        self,
        vocab: int = 7,
        seq_len: int = 4,
        d_model: int = 4,
        heads: int = 2,
        ff: int = 8,
        classes: int = 3,
    ):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.pos = torch.nn.Parameter(0.1 * torch.randn(seq_len, d_model))
        self.encoder = torch.nn.TransformerEncoderLayer(
            d_model, heads, ff, dropout=0.0, activation="gelu", batch_first=True
        )
        self.head = torch.nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, classes]`` of token sequences ``[B, seq_len]``."""
        h = self.encoder(self.embed(tokens) + self.pos)
        logits: torch.Tensor = self.head(h.mean(dim=1))
        return logits


def tiny_transformer(
    batch_size: int = 6, seed: int = 0, extended: bool = True, **sizes: int
) -> Problem:
    """A :class:`TinyTransformer` classification problem on random tokens, float64.

    Args:
        batch_size: Size of every mini-batch.
        seed: Seed of the weights and the data.
        extended: Whether ``make_model`` extends the encoder and the head for BackPACK
            (then BackPACK computes the linear layers' statistics with ``backend="auto"``).
            The embedding is never extended: BackPACK's ``Embedding`` derivative builds its
            one-hot matrix in the default dtype and fails on a float64 model.
        sizes: Options of :class:`TinyTransformer`.

    """
    vocab, seq_len = sizes.get("vocab", 7), sizes.get("seq_len", 4)
    classes = sizes.get("classes", 3)

    def make() -> torch.nn.Module:
        torch.manual_seed(seed)
        model = TinyTransformer(**sizes).double()
        if extended:  # not the embedding: BackPACK's Embedding derivative fails in float64
            prepared(model.encoder)
            prepared(model.head)
        return model

    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, vocab, (48, seq_len), generator=gen)
    y = torch.randint(0, classes, (48,), generator=gen)
    return Problem("transformer", make, x, y, batch_size, "cross_entropy", seed)
