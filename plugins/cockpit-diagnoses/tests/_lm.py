"""A tiny language model that the tests of the LLM rules train into (or away from) trouble.

The model is cockpit's nanoGPT (:class:`cockpit_core.testing.models.NanoGPT`: pre-norm
blocks, causal ``scaled_dot_product_attention``, the token embedding tied to the output
head) in float64, trained with Adam on sequences of a random Markov chain over 16 tokens
in which each token has two equally likely successors (a loss of ``ln 2`` is the best).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cockpit_core import Cockpit
from cockpit_core.testing.models import NanoGPT

VOCAB, T, BATCH = 16, 16, 8
LR = 3e-3
"""Adam's learning rate of the healthy runs."""

Hook = Callable[[NanoGPT, int], None]
"""Called after the optimizer step of every step: ``hook(model, step)``."""


def successors(seed: int) -> torch.Tensor:
    """``[VOCAB, 2]``: the two tokens that may follow each token."""
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(VOCAB, generator=gen)[:2] for _ in range(VOCAB)])


def sequences(nxt: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of inputs ``[BATCH, T]`` and their next tokens, walked along the chain."""
    idx = torch.empty(BATCH, T + 1, dtype=torch.long)
    idx[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=gen)
    for t in range(T):
        pick = torch.randint(0, 2, (BATCH,), generator=gen)
        idx[:, t + 1] = nxt[idx[:, t], pick]
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()


def train_lm(
    quantities: list[Any],
    *,
    steps: int,
    seed: int = 0,
    heads: int = 2,
    jump: tuple[int, dict[str, float]] | None = None,
    hook: Hook | None = None,
    log: Path | None = None,
    **cockpit_options: Any,
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Train the tiny LM with Adam, cockpit tracking ``quantities``; return output and header.

    One param group per parameter, each at :data:`LR`; ``jump = (step, {name: factor})``
    multiplies the learning rate of the named parameters by ``factor`` from the update of
    ``step`` on (a learning rate far too high for one layer). ``hook`` runs after every
    optimizer step (e.g. to scale weights).
    """
    torch.manual_seed(seed)
    model = NanoGPT(vocab=VOCAB, block_size=T, heads=heads).double()
    named = list(model.named_parameters())  # the tied head is transformer.wte.weight
    opt = torch.optim.Adam([{"params": [p], "lr": LR} for _, p in named], lr=LR)
    nxt, gen = successors(seed), torch.Generator().manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cp = Cockpit(model, quantities, log=log, **cockpit_options)
        for step in range(steps):
            x, y = sequences(nxt, gen)
            _, loss = model(x, y)
            with cp(step, loss=loss):
                loss.backward()
            if jump is not None and step == jump[0]:
                for group, (name, _) in zip(opt.param_groups, named):
                    group["lr"] *= jump[1].get(name, 1.0)
            opt.step()
            opt.zero_grad()
            if hook is not None:
                hook(model, step)
        cp.close()
    return cp.get_output(), cp.header()


def scale_queries(layer: int, heads: list[int], factor: float, start: int) -> Hook:
    """A hook that multiplies the query weights of ``heads`` of block ``layer`` by ``factor``.

    From step ``start`` on, after each update: the logits ``q.k`` of those heads grow by
    ``factor`` per step and nothing else changes at that moment.
    """

    def hook(model: NanoGPT, step: int) -> None:
        if step < start:
            return
        attn = model.transformer.h[layer].attn  # type: ignore[index,union-attr]
        size = attn.d // attn.heads
        with torch.no_grad():
            for h in heads:
                attn.c_attn.weight[h * size : (h + 1) * size].mul_(factor)
                attn.c_attn.bias[h * size : (h + 1) * size].mul_(factor)

    return hook
