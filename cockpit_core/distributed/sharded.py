"""Sharded parameters (``DTensor``: FSDP2's ``fully_shard``, tensor parallelism): refused.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) every parameter is a ``DTensor``
holding one shard per process; its gradient is reduce-scattered into a sharded ``DTensor``
too. Cockpit's distributed combination (:mod:`cockpit_core.distributed.batch`) assumes
replicated parameters and gradients (DDP), so it does not run on them: a step of a
Cockpit whose tracked parameters include a ``DTensor`` issues no collective of its own,
and every quantity scheduled at that step is recorded as failed with
:data:`REASON` (one warning per Cockpit); training goes on.

The decision depends only on the parameters' types, which are the same on every process
(``fully_shard`` is applied to the same modules everywhere), so every process refuses
the same steps and none is left waiting in a collective that another one skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

_SHARDED: tuple[type, ...]
try:  # torch builds without distributed support have no DTensor: nothing is sharded there
    from torch.distributed.tensor import DTensor

    _SHARDED = (DTensor,)
except ImportError:  # pragma: no cover - depends on the torch build
    _SHARDED = ()

REASON = (
    "the tracked parameters are DTensors (sharded, e.g. by FSDP2's fully_shard or tensor "
    "parallelism): cockpit does not yet combine sharded statistics, so it computes no "
    "quantity on them and issues no collective (docs/distributed.md#fsdp-fully_shard)"
)
"""Why every quantity of a step with sharded parameters is recorded as failed."""


def sharded_names(params: Iterable[Tensor], names: Iterable[str]) -> list[str]:
    """The names of those of ``params`` that are ``DTensor`` s (empty if none is)."""
    return [n for p, n in zip(params, names) if isinstance(p, _SHARDED)]


def refusal(
    params: Sequence[Tensor], names: Sequence[str], model: torch.nn.Module | None = None
) -> str | None:
    """Why no quantity runs on ``params``, or ``None`` if neither they nor ``model`` are sharded.

    ``model`` (the attached model, if any) catches a Cockpit built before ``fully_shard``,
    which replaced the parameters it tracks by ``DTensor`` s.
    """
    found = sharded_names(params, names)
    if found:
        more = f" and {len(found) - 1} more" if len(found) > 1 else ""
        return f"{REASON} (sharded: '{found[0]}'{more})."
    if model is not None and any(isinstance(p, _SHARDED) for p in model.parameters()):
        return (
            f"{REASON} (the model's parameters were sharded after the Cockpit was built, so "
            "it tracks parameters the model no longer holds: build it after fully_shard)."
        )
    return None


__all__ = ["REASON", "refusal", "sharded_names"]
