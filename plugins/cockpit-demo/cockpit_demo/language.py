"""The GPT demo's task: a small nanoGPT learns a seeded order-2 Markov chain over 32 tokens.

Nothing is downloaded: the token stream is generated, the same on every machine, from a
fixed seed. Each token ``b`` has :data:`SUCCESSORS` possible successors; which of them
follows, and how likely, depends on the token before ``b`` as well:
``P(c | a, b) = probs[a, b, k]`` for ``c = successors[b, k]``. Predicting from the last token
alone leaves about 1.19 nats per token; the chain's own loss, reading the last two, is about
0.80 (:func:`load_token_windows` gives it per target), so a model must attend to the
previous position to get below the first. The stream is cut into windows of
:data:`BLOCK_SIZE` tokens (inputs) and the same windows shifted by one (next-token targets).

The model is cockpit's nanoGPT (:class:`cockpit_core.testing.models.NanoGPT`, written the way
nanoGPT writes it: ``wte`` tied to ``lm_head``, ``wpe(arange(T))``, a LayerNorm class of its
own, ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, a GELU MLP; its module
imports only torch), initialised as nanoGPT initialises it (:func:`make_gpt`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import NamedTuple

import torch

from cockpit_core.testing.models.nanogpt import NanoGPT

VOCAB = 32
"""Tokens of the chain."""

SUCCESSORS = 4
"""Tokens that may follow each token."""

TOKENS = 30_000
"""Length of the stream that is cut into windows."""

BLOCK_SIZE = 32
"""Tokens per window: the model's context."""

DATA_SEED = 31
"""Seed of the chain and of its stream (the data is the same for every ``--seed``)."""


@dataclass(frozen=True)
class MarkovChain:
    """An order-2 Markov chain whose successors depend on the last token only.

    Attributes:
        successors: ``[V, K]``: the tokens that may follow token ``b``.
        probs: ``[V, V, K]``: ``probs[a, b, k] = P(successors[b, k] | a, b)``.

    """

    successors: torch.Tensor
    probs: torch.Tensor

    @classmethod
    def seeded(
        cls, seed: int, vocab: int = VOCAB, successors: int = SUCCESSORS, sharpness: float = 2.0
    ) -> MarkovChain:
        """A random chain: successors drawn without replacement, ``softmax(sharpness * z)``.

        ``z`` is standard normal per ``(a, b, k)``; a larger ``sharpness`` makes the token
        before ``b`` more informative (a lower entropy).
        """
        gen = torch.Generator().manual_seed(seed)
        nxt = torch.stack([torch.randperm(vocab, generator=gen)[:successors] for _ in range(vocab)])
        z = torch.randn(vocab, vocab, successors, generator=gen, dtype=torch.float64)
        return cls(nxt, torch.softmax(sharpness * z, dim=-1))

    def sample(self, length: int, generator: torch.Generator) -> torch.Tensor:
        """``length`` tokens walked along the chain from two uniformly drawn tokens."""
        vocab = self.probs.shape[0]
        tokens = torch.randint(0, vocab, (2,), generator=generator).tolist()
        cumulative = self.probs.cumsum(-1).tolist()
        successors = self.successors.tolist()
        last = self.successors.shape[1] - 1  # guards a uniform above a rounded cumulative sum
        for u in torch.rand(max(0, length - 2), generator=generator, dtype=torch.float64).tolist():
            a, b = tokens[-2], tokens[-1]
            k = min(bisect.bisect_right(cumulative[a][b], u), last)
            tokens.append(successors[b][k])
        return torch.tensor(tokens[:length], dtype=torch.long)

    def nll(self, tokens: torch.Tensor) -> torch.Tensor:
        """``-log P(tokens[t] | tokens[t-2], tokens[t-1])`` for ``t >= 2`` (``inf``: impossible)."""
        a, b, c = tokens[:-2], tokens[1:-1], tokens[2:]
        match = self.successors[b] == c[:, None]  # [N, K]: where c sits among b's successors
        p = (self.probs[a, b] * match).sum(-1)
        return -p.log()


class TokenWindows(NamedTuple):
    """Windows of the stream: inputs, next-token targets and the chain's own loss.

    Attributes:
        x: ``[W, BLOCK_SIZE]`` token ids.
        y: ``[W, BLOCK_SIZE]``: the next token of each position of ``x``.
        nll: ``[W, BLOCK_SIZE]`` float64: the chain's ``-log P`` of each target given the
            two tokens before it (the best any model can do on average).

    """

    x: torch.Tensor
    y: torch.Tensor
    nll: torch.Tensor


def load_token_windows(
    tokens: int = TOKENS, block_size: int = BLOCK_SIZE, seed: int = DATA_SEED
) -> TokenWindows:
    """The stream of :meth:`MarkovChain.seeded` ``(seed)`` cut into non-overlapping windows.

    The first two tokens walked are dropped, so every token of a window has two tokens
    before it in the stream and the chain's loss is defined for every target.
    """
    chain = MarkovChain.seeded(seed)
    walk = chain.sample(tokens + 2, torch.Generator().manual_seed(seed))
    stream, nll = walk[2:], chain.nll(walk)  # nll[i] belongs to stream[i]
    count = (tokens - 1) // block_size
    end = count * block_size
    return TokenWindows(
        stream[:end].view(count, block_size),
        stream[1 : end + 1].view(count, block_size),
        nll[1 : end + 1].view(count, block_size),
    )


LAYERS = 2
"""Transformer blocks of the demo's GPT."""


def make_gpt() -> NanoGPT:
    """The demo's GPT: nanoGPT with 2 blocks, width 64, 4 heads, context 32, no dropout.

    Initialised as nanoGPT does it: every linear and embedding weight from ``N(0, 0.02^2)``,
    the residual projections (``c_proj``) from ``N(0, (0.02 / sqrt(2 * layers))^2)``, biases
    zero. With PyTorch's default ``N(0, 1)`` embedding, tied to the output head, the loss
    stays near ``ln 32`` for the first ~60 steps before it falls.
    """
    model = NanoGPT(vocab=VOCAB, block_size=BLOCK_SIZE, d=64, heads=4, layers=LAYERS)
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            torch.nn.init.normal_(p, mean=0.0, std=0.02 / (2 * LAYERS) ** 0.5)
    return model
