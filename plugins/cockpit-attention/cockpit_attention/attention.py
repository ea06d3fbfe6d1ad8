"""Attention logits and entropy per layer and head: the ``attention`` quantity."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from functools import cached_property
from typing import Any, cast

import numpy as np
import torch
from pydantic import Field

from cockpit_attention.calls import WATCHED, is_attention_module, read_call
from cockpit_attention.reduction import AttentionCall, reduce_scores
from cockpit_core import (
    FunctionCall,
    Probe,
    Quantity,
    QuantityConfig,
    Requirements,
    StepContext,
    UnsupportedModelError,
)
from cockpit_core.observe.probe import to_host


class AttentionConfig(QuantityConfig):
    """Options of :class:`Attention`."""

    max_elements: int = Field(
        2**24,
        ge=1,
        description="Largest number of logits (batch x heads x queries x keys) of one "
        "attention call that is recomputed in full; beyond it, 'queries' query positions "
        "per (sample, head) are sampled. Logits a model forms itself (explicit softmax "
        "attention) are always read in full.",
    )
    queries: int = Field(
        64,
        ge=2,
        description="Query positions sampled per (sample, head), uniformly without "
        "replacement, when a call has more than 'max_elements' logits; the output's "
        "'sampled' says so and 'entropy_se' gives the standard error of the entropy.",
    )
    seed: int = Field(
        0,
        ge=0,
        description="Seed of the generator that samples the query positions (one generator "
        "per device, seeded once; later steps draw on from it).",
    )
    entropy: bool = Field(
        True,
        description="Also compute the attention entropy (a softmax of every logit). Off, "
        "only the largest logit is taken, at about half the cost; 'entropy', "
        "'entropy_se' and 'min_entropy' are then NaN (the health preset does this).",
    )
    names: list[str] | None = Field(
        None,
        min_length=1,
        description="Read only the attention calls whose owner (the innermost module "
        "running) has a qualified name matching one of these fnmatch patterns, e.g. "
        "['transformer.h.*']; '*' also matches dots. Default: every attention call.",
    )


class NameFilter:
    """``select(name, module)``: every module, or those whose name matches a pattern."""

    def __init__(self, patterns: Sequence[str] | None, attention_only: bool = False):
        self.patterns = None if patterns is None else tuple(patterns)
        self.attention_only = attention_only

    def __call__(self, name: str, module: torch.nn.Module) -> bool:
        """Whether ``module`` (called ``name`` in the model) is read."""
        if self.attention_only and not is_attention_module(module):
            return False
        return self.patterns is None or any(fnmatchcase(name, p) for p in self.patterns)


def _ran(module: torch.nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
    """The module probe only notes that an attention module ran."""
    return None


class Attention(Quantity):
    """Largest pre-softmax logit and mean attention entropy, per attention layer and head.

    For each attention call of the step's forward passes, with queries ``q_i``, keys
    ``k_j``, the call's ``scale`` (``1/sqrt(head dim)`` by default) and its mask (``m_ij``
    additive, ``-inf`` for a masked key; causal masks, boolean and additive masks, key
    padding masks), per head:

    * ``max_logit = max_{n,i,j unmasked} q_i . k_j * scale`` over the batch ``n``, the
      queries ``i`` and the unmasked keys ``j``;
    * ``entropy = mean_{n,i} H(p_ni)`` in nats, with ``p_ni = softmax_j(q_i . k_j * scale +
      m_ij)`` and ``H(p) = -sum_j p_j log p_j`` (between 0, all weight on one key, and
      ``log S`` for ``S`` keys, uniform attention).

    A layer is the module that owns the call (the innermost module running: ``attn`` of a
    GPT-2 or nanoGPT block, an ``nn.MultiheadAttention``); its calls in a step (micro-batches)
    are pooled. The calls read are ``F.scaled_dot_product_attention`` (whose fused kernels
    never form the logits: they are recomputed from ``q`` and ``k``),
    ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``; ``q`` and ``k`` are
    projected again) and the softmax of explicit attention inside a module named
    ``*Attention`` (see :mod:`cockpit_attention.calls`). Beyond ``max_elements`` logits per
    call, ``queries`` query positions per (sample, head) are sampled: the max is then over
    those queries (a lower bound), and the entropy an unbiased estimate with standard error
    ``entropy_se``.

    Attention-logit growth precedes divergence of large Transformers (Wortsman et al.,
    *Small-scale proxies for large-scale Transformer training instabilities*, 2023),
    prevented by normalizing queries and keys (qk-layernorm: Dehghani et al., *Scaling
    Vision Transformers to 22 Billion Parameters*, 2023); attention-entropy collapse goes
    with unstable training (Zhai et al., *Stabilizing Transformer Training by Preventing
    Attention Entropy Collapse*, 2023).
    """

    name = "attention"
    Config = AttentionConfig
    config: AttentionConfig

    @cached_property
    def probe(self) -> Probe:
        """The probe of the attention calls; its key holds every option."""
        c = self.config
        key = (
            f"attention(max_elements={c.max_elements},queries={c.queries},seed={c.seed},"
            f"entropy={c.entropy},names={c.names})"
        )
        generators: dict[torch.device, torch.Generator] = {}

        def generator(device: torch.device) -> torch.Generator:
            if device not in generators:
                generators[device] = torch.Generator(device=device).manual_seed(c.seed)
            return generators[device]

        def reduce(
            owner: torch.nn.Module, inputs: tuple[Any, ...], output: Any
        ) -> AttentionCall | None:
            call = cast(FunctionCall, inputs)
            scores = read_call(owner, call.function, call.args, call.kwargs)
            if scores is None:
                return None
            return reduce_scores(scores, c.max_elements, c.queries, generator, entropy=c.entropy)

        return Probe(key, NameFilter(c.names), reduce, functions=WATCHED)

    @cached_property
    def modules_probe(self) -> Probe:
        """Notes which attention modules (classes named ``*Attention``) ran."""
        names = self.config.names
        return Probe(f"attention_modules(names={names})", NameFilter(names, True), _ran)

    def requirements(self) -> Requirements:
        """The probe of the calls and the probe of the attention modules."""
        return Requirements(probes=(self.probe, self.modules_probe))

    def compute(self, ctx: StepContext) -> dict[str, Any]:
        """The step's value (:func:`summarize`).

        Raises:
            UnsupportedModelError: An attention module ran, but no call in it could be read
                (its kernel hides the logits), or the probe failed.

        """
        found: dict[str, list[AttentionCall]] = {}
        for owner, calls in ctx.probe(self.probe.key).items():
            kept = [c for c in calls if c is not None]
            if kept:
                found[owner] = kept
        try:
            ran = ctx.probe(self.modules_probe.key)
        except UnsupportedModelError:  # no attention module ran
            ran = {}
        hidden = [
            m for m in ran if not any(o == m or o.startswith(m + ".") or m == "" for o in found)
        ]
        if hidden:
            listed = ", ".join(f"'{m}'" for m in hidden[:4]) + (" ..." if len(hidden) > 4 else "")
            raise UnsupportedModelError(
                f"attention module(s) {listed} ran, but made no call cockpit can read "
                "(F.scaled_dot_product_attention, F.multi_head_attention_forward, or a "
                "softmax over the keys of [batch, heads, queries, keys] scores): their "
                "attention kernel hides the logits (transformers' flash_attention_2 or "
                "flex_attention, an external kernel). Use attn_implementation='sdpa' or "
                "'eager', or leave them out with the option names=[...]."
            )
        return summarize(found)


def _to_host(stats: list[torch.Tensor]) -> list[np.ndarray]:
    """The calls' statistics on the host: one stack and one copy when they share a shape."""
    first = stats[0] if stats else None
    if first is not None and all(
        t.shape == first.shape and t.device == first.device and t.dtype == first.dtype
        for t in stats
    ):
        return list(torch.stack(stats).cpu().numpy())
    return to_host(stats)


def summarize(found: dict[str, list[AttentionCall]]) -> dict[str, Any]:
    """The output of :class:`Attention` from each layer's calls (one copy to the host).

    ``{"modules", "heads", "max_logit", "entropy", "entropy_se", "max", "min_entropy",
    "sampled"}``: the per-head values as lists (one per layer, in the order the layers'
    first calls came) of floats (one per head); ``entropy_se`` is 0 for a layer whose every
    query was used. Without any attention call the lists are empty and ``max`` and
    ``min_entropy`` NaN.
    """
    host = _to_host([c.stats for calls in found.values() for c in calls])
    heads, max_logit, entropy, entropy_se = [], [], [], []
    sampled = [c.sampled for calls in found.values() for c in calls if c.sampled is not None]
    start = 0
    for owner, calls in found.items():
        widths = {c.stats.shape[1] for c in calls}
        if len(widths) != 1:
            raise ValueError(
                f"the attention calls of '{owner}' in one step have different numbers of "
                f"heads ({sorted(widths)}); give each attention its own module"
            )
        stats = np.stack(host[start : start + len(calls)])  # [calls, 4, H]
        start += len(calls)
        heads.append(int(stats.shape[2]))
        max_logit.append(stats[:, 0].max(0).tolist())
        rows = stats[:, 3].sum(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            entropy.append((stats[:, 1].sum(0) / rows).tolist())
            entropy_se.append((np.sqrt(stats[:, 2].sum(0)) / rows).tolist())
    flat_max = [v for layer in max_logit for v in layer]
    flat_entropy = [v for layer in entropy for v in layer]
    return {
        "modules": list(found),
        "heads": heads,
        "max_logit": max_logit,
        "entropy": entropy,
        "entropy_se": entropy_se,
        "max": float(np.max(flat_max)) if flat_max else float("nan"),
        "min_entropy": float(np.min(flat_entropy)) if flat_entropy else float("nan"),
        "sampled": max(sampled) if sampled else None,
    }
