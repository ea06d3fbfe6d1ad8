"""``nn.Embedding``: ``y_nt = W[i_nt]``, so ``g_n(W)[v] = sum_{t: i_nt = v} d_nt``.

The per-sample gradients are sparse: sample ``n`` touches at most ``T`` rows of the ``V x
dim`` weight. :class:`~cockpit_core.EmbeddingGrads` sums the rows a sample touches and
computes norms, sums of squares, Gram matrices and projections from them alone. The
padding row (``padding_idx``) receives no gradient, as in PyTorch's backward.

The lookup is a linear layer with one-hot inputs ``a_nt = e_{i_nt}`` (Goodfellow, 2015,
"Efficient per-example gradient computations": ``g_n = sum_t d_nt a_nt^T``, here stored
by rows). ``max_norm`` renormalizes the looked-up rows in place before the lookup,
outside autograd, so the formula holds for the renormalized weight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from cockpit_core import EmbeddingGrads, PerSampleGrads
from cockpit_hooks.rules.base import Piece, Rule, Use, batch_first, first_input


class EmbeddingRule(Rule):
    """``nn.Embedding`` (dense gradients, no frequency scaling)."""

    modules = (torch.nn.Embedding,)

    def supports(self, module: torch.nn.Module) -> str | None:
        """Not ``scale_grad_by_freq`` (it mixes the samples) nor ``sparse`` gradients."""
        if module.scale_grad_by_freq:
            return (
                "scale_grad_by_freq=True scales each row's gradient by its frequency in the "
                "whole batch, which mixes the samples"
            )
        if module.sparse:
            return "sparse=True gives sparse gradients"
        return None

    def uses(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Tensor
    ) -> list[Use]:
        """The looked-up indices; the gradient of the looked-up rows completes the use."""
        return [Use(((module, "weight"),), first_input(args, kwargs).detach(), output)]

    def per_sample(
        self, owner: torch.nn.Module, attr: str, pieces: list[Piece], batch_size: int
    ) -> PerSampleGrads:
        """Sparse rows: the rows each sample looked up, with its output gradients summed."""
        indices, grads = [], []
        for saved, grad in pieces:
            idx = batch_first(saved, batch_size, f"the input of {type(owner).__name__}")
            indices.append(idx.reshape(batch_size, -1))
            grads.append((grad * batch_size).reshape(batch_size, -1, grad.shape[-1]))
        embedding = cast(torch.nn.Embedding, owner)  # the rule's module type
        return EmbeddingGrads(
            torch.cat(indices, dim=1),
            torch.cat(grads, dim=1),
            embedding.num_embeddings,
            embedding.padding_idx,
        )


class EmbeddingSubclassRule(EmbeddingRule):
    """Subclasses of ``nn.Embedding``, e.g. Gemma's word embedding (``F.embedding(...) * scale``).

    A subclass may change what its ``forward`` does around the lookup, so the module's
    output is not the looked-up rows: the rule intercepts the ``F.embedding`` call on the
    module's own weight inside ``forward`` and observes that call's output. A ``forward``
    that looks rows up otherwise leaves the weight's gradient unexplained, which the
    provider's mean check reports.
    """

    label = "Embedding"
    intercepts = staticmethod(F.embedding)

    def handles(self, module: torch.nn.Module) -> bool:
        """Strict subclasses of ``nn.Embedding`` (the exact type has :class:`EmbeddingRule`)."""
        return isinstance(module, torch.nn.Embedding) and type(module) is not torch.nn.Embedding

    def intercept(
        self,
        module: torch.nn.Module,
        record: Callable[[Use], None],
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """The lookup, its use recorded when it reads the module's own weight."""
        out = func(*args, **kwargs)
        indices = args[0] if args else kwargs.get("input")
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        if weight is getattr(module, "weight", None) and isinstance(indices, Tensor):
            if isinstance(out, Tensor):
                record(Use(((module, "weight"),), indices.detach(), out))
        return out
