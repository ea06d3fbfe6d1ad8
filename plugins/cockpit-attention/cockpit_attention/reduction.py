"""Max logit and entropy of one attention call's scores, exact or from sampled queries.

The scores of a call are described by :class:`Scores` (see :mod:`cockpit_attention.calls`
for how each kind of call is read). :func:`reduce_scores` computes, per head, the largest
logit over the batch, the queries and the unmasked keys, and the sum of the entropies of the
attention distributions of the queries; piece by piece (at most ``chunk`` logits at a time),
on the device of the inputs, without synchronizing with the host.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_ELEMENTS = 2**22
"""Most logits formed at once (16 MiB in float32; a few temporaries of that size live at
the same time)."""


@dataclass
class Scores:
    """The pre-softmax scores of one attention call, heads on dimension 1.

    Either ``q`` and ``k`` (the logits are ``q k^T * scale``, formed here) or ``logits``
    (formed by the model, masks and biases already added) are given.

    Attributes:
        q: Queries ``[B, H, L, E]``.
        k: Keys ``[Bk, Hk, S, E]`` with ``Bk`` 1 or ``B`` and ``Hk`` dividing ``H`` (query
            head ``h`` reads key head ``h // (H // Hk)``, grouped-query attention).
        scale: The factor of ``q k^T``.
        allowed: Boolean mask of the keys a query may attend to (``True``: it takes part),
            broadcastable to ``[B, H, L, S]`` as ``[1 or B, 1 or H, 1 or L, 1 or S]``.
        bias: Float mask added to the logits, broadcastable alike; a key whose bias is
            ``-inf`` or below half the lowest finite number of its dtype (``finfo.min``
            stands for ``-inf`` in many models) is masked.
        causal: Whether query ``i`` sees only keys ``j <= i`` (top-left aligned, as
            ``is_causal=True`` of ``scaled_dot_product_attention``).
        logits: Given scores ``[B, H, L, S]``: a key whose score is ``-inf`` or below half
            the lowest finite number of the dtype is masked.

    """

    q: Tensor | None = None
    k: Tensor | None = None
    scale: float = 1.0
    allowed: Tensor | None = None
    bias: Tensor | None = None
    causal: bool = False
    logits: Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(B, H, L, S)``."""
        if self.logits is not None:
            b, h, length, s = self.logits.shape
            return b, h, length, s
        assert self.q is not None and self.k is not None
        b, h, length, _ = self.q.shape
        return b, h, length, self.k.shape[2]

    @property
    def device(self) -> torch.device:
        """Where the scores are."""
        source = self.logits if self.logits is not None else self.q
        assert source is not None
        return source.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the inputs."""
        source = self.logits if self.logits is not None else self.q
        assert source is not None
        return source.dtype


class AttentionCall(NamedTuple):
    """What the probe keeps of one attention call.

    Attributes:
        stats: float64 ``[4, H]`` on the call's device: per head the largest logit, the
            (estimated) sum of the entropies over the queries, the variance of that estimate
            (0 when every query was used) and the (estimated) number of queries with at
            least one unmasked key.
        sampled: Queries sampled per (sample, head), ``None`` when every query was used.

    """

    stats: Tensor
    sampled: int | None


def _lowest(dtype: torch.dtype) -> float:
    """Scores at or below this are masked: half the lowest finite number of ``dtype``."""
    return torch.finfo(dtype).min / 2


def reduce_scores(
    scores: Scores,
    max_elements: int,
    queries: int,
    generator: Callable[[torch.device], torch.Generator],
    chunk: int = CHUNK_ELEMENTS,
    entropy: bool = True,
) -> AttentionCall:
    """Per head: the largest logit and the entropies of the attention distributions.

    With ``q`` and ``k`` and more than ``max_elements`` logits (``B H L S``), only
    ``queries`` query positions per (sample, head) are used, drawn uniformly without
    replacement with ``generator(device)``; the entropy sum over all queries is then
    estimated as ``L / m`` times the sum over the ``m`` drawn ones, with the variance of
    that estimate (the within-sample variance of the drawn entropies, finite-population
    corrected). Given ``logits`` are always read in full (the model formed them).

    Logits are formed in float64 for float64 inputs and in float32 otherwise, with
    autocast off, at most ``chunk`` at a time. Without ``entropy`` only the largest logit
    is taken (no softmax, :func:`_max_logits`); the entropy sums and row counts stay 0
    (the entropy reads NaN).
    """
    b, h, length, s = scores.shape
    device = scores.device
    if not b * h * length * s:  # no query or no key: no logit, no distribution
        empty = torch.zeros(4, h, dtype=torch.float64, device=device)
        empty[0] = -torch.inf
        return AttentionCall(empty, None)
    acc = torch.float64 if scores.dtype == torch.float64 else torch.float32
    exact = scores.logits is not None or b * h * length * s <= max_elements
    m = length if exact or queries >= length else queries
    index = None
    if m < length:
        draws = torch.rand(b, h, length, generator=generator(device), device=device)
        index = draws.topk(m, dim=-1).indices  # [B, H, m]: m distinct positions
    if not entropy:
        top = _max_logits(scores, acc, m, index, chunk)
        stats = F.pad(top.double().unsqueeze(0), (0, 0, 0, 3))  # [top, 0, 0, 0]
        return AttentionCall(stats, None if m == length else m)
    top = torch.full((h,), -torch.inf, dtype=acc, device=device)
    sums = torch.zeros(3, b, h, dtype=torch.float64, device=device)  # sum e, sum e^2, rows
    with _autocast_off(device):
        for bs, hs, rs in _blocks(b, h, m, s, chunk):
            z, soft, allowed = _block(scores, acc, bs, hs, rs, index)
            # without a bias the softmax input is the masked logits: no second masked copy
            if scores.bias is None or scores.logits is not None:
                masked = soft
            else:
                masked = z.masked_fill(~allowed, -torch.inf)
            top[hs] = torch.maximum(top[hs], masked.amax((0, 2, 3)))
            p = torch.softmax(soft, dim=-1)
            valid = allowed.any(dim=-1)  # [b, h, r]
            h_rows = -torch.special.xlogy(p, p).sum(-1).masked_fill(~valid, 0.0).double()
            sums[0, bs, hs] += h_rows.sum(-1)
            sums[1, bs, hs] += h_rows.square().sum(-1)
            sums[2, bs, hs] += valid.sum(-1).double()
    if m == length:
        zero = torch.zeros(h, dtype=torch.float64, device=device)
        stats = torch.stack([top.double(), sums[0].sum(0), zero, sums[2].sum(0)])
        return AttentionCall(stats, None)
    factor = length / m
    spread = (sums[1] - sums[0].square() / m) / (m - 1)  # sample variance per (sample, head)
    variance = (length**2 * (1.0 - m / length) / m * spread.clamp_min(0.0)).sum(0)
    stats = torch.stack([top.double(), factor * sums[0].sum(0), variance, factor * sums[2].sum(0)])
    return AttentionCall(stats, m)


def _max_logits(
    scores: Scores, acc: torch.dtype, m: int, index: Tensor | None, chunk: int
) -> Tensor:
    """Per head, the largest unmasked logit, in ``acc``: :func:`reduce_scores` without entropy.

    The same blocks and the same products ``q k^T`` as with the entropy, with fewer kernels
    per block: the scale is applied to each block's maximum instead of to every logit
    (rounding is monotone, so for a positive scale ``max_j(fl(z_j s)) = fl(s max_j z_j)``
    exactly), the masks are applied in place to the fresh product, and no softmax input is
    formed. Given logits go through :func:`_block` as with the entropy.
    """
    b, h, _, s = scores.shape
    scaled_after = scores.logits is None and 0.0 < scores.scale < math.inf
    parts: dict[int, Tensor] = {}  # first head of the block -> its maximum so far
    with _autocast_off(scores.device):
        for bs, hs, rs in _blocks(b, h, m, s, chunk):
            if scores.logits is not None:
                _, masked, _ = _block(scores, acc, bs, hs, rs, index)
            else:
                masked = _masked_products(scores, acc, bs, hs, rs, index, scaled_after)
            top = masked.amax((0, 2, 3))
            if scaled_after:
                top = top * scores.scale
            first = hs.start
            parts[first] = top if first not in parts else torch.maximum(parts[first], top)
    if len(parts) == 1:
        return next(iter(parts.values()))
    return torch.cat([parts[first] for first in sorted(parts)])


def _masked_products(
    scores: Scores,
    acc: torch.dtype,
    bs: slice,
    hs: slice,
    rs: slice,
    index: Tensor | None,
    scaled_after: bool,
) -> Tensor:
    """``q k^T`` of one block (times the scale unless ``scaled_after``), ``-inf`` where masked.

    The same logits and mask as :func:`_block`, formed with as few kernels as possible.
    """
    rows = None if index is None else index[bs, hs, rs]
    qb, kb = _queries_keys(scores, bs, hs, rs, rows)
    z = torch.matmul(qb.to(acc), kb.to(acc).transpose(-1, -2))
    if not scaled_after:
        z = z * scores.scale
    b, h, r, s = z.shape
    start = 0 if rs.start is None else rs.start
    if scores.causal and rows is None and scores.allowed is None and scores.bias is None:
        # zero the future keys, then add -inf to them: the same values as masked_fill (a
        # NaN or inf there is zeroed first), at a tenth of its cost on a CPU
        future = torch.full((r, s), -torch.inf, dtype=z.dtype, device=z.device).triu_(start + 1)
        return z.tril_(start).add_(future)
    blocked: Tensor | None = None  # True: masked out
    if scores.causal:
        if rows is None:
            blocked = torch.ones(r, s, dtype=torch.bool, device=z.device).triu_(start + 1)
        else:
            blocked = torch.arange(s, device=z.device) > rows.unsqueeze(-1)
    if scores.allowed is not None:
        refused = ~_mask_block(scores.allowed, bs, hs, rs, rows, (b, h, r, s))
        blocked = refused if blocked is None else blocked | refused
    if scores.bias is not None:
        bias = _mask_block(scores.bias, bs, hs, rs, rows, (b, h, r, s))
        refused = ~(bias > _lowest(bias.dtype))
        blocked = refused if blocked is None else blocked | refused
    if blocked is not None:
        z.masked_fill_(blocked, -torch.inf)
    return z


def _queries_keys(
    scores: Scores, bs: slice, hs: slice, rs: slice, rows: Tensor | None
) -> tuple[Tensor, Tensor]:
    """The queries ``[b, h, r, E]`` and keys ``[1|b, h, S, E]`` of one block."""
    q, k = scores.q, scores.k
    assert q is not None and k is not None
    qb = _part(_part(q, 0, bs), 1, hs)
    qb = _part(qb, 2, rs) if rows is None else _take_rows(qb, rows)
    kb = _part(k, 0, bs) if k.shape[0] > 1 else k
    heads = q.shape[1]
    if k.shape[1] == heads:
        kb = _part(kb, 1, hs)
    else:  # grouped-query attention (or one key head for all)
        group = heads // k.shape[1]
        owner = torch.arange(heads, device=k.device)[hs] // group
        kb = kb.index_select(1, owner)
    return qb, kb


def _part(t: Tensor, dim: int, part: slice) -> Tensor:
    """``t`` sliced along ``dim`` by ``part`` (a step-1 slice); ``t`` itself if it is whole."""
    start = 0 if part.start is None else part.start
    stop = t.shape[dim] if part.stop is None else min(part.stop, t.shape[dim])
    if start == 0 and stop == t.shape[dim]:
        return t
    return t.narrow(dim, start, stop - start)


def _autocast_off(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Autocast off on ``device`` inside (entered only if it is on: entering costs ~7 µs)."""
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _blocks(b: int, h: int, r: int, s: int, chunk: int) -> Iterator[tuple[slice, slice, slice]]:
    """Slices of (samples, heads, query rows) with at most ``chunk`` logits (one row at least)."""
    if h * r * s <= chunk:
        nb, nh, nr = max(1, chunk // (h * r * s)), h, r
    elif r * s <= chunk:
        nb, nh, nr = 1, max(1, chunk // (r * s)), r
    else:
        nb, nh, nr = 1, 1, max(1, chunk // s)
    for b0 in range(0, b, nb):
        for h0 in range(0, h, nh):
            for r0 in range(0, r, nr):
                yield slice(b0, b0 + nb), slice(h0, h0 + nh), slice(r0, r0 + nr)


def _block(
    scores: Scores,
    acc: torch.dtype,
    bs: slice,
    hs: slice,
    rs: slice,
    index: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(logits, softmax input, allowed)`` of one block, each ``[b, h, r, S]``.

    ``logits`` is ``q k^T * scale`` (or the given scores), the softmax input adds the bias
    and is ``-inf`` where a key is masked.
    """
    rows = None if index is None else index[bs, hs, rs]  # [b, h, r] positions
    if scores.logits is not None:
        x = scores.logits[bs, hs]
        x = x[:, :, rs] if rows is None else _take_rows(x, rows)
        z = x.to(acc)
        allowed = z > _lowest(scores.logits.dtype)
        return z, z.masked_fill(~allowed, -torch.inf), allowed
    q = scores.q
    assert q is not None
    qb, kb = _queries_keys(scores, bs, hs, rs, rows)
    z = torch.matmul(qb.to(acc), kb.to(acc).transpose(-1, -2)) * scores.scale
    b, h, r, s = z.shape
    allowed = torch.ones(1, 1, 1, s, dtype=torch.bool, device=z.device)
    if scores.causal:
        position = (
            torch.arange(q.shape[2], device=z.device)[rs].view(1, 1, -1, 1)
            if rows is None
            else rows.unsqueeze(-1)
        )
        allowed = allowed & (torch.arange(s, device=z.device) <= position)
    if scores.allowed is not None:
        allowed = allowed & _mask_block(scores.allowed, bs, hs, rs, rows, (b, h, r, s))
    soft = z
    if scores.bias is not None:
        bias = _mask_block(scores.bias, bs, hs, rs, rows, (b, h, r, s))
        allowed = allowed & (bias > _lowest(bias.dtype))
        soft = z + bias.to(acc)
    allowed = allowed.expand(b, h, r, s)
    return z, soft.masked_fill(~allowed, -torch.inf), allowed


def _take_rows(x: Tensor, rows: Tensor) -> Tensor:
    """``x[n, j, rows[n, j, i], :]`` for ``x`` of shape ``[b, h, L, D]``."""
    return torch.gather(x, 2, rows.unsqueeze(-1).expand(*rows.shape, x.shape[-1]))


def _mask_block(
    mask: Tensor,
    bs: slice,
    hs: slice,
    rs: slice,
    rows: Tensor | None,
    shape: tuple[int, int, int, int],
) -> Tensor:
    """The part of a broadcastable ``[1|B, 1|H, 1|L, 1|S]`` mask for one block."""
    b, h, r, s = shape
    part = mask[bs] if mask.shape[0] > 1 else mask
    part = part[:, hs] if part.shape[1] > 1 else part
    if part.shape[2] == 1:
        return part
    if rows is None:
        return part[:, :, rs]
    full = part.expand(b, h, part.shape[2], part.shape[3])
    return _take_rows(full, rows)
