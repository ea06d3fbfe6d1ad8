"""The ``DTensor`` type of sharded parameters (FSDP2), where this torch build has one."""

from __future__ import annotations

import torch

DTensor: type
try:  # torch builds without distributed support have no DTensor: nothing is sharded there
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - depends on the torch build

    class DTensor(torch.Tensor):  # type: ignore[no-redef]
        """Stands in for ``torch.distributed.tensor.DTensor``: no tensor is one."""


__all__ = ["DTensor"]
