"""``nn.MultiheadAttention``: its projections are functional calls, so the rule computes them.

``nn.MultiheadAttention.forward`` calls ``F.multi_head_attention_forward`` with its
parameters; the input projection (``in_proj_weight``, or ``q/k/v_proj_weight``) and the
output projection (``out_proj``, whose own ``forward`` never runs) are ``F.linear`` calls
inside it, invisible to module hooks. While the provider observes the module it
intercepts that call (a ``TorchFunctionMode`` entered around the module's forward) and
computes it here with the same operations in the same order, so outputs, attention
weights, dropout masks (the same random draws) and gradients are PyTorch's own (Vaswani
et al., 2017, "Attention is all you need", for the computation). Each projection's input
and output are recorded; their per-sample gradients are those of linear layers
(:mod:`cockpit_hooks.rules.linear`, Goodfellow, 2015):

    g_n(W_in) = sum_t d_nt a_nt^T  over the products that used rows of W_in,
    g_n(W_out) = sum_t d_nt o_nt^T  with o the heads' concatenated outputs.

In self-attention the packed projection is one product; when only the key is the value
the query rows and the key/value rows are two products, otherwise three (rows a product
did not use get zero output gradients, which keeps the factored form).

Supported: batched or unbatched inputs, ``batch_first`` either way, masks, ``is_causal``,
dropout, ``need_weights``, separate projection weights (``kdim``/``vdim``). Not supported
(the parameters go to another provider): ``add_bias_kv``, ``add_zero_attn``; calls with
``static_k``/``static_v`` are computed by PyTorch and their statistics reported missing.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from cockpit_core import PerSampleGrads
from cockpit_hooks.rules.base import Piece, Rule, Use
from cockpit_hooks.rules.linear import LinearInput, bias_grads, weight_grads

_SIGNATURE = inspect.signature(F.multi_head_attention_forward)


def _seq_first(t: Tensor) -> Tensor:
    """``[T, B, ...]`` -> ``[B, T, ...]`` (a view)."""
    return t.transpose(0, 1)


class AttentionRule(Rule):
    """``nn.MultiheadAttention`` without ``bias_k``/``bias_v`` and ``add_zero_attn``."""

    modules = (torch.nn.MultiheadAttention,)
    intercepts = staticmethod(F.multi_head_attention_forward)

    def supports(self, module: torch.nn.Module) -> str | None:
        """No extra key/value biases, no zero attention."""
        if module.bias_k is not None or module.bias_v is not None:
            return "add_bias_kv=True is not supported by the module-hook rule"
        if module.add_zero_attn:
            return "add_zero_attn=True is not supported by the module-hook rule"
        return None

    def owned(self, module: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
        """Its projections' parameters, the output projection's included."""
        out_proj = cast(torch.nn.MultiheadAttention, module).out_proj  # the rule's modules
        own = [(module, n) for n, _ in module.named_parameters(recurse=False)]
        return own + [(out_proj, n) for n, _ in out_proj.named_parameters()]

    def per_sample(
        self, owner: torch.nn.Module, attr: str, pieces: list[Piece], batch_size: int
    ) -> PerSampleGrads:
        """Linear-layer per-sample gradients of a projection's weight or bias."""
        shape = getattr(owner, attr).shape
        if attr.endswith("bias"):
            return bias_grads(pieces, batch_size, shape)
        return weight_grads(pieces, batch_size, shape)

    def intercept(
        self,
        module: torch.nn.Module,
        record: Callable[[Use], None],
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``F.multi_head_attention_forward`` with every projection recorded."""
        bound = _SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if (
            a["bias_k"] is not None
            or a["bias_v"] is not None
            or a["add_zero_attn"]
            or a["static_k"] is not None
            or a["static_v"] is not None
        ):
            return func(*args, **kwargs)
        return _forward(cast(torch.nn.MultiheadAttention, module), record, **a)


def _linear(
    record: Callable[[Use], None],
    params: tuple[tuple[torch.nn.Module, str], ...],
    x: Tensor,
    w: Tensor,
    b: Tensor | None,
    rows: slice | None,
    bias_rows: slice | None,
    to_batch_first: Callable[[Tensor], Tensor],
) -> Tensor:
    """``F.linear(x, w, b)``, recorded as a use of ``params`` (rows of packed parameters)."""
    out = F.linear(x, w, b)
    if out.requires_grad:
        saved = LinearInput(
            to_batch_first(x).detach(),
            rows,
            to_batch_first,
            "the input of MultiheadAttention",
            bias_rows,
        )
        present = tuple((m, n) for m, n in params if getattr(m, n, None) is not None)
        record(Use(present, saved, out))
    return out


def _split(proj: Tensor, parts: int, e: int) -> tuple[Tensor, ...]:
    """``[..., parts * e]`` -> ``parts`` contiguous ``[..., e]`` tensors (PyTorch's layout)."""
    proj = proj.unflatten(-1, (parts, e)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
    return tuple(proj[i] for i in range(parts))


def _forward(
    module: torch.nn.MultiheadAttention,
    record: Callable[[Use], None],
    query: Tensor,
    key: Tensor,
    value: Tensor,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Tensor | None,
    in_proj_bias: Tensor | None,
    bias_k: Tensor | None,
    bias_v: Tensor | None,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: Tensor,
    out_proj_bias: Tensor | None,
    training: bool = True,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Tensor | None = None,
    k_proj_weight: Tensor | None = None,
    v_proj_weight: Tensor | None = None,
    static_k: Tensor | None = None,
    static_v: Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The operations of ``F.multi_head_attention_forward`` (PyTorch 2.x) for this rule."""
    # a private helper of torch.nn.functional that its .pyi stub does not declare
    is_batched = F._mha_shape_check(  # type: ignore[attr-defined]
        query, key, value, key_padding_mask, attn_mask, num_heads
    )
    if not is_batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    key_padding_mask = F._canonical_mask(
        mask=key_padding_mask,
        mask_name="key_padding_mask",
        other_type=F._none_or_dtype(attn_mask),
        other_name="attn_mask",
        target_type=query.dtype,
    )
    if is_causal and attn_mask is None:
        raise RuntimeError(
            "Need attn_mask if specifying the is_causal hint. You may use the Transformer "
            "module method `generate_square_subsequent_mask` to create this mask."
        )
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None
    else:
        attn_mask = F._canonical_mask(
            mask=attn_mask,
            mask_name="attn_mask",
            other_type=None,
            other_name="",
            target_type=query.dtype,
            check_other=False,
        )
        if key_padding_mask is not None:
            is_causal = False
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim or embed_dim != embed_dim_to_check:
        raise AssertionError(f"embed_dim {embed_dim} does not fit num_heads {num_heads}")

    # input projections, as F._in_projection(_packed) computes them, each recorded with
    # its rows of the packed weight and bias
    e = embed_dim
    rows = slice(0, e), slice(e, 2 * e), slice(2 * e, 3 * e)
    if not use_separate_proj_weight:
        if in_proj_weight is None:  # checked as F.multi_head_attention_forward does
            raise AssertionError("use_separate_proj_weight is False but in_proj_weight is None")
        own = (module, "in_proj_weight"), (module, "in_proj_bias")
        if key is value and query is key:  # self-attention: one packed product
            proj = _linear(record, own, query, in_proj_weight, in_proj_bias, None, None, _seq_first)
            q, k, v = _split(proj, 3, e)
        elif key is value:  # key is value: the query's rows, then one product for both
            w_q, w_kv = in_proj_weight.split([e, 2 * e])
            b_q, b_kv = (None, None) if in_proj_bias is None else in_proj_bias.split([e, 2 * e])
            kv_rows = slice(e, 3 * e)
            q = _linear(record, own, query, w_q, b_q, rows[0], rows[0], _seq_first)
            kv = _linear(record, own, key, w_kv, b_kv, kv_rows, kv_rows, _seq_first)
            k, v = _split(kv, 2, e)
        else:
            b_q, b_k, b_v = (None,) * 3 if in_proj_bias is None else in_proj_bias.chunk(3)
            w_q, w_k, w_v = in_proj_weight.chunk(3)
            q, k, v = (
                _linear(record, own, x, w, b, r, r, _seq_first)
                for x, w, b, r in zip((query, key, value), (w_q, w_k, w_v), (b_q, b_k, b_v), rows)
            )
    else:
        if q_proj_weight is None:  # checked as F.multi_head_attention_forward does
            raise AssertionError("use_separate_proj_weight is True but q_proj_weight is None")
        if k_proj_weight is None:
            raise AssertionError("use_separate_proj_weight is True but k_proj_weight is None")
        if v_proj_weight is None:
            raise AssertionError("use_separate_proj_weight is True but v_proj_weight is None")
        b_q, b_k, b_v = (None,) * 3 if in_proj_bias is None else in_proj_bias.chunk(3)
        proj_weights = (q_proj_weight, k_proj_weight, v_proj_weight)
        names = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
        q, k, v = (
            _linear(record, ((module, n), (module, "in_proj_bias")), x, w, b, None, r, _seq_first)
            for x, w, b, r, n in zip(
                (query, key, value), proj_weights, (b_q, b_k, b_v), rows, names
            )
        )

    if attn_mask is not None and attn_mask.dim() == 2:
        attn_mask = attn_mask.unsqueeze(0)
    q = q.view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = k.view(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
    v = v.view(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
    src_len = k.size(1)
    if key_padding_mask is not None:
        key_padding_mask = (
            key_padding_mask.view(bsz, 1, 1, src_len)
            .expand(-1, num_heads, -1, -1)
            .reshape(bsz * num_heads, 1, src_len)
        )
        attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
    if not training:
        dropout_p = 0.0

    out_params = (module.out_proj, "weight"), (module.out_proj, "bias")

    def out_batch_first(t: Tensor) -> Tensor:
        return t.view(tgt_len, bsz, t.shape[-1]).transpose(0, 1)

    if need_weights:
        _, _, e_head = q.shape
        q_scaled = q * math.sqrt(1.0 / float(e_head))
        if attn_mask is not None:
            weights = torch.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1))
        else:
            weights = torch.bmm(q_scaled, k.transpose(-2, -1))
        weights = F.softmax(weights, dim=-1)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        attn = torch.bmm(weights, v)
        attn = attn.transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = _linear(
            record, out_params, attn, out_proj_weight, out_proj_bias, None, None, out_batch_first
        )
        out = out.view(tgt_len, bsz, out.size(1))
        weights = weights.view(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not is_batched:
            out, weights = out.squeeze(1), weights.squeeze(0)
        return out, weights
    if attn_mask is not None:
        if attn_mask.size(0) == 1 and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(0)
        else:
            attn_mask = attn_mask.view(bsz, num_heads, -1, src_len)
    q = q.view(bsz, num_heads, tgt_len, head_dim)
    k = k.view(bsz, num_heads, src_len, head_dim)
    v = v.view(bsz, num_heads, src_len, head_dim)
    attn = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    attn = attn.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = _linear(
        record, out_params, attn, out_proj_weight, out_proj_bias, None, None, out_batch_first
    )
    out = out.view(tgt_len, bsz, out.size(1))
    if not is_batched:
        out = out.squeeze(1)
    return out, None
