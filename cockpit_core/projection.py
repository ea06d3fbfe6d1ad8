"""Per-sample projections on the mini-batch gradient (``BATCH_PROJECTION``), after backward.

The inner-product and orthogonality tests (Bollapragada, Byrd & Nocedal, 2018) need each
sample's projection ``g_n . g`` on the mini-batch gradient ``g``. Under
``torch.distributed`` the mini-batch is the *global* batch, whose gradient is only known
once ``backward()`` returned and the processes exchanged their gradients. So the backend
keeps each layer's per-sample gradients in the compact form it already has
(:class:`DeferredGrads`), and the core projects them on the final gradient after backward:

    linear layer, g_n = d_n a_n^T:   g_n . G = d_n^T G a_n  (never forms B x out x in),
    any other layer:                 g_n . G = vec(g_n) . vec(G).

Only ``B`` numbers per parameter then cross process boundaries, never per-sample gradients.
:func:`~cockpit_core.requirements.per_sample_projection` generalises this to ``K``
directions computed from the final gradient (``[B, K]`` per parameter).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from cockpit_core.requirements import BATCH_PROJECTION as _PLAIN


class DeferredGrads:
    """One parameter's per-sample gradients, kept until the mini-batch gradient is known.

    Args:
        per_sample: The backend's per-sample gradient object: it has ``materialize()``
            (``[B, *shape]``), and for a linear weight the factors ``a`` (``[B, in]``) and
            ``d`` (``[B, out]``) with ``g_n = d_n a_n^T``.

    """

    def __init__(self, per_sample: Any):
        self.per_sample = per_sample

    def detach(self) -> DeferredGrads:
        """Itself (the backend detaches every statistic it stores)."""
        return self

    def project(self, grad: Tensor) -> Tensor:
        """``g_n . grad`` for every sample ``n``, shape ``[B]``."""
        return self.project_on(grad.unsqueeze(0))[:, 0]

    def project_on(self, vectors: Tensor) -> Tensor:
        """``g_n . V_k`` for ``vectors`` ``[K, *shape]``, shape ``[B, K]``."""
        dot = getattr(self.per_sample, "dot", None)
        if callable(dot):  # factored layers: without forming the per-sample gradients
            return dot(vectors)
        grads = self.per_sample.materialize()
        flat = grads.reshape(grads.shape[0], -1)
        return flat @ vectors.reshape(vectors.shape[0], -1).to(flat.dtype).T


def project(stat: Any, value: Any, grad: Tensor, param: Tensor) -> Tensor:
    """One parameter's projections: ``[B]`` for ``BATCH_PROJECTION``, ``[B, K]`` otherwise."""
    if stat.fn is None:
        return value.project(grad).detach()
    return value.project_on(stat.fn(grad, param.detach())).detach()


def resolve_projections(
    statistics: dict[tuple[str, str], list[Any]],
    grads: Sequence[Tensor],
    params: Sequence[Tensor] = (),
    declared: Sequence[Any] = (),
    missing: dict[tuple[str, str], str] | None = None,
) -> None:
    """Replace deferred projections by their values on the final gradient (in place).

    ``declared``: the step's statistics (for the directions of
    :func:`~cockpit_core.requirements.per_sample_projection`); without it only
    ``BATCH_PROJECTION`` is resolved. ``missing``: where a statistic whose directions
    failed is reported (it is then dropped from ``statistics``); without it, errors raise.
    """
    stats = [s for s in declared if s.kind == "batch_projection"] or [_PLAIN]
    for stat in stats:
        values = statistics.get(stat.identity)
        if values is None:
            continue
        try:
            for i, v in enumerate(values):
                if isinstance(v, Deferred):
                    param = params[i] if params else grads[i]  # BATCH_PROJECTION ignores it
                    values[i] = project(stat, v, grads[i], param)
        except Exception as err:
            if missing is None:
                raise
            del statistics[stat.identity]
            missing[stat.identity] = failed_directions(stat, err)


def failed_directions(stat: Any, err: Exception) -> str:
    """The message recorded when a projection's directions could not be computed."""
    return f"{stat.describe()}: computing its projection directions failed: {err!r}"


class DeferredConcat:
    """Deferred per-sample gradients of several micro-batches, projected in sample order."""

    def __init__(self, parts: Sequence[Any]):
        self.parts = list(parts)

    def detach(self) -> DeferredConcat:
        """Itself."""
        return self

    def project(self, grad: Tensor) -> Tensor:
        """``g_n . grad`` for the samples of all micro-batches, concatenated."""
        return torch.cat([p.project(grad) for p in self.parts])

    def project_on(self, vectors: Tensor) -> Tensor:
        """``g_n . V_k`` for the samples of all micro-batches, ``[B, K]``."""
        return torch.cat([p.project_on(vectors) for p in self.parts])


#: The deferred forms a backend or the accumulation leaves for the core to project.
Deferred = (DeferredGrads, DeferredConcat)
