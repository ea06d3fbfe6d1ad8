"""Statistics of a Conv2d weight from its per-sample gradients, a block of samples at a time.

Forming a Conv2d weight's per-sample gradients ``[B, C_out, C_in, k_h, k_w]`` at once
takes tens of MB per layer (57 MB for the 3x3 96->128 convolution of the 3c3d network at
``B = 128``), and keeping those of every layer until the end of backward set the peak
memory of tracked steps. :func:`blocked_statistics` forms them a few MiB at a time
(:meth:`~cockpit_core.backends.per_sample.ConvGrads.blocks`) and computes every statistic
of the layer that can be combined over blocks in one pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cockpit_core.backends.per_sample import ConvGrads, FactoredLinearGrads, MaterializedGrads
from cockpit_core.requirements import Statistic


def _block_rule(stat: Statistic) -> str | None:
    """How ``stat`` combines over blocks of samples (``"cat"``, ``"sum"``; ``None``: not blocked)."""
    if stat.kind == "batch_l2" or (
        stat.kind == "transform" and stat.reduce == "gather" and stat.factored_fn is None
    ):
        return "cat"
    if stat.kind == "sum_grad_squared" or (stat.kind == "transform" and stat.reduce == "sum"):
        return "sum"
    return None


def _needs_whole(stat: Statistic) -> bool:
    """Whether ``stat`` needs a Conv2d weight's whole ``[B, *shape]`` tensor at once.

    Not curvature, projections, or transforms with a ``factored_fn`` (they get the
    :class:`ConvGrads` itself).
    """
    if stat.kind == "transform":
        return _block_rule(stat) is None and stat.factored_fn is None
    return stat.kind in ("batch_dot", "grad_batch")


def blocked_statistics(
    stats: Sequence[Statistic],
    p: torch.nn.Parameter,
    per_sample: MaterializedGrads | FactoredLinearGrads | ConvGrads | None,
    failures: dict[tuple[str, str], str],
) -> dict[tuple[str, str], Tensor | None]:
    """Statistics of a Conv2d weight from its per-sample gradients, a block of samples at a time.

    Over the blocks (:meth:`ConvGrads.blocks`), ``||g_n||^2`` and ``gather`` transforms
    are concatenated, ``sum_n g_n * g_n`` and ``sum`` transforms added (their last
    ``max_last`` entries combined by ``max``); transforms get each block through ``fn``.
    Empty unless ``per_sample`` is a :class:`ConvGrads` and no statistic needs the whole
    tensor (then all share it, as before). A statistic that raised maps to ``None``.
    """
    if not isinstance(per_sample, ConvGrads) or any(_needs_whole(s) for s in stats):
        return {}
    todo = [s for s in stats if _block_rule(s) is not None]
    parts: dict[tuple[str, str], list[Tensor]] = {s.identity: [] for s in todo}
    out: dict[tuple[str, str], Tensor | None] = {}
    # the blocks are kept for what projects on them later (cheaper than a convolution)
    keep = any(
        s.kind == "batch_projection" or (s.kind == "transform" and _block_rule(s) is None)
        for s in stats
    )
    for block in per_sample.blocks(keep=keep) if todo else ():
        for stat in todo:
            if stat.identity in out:  # raised on an earlier block
                continue
            try:
                value = _block_value(stat, block, p)
            except Exception as err:  # a failing transform must not break backward()
                failures.setdefault(stat.identity, f"{type(err).__name__}: {err}")
                out[stat.identity] = None
                continue
            acc = parts[stat.identity]
            if acc and _block_rule(stat) == "sum":
                acc[0] = _add(acc[0], value, stat.max_last)
            else:
                acc.append(value)
    for stat in todo:
        acc = parts[stat.identity]
        out.setdefault(stat.identity, acc[0] if len(acc) == 1 else torch.cat(acc))
    return out


def _block_value(stat: Statistic, block: Tensor, p: torch.nn.Parameter) -> Tensor:
    """``stat`` of the samples of one block (per-sample gradients ``[b, *shape]``)."""
    if stat.kind == "batch_l2":
        return block.flatten(1).pow(2).sum(1)
    if stat.kind == "sum_grad_squared":
        return block.pow(2).sum(0)
    return stat.fn(block, p.detach())  # type: ignore[misc]


def _add(a: Tensor, b: Tensor, max_last: int) -> Tensor:
    """``a + b``, except the last ``max_last`` entries: ``max(a, b)``."""
    if not max_last:
        return a + b
    return torch.cat([a[:-max_last] + b[:-max_last], torch.maximum(a[-max_last:], b[-max_last:])])
