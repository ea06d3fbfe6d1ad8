"""Which modules ``activations`` reads, and the tensor it reads of a module's output."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn

NORM_SUFFIXES = ("LayerNorm", "RMSNorm")
"""Class-name endings of normalization layers written outside ``torch.nn`` (nanoGPT's
``LayerNorm``, ``LlamaRMSNorm``, ``T5LayerNorm``, ...)."""

LINEAR_CLASS_NAMES = ("Conv1D",)
"""Linear layers that do not subclass ``nn.Linear``: ``transformers``' ``Conv1D`` (GPT-2)."""


def _norm_classes() -> tuple[type[nn.Module], ...]:
    rms = getattr(nn, "RMSNorm", None)  # torch >= 2.4
    return (nn.LayerNorm,) if rms is None else (nn.LayerNorm, rms)


def is_linear(module: nn.Module) -> bool:
    """``nn.Linear`` (and subclasses) or a linear layer known by class name (``Conv1D``)."""
    return isinstance(module, nn.Linear) or type(module).__name__ in LINEAR_CLASS_NAMES


def is_norm(module: nn.Module) -> bool:
    """``nn.LayerNorm``, ``nn.RMSNorm`` or a class whose name ends in LayerNorm/RMSNorm."""
    return isinstance(module, _norm_classes()) or type(module).__name__.endswith(NORM_SUFFIXES)


def class_names(module: nn.Module) -> set[str]:
    """Names of the module's class and of its base classes (``Linear`` for a subclass)."""
    return {cls.__name__ for cls in type(module).__mro__}


class ModuleSelection:
    """The ``select(name, module)`` of the ``activations`` probe.

    Without ``types`` and ``names`` it picks the default modules: every *block* (an element
    of an ``nn.ModuleList``: its name's last part is a number and its parent is a
    ``ModuleList``, as GPT-2's and nanoGPT's ``transformer.h.0`` or ``nn.TransformerEncoder``'s
    ``layers.0``), every linear layer (:func:`is_linear`) and every normalization layer
    (:func:`is_norm`). With ``types`` and/or ``names`` it picks the modules that match every
    given filter: ``types`` a class name of the module or of a base class, ``names`` an
    ``fnmatch`` pattern (case-sensitive; ``*`` matches across dots) of the qualified name.

    Blocks are recognised from their parent, which ``select`` only sees as an earlier call:
    the core calls it in the order of ``model.named_modules()`` (a parent before its
    children, the model itself, ``""``, first), so the object remembers the names of the
    ``ModuleList`` modules it has seen since the last call with ``""``.

    Args:
        types: Class names, or ``None`` for no filter on classes.
        names: Name patterns, or ``None`` for no filter on names.

    """

    def __init__(self, types: Sequence[str] | None = None, names: Sequence[str] | None = None):
        self.types = None if types is None else frozenset(types)
        self.names = None if names is None else tuple(names)
        self.module_lists: set[str] = set()

    def __call__(self, name: str, module: nn.Module) -> bool:
        """Whether the probe reads ``module`` (``name`` as in ``model.named_modules()``)."""
        if name == "":
            self.module_lists.clear()
        if isinstance(module, nn.ModuleList):
            self.module_lists.add(name)
        if self.types is None and self.names is None:
            return self.is_block(name) or is_linear(module) or is_norm(module)
        if self.types is not None and not self.types & class_names(module):
            return False
        return self.names is None or any(fnmatchcase(name, p) for p in self.names)

    def is_block(self, name: str) -> bool:
        """Whether ``name`` is an element of a ``ModuleList`` seen before."""
        parent, _, last = name.rpartition(".")
        return name != "" and last.isdigit() and parent in self.module_lists


def first_tensor(output: Any) -> torch.Tensor | None:
    """The tensor ``activations`` reads of a module's output, ``None`` if it has none.

    The output itself if it is a floating-point tensor; for a tuple or list the first item
    that is one; for a mapping (``transformers``' ``ModelOutput``, a dict) the first value
    that is one (a ``ModelOutput`` leaves out the fields that are ``None``, so for a model
    called with labels that is the loss). Nested containers are not searched.
    """
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    if isinstance(output, Mapping):
        items: Any = output.values()
    elif isinstance(output, (tuple, list)):
        items = output
    else:
        return None
    for item in items:
        if isinstance(item, torch.Tensor) and item.is_floating_point():
            return item
    return None
