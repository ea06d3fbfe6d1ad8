"""Reading an attention call: its queries, keys, scale and masks as :class:`Scores`.

Three kinds of calls are read (the functions of :data:`WATCHED`):

* ``F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
  enable_gqa)``, as nanoGPT and ``transformers``' ``attn_implementation="sdpa"`` call it:
  heads on dimension ``-3`` of a 4-D query (leading dimensions beyond are batch; a 3-D
  query is one head per batch entry), keys with as many heads, one, or a divisor of them
  (grouped-query attention);
* ``F.multi_head_attention_forward``, which ``nn.MultiheadAttention`` calls: the queries and
  keys are projected again from its arguments (the call computes them inside, unseen), its
  ``key_padding_mask`` and ``attn_mask`` (``True``: masked out) applied;
* a softmax over the last dimension inside an *attention module* (a module whose class, or a
  base class, is named ``*Attention``): the scores of explicit ("eager") attention, as
  ``transformers``' ``attn_implementation="eager"`` and nanoGPT without flash attention
  compute them, masks and biases already added; 4-D ``[B, H, L, S]``, or 3-D ``[B H, L, S]``
  in ``nn.MultiheadAttention``.

The attention dropout of a call does not change its scores and is ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from cockpit_attention.reduction import Scores

SDPA = F.scaled_dot_product_attention
MHA = F.multi_head_attention_forward
SOFTMAXES: tuple[Callable[..., Any], ...] = (F.softmax, torch.softmax, torch.Tensor.softmax)
WATCHED: tuple[Callable[..., Any], ...] = (SDPA, MHA, *SOFTMAXES)
"""The functions the ``attention`` probe watches."""

_SDPA_ARGS = (
    "query",
    "key",
    "value",
    "attn_mask",
    "dropout_p",
    "is_causal",
    "scale",
    "enable_gqa",
)
_MHA_ARGS = (
    "query",
    "key",
    "value",
    "embed_dim_to_check",
    "num_heads",
    "in_proj_weight",
    "in_proj_bias",
    "bias_k",
    "bias_v",
    "add_zero_attn",
    "dropout_p",
    "out_proj_weight",
    "out_proj_bias",
    "training",
    "key_padding_mask",
    "need_weights",
    "attn_mask",
    "use_separate_proj_weight",
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
    "static_k",
    "static_v",
)


class UnsupportedAttention(ValueError):
    """An attention call whose scores cannot be read (the message says why)."""


def is_attention_module(module: torch.nn.Module) -> bool:
    """Whether the class of ``module``, or one of its base classes, is named ``*Attention``."""
    return any(cls.__name__.endswith("Attention") for cls in type(module).__mro__)


def read_call(
    module: torch.nn.Module, function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Scores | None:
    """The scores of one watched call; ``None`` for a softmax that is not attention's.

    Raises:
        UnsupportedAttention: A call of ``F.multi_head_attention_forward`` with
            ``add_bias_kv``, ``add_zero_attn`` or ``static_k``.

    """
    if function is SDPA:
        return read_sdpa(dict(zip(_SDPA_ARGS, args), **kwargs))
    if function is MHA:
        return read_mha(dict(zip(_MHA_ARGS, args), **kwargs))
    return read_softmax(module, args, kwargs)


def _batched(t: Tensor) -> Tensor:
    """``[..., N, D]`` as ``[B, H, N, D]``: dimension -3 the heads, the ones before the batch."""
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t.unsqueeze(1)
    return t.flatten(0, -4) if t.dim() > 4 else t


def _mask4(mask: Tensor, lead: torch.Size) -> Tensor:
    """An SDPA mask, broadcastable to ``[*lead, L, S]``, as ``[1|B, 1|H, 1|L, 1|S]``."""
    while mask.dim() < len(lead) + 2:
        mask = mask.unsqueeze(0)
    if len(lead) > 2:  # several batch dimensions: broadcast them, then flatten
        mask = mask.expand(*lead[:-1], *mask.shape[-3:]).flatten(0, -4)
    elif len(lead) < 2:
        mask = mask.unsqueeze(1) if len(lead) == 1 else mask[None, None]
    return mask


def read_sdpa(a: dict[str, Any]) -> Scores:
    """The scores of ``F.scaled_dot_product_attention`` called with the arguments ``a``."""
    query, key = a["query"].detach(), a["key"].detach()
    lead = query.shape[:-2]
    q = _batched(query)
    k = key
    while k.dim() < query.dim():
        k = k.unsqueeze(0)
    if k.dim() > 4:
        k = k.expand(*lead[:-1], *k.shape[-3:])
    k = _batched(k)
    scale = a.get("scale")
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    mask = a.get("attn_mask")
    if mask is not None:
        mask = _mask4(mask.detach(), lead)
    # the output's batch and heads: what q, k and the mask broadcast to
    batch = max(q.shape[0], k.shape[0], 1 if mask is None else mask.shape[0])
    count = max(q.shape[1], k.shape[1], 1 if mask is None else mask.shape[1])
    q = q.expand(batch, count, *q.shape[2:])
    scores = Scores(q=q, k=k, scale=float(scale), causal=bool(a.get("is_causal", False)))
    if mask is not None and mask.dtype == torch.bool:
        scores.allowed = mask
    elif mask is not None:
        scores.bias = mask
    return scores


def read_mha(a: dict[str, Any]) -> Scores:
    """The scores of ``F.multi_head_attention_forward`` called with the arguments ``a``.

    The queries and keys are projected again from the call's inputs and weights.
    """
    for name, why in (
        ("bias_k", "add_bias_kv=True"),
        ("static_k", "static_k"),
        ("add_zero_attn", "add_zero_attn=True"),
    ):
        if a.get(name) is not None and a.get(name) is not False:
            raise UnsupportedAttention(
                f"nn.MultiheadAttention with {why} is not supported by the attention probe"
            )
    query, key = a["query"].detach(), a["key"].detach()
    heads = int(a["num_heads"])
    kpm = a.get("key_padding_mask")
    if query.dim() == 2:  # unbatched: [L, E]
        query, key = query.unsqueeze(1), key.unsqueeze(1)
        kpm = None if kpm is None else kpm.unsqueeze(0)
    length, batch, embed = query.shape
    bias = a.get("in_proj_bias")
    b_q, b_k = (None, None) if bias is None else bias.detach().chunk(3)[:2]
    if a.get("use_separate_proj_weight"):
        w_q, w_k = a["q_proj_weight"].detach(), a["k_proj_weight"].detach()
    else:
        w_q, w_k = a["in_proj_weight"].detach().chunk(3)[:2]
    head_dim = embed // heads
    q = F.linear(query, w_q, b_q).view(length, batch, heads, head_dim).permute(1, 2, 0, 3)
    k = F.linear(key, w_k, b_k)
    k = k.view(k.shape[0], batch, heads, head_dim).permute(1, 2, 0, 3)
    scores = Scores(q=q, k=k, scale=1.0 / math.sqrt(head_dim))
    for padding, mask in ((False, a.get("attn_mask")), (True, kpm)):
        if mask is None:
            continue
        mask = mask.detach()
        if padding:
            mask = mask.view(batch, 1, 1, mask.shape[-1])
        elif mask.dim() == 2:
            mask = mask[None, None]
        else:
            mask = mask.view(batch, heads, *mask.shape[-2:])
        if mask.dtype == torch.bool:  # True: masked out
            keep = ~mask
            scores.allowed = keep if scores.allowed is None else scores.allowed & keep
        else:
            scores.bias = mask if scores.bias is None else scores.bias + mask
    return scores


def read_softmax(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Scores | None:
    """The scores of a softmax over the keys in an attention module; ``None`` for another."""
    if not is_attention_module(module):
        return None
    x = args[0] if args else kwargs.get("input", kwargs.get("self"))
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if not isinstance(x, Tensor) or not isinstance(dim, int) or x.dim() < 3:
        return None
    if dim not in (-1, x.dim() - 1):
        return None
    x = x.detach()
    heads = getattr(module, "num_heads", None)
    if x.dim() == 3 and isinstance(module, torch.nn.MultiheadAttention) and isinstance(heads, int):
        x = x.view(x.shape[0] // heads, heads, *x.shape[1:])
    else:
        x = _batched(x)
    return Scores(logits=x)
