"""The definition, brute force: per head, max logit and mean entropy of softmax(q k^T s + m)."""

from __future__ import annotations

import math

import numpy as np
import torch


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    allowed: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(max_logit[H], entropy[H])`` by loops over samples, heads and queries, in float64.

    Args:
        q: Queries ``[B, H, L, E]``.
        k: Keys ``[B, H, S, E]`` (one per query head).
        scale: Factor of the dot products.
        allowed: Which keys each query may see, broadcastable to ``[B, H, L, S]``.
        bias: Added to the logits before the softmax (``-inf``: masked), broadcastable alike.

    """
    q64, k64 = q.detach().double().numpy(), k.detach().double().numpy()
    b, h, length, _ = q64.shape
    s = k64.shape[2]
    shape = (b, h, length, s)
    keep = np.ones(shape, bool)
    if allowed is not None:
        keep = np.broadcast_to(allowed.detach().numpy(), shape)
    add = np.zeros(shape)
    if bias is not None:
        add = np.broadcast_to(bias.detach().double().numpy(), shape)
    max_logit = np.full(h, -np.inf)
    entropy = np.zeros(h)
    for head in range(h):
        total = 0.0
        for n in range(b):
            for i in range(length):
                logits = np.array(
                    [float(np.dot(q64[n, head, i], k64[n, head, j])) * scale for j in range(s)]
                )
                seen = keep[n, head, i] & (add[n, head, i] > -np.inf)
                max_logit[head] = max(max_logit[head], logits[seen].max())
                z = logits[seen] + add[n, head, i][seen]
                p = np.exp(z - z.max())
                p /= p.sum()
                total += -sum(x * math.log(x) for x in p if x > 0)
        entropy[head] = total / (b * length)
    return max_logit, entropy


def heads(x: torch.Tensor, count: int) -> torch.Tensor:
    """``[B, T, count * d]`` as ``[B, count, T, d]``."""
    b, t, c = x.shape
    return x.view(b, t, count, c // count).transpose(1, 2)


def causal(length: int, keys: int | None = None) -> torch.Tensor:
    """``[L, S]``: query ``i`` sees keys ``j <= i``."""
    return torch.ones(length, keys or length, dtype=torch.bool).tril()


def assert_layer(value: dict, layer: int, expected: tuple[np.ndarray, np.ndarray]) -> None:
    """The ``attention`` value of one layer equals the reference (float64: rtol 1e-9)."""
    np.testing.assert_allclose(value["max_logit"][layer], expected[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(value["entropy"][layer], expected[1], rtol=1e-9, atol=1e-12)
    assert value["heads"][layer] == len(expected[0])
