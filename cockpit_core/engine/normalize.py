"""Normalizing user input and output values: parameter lists and loggable values."""

from __future__ import annotations

from typing import Any

import torch

from cockpit_core.errors import ConfigError, MisuseError
from cockpit_core.log import clean_value, unserializable_notes


def split_params(params: Any) -> tuple[list[torch.nn.Parameter], list[str]]:
    """Parameters and names from a module, named parameters or bare parameters (named by index).

    Raises:
        ConfigError: No parameters, or something that is not a tensor.
        MisuseError: A parameter does not require gradients.

    """
    if isinstance(params, torch.nn.Module):
        params = params.named_parameters()
    items = list(params)
    if not items:
        raise ConfigError([("params", "no parameters given: pass model.named_parameters()")])
    if all(isinstance(x, tuple) and len(x) == 2 for x in items):
        names, ps = [str(n) for n, _ in items], [p for _, p in items]
    else:
        ps, names = items, [str(i) for i in range(len(items))]
    for n, p in zip(names, ps):
        if not isinstance(p, torch.Tensor):
            raise ConfigError([("params", f"'{n}' is a {type(p).__name__}, not a torch parameter")])
    frozen = [n for n, p in zip(names, ps) if not p.requires_grad]
    if frozen:
        raise MisuseError(
            f"parameters {frozen} do not require gradients, so no statistics can be computed "
            "for them. Pass only trainable parameters: "
            "[(n, p) for n, p in model.named_parameters() if p.requires_grad]."
        )
    return ps, names


def to_serializable(value: Any) -> Any:
    """A loggable copy of a quantity's value; total: it never raises.

    Tensors become numpy arrays (bfloat16/float8 as float32, complex32 as complex64,
    sparse as dense; 0-d ones as Python numbers), numpy scalars Python numbers, tuples and
    sets lists, dict keys strings. What cannot be logged faithfully (meta tensors, cycles,
    arbitrary objects, ...) becomes a placeholder string ``"<unserializable: why>"``;
    :func:`serialization_notes` lists those, and the Cockpit records an ``error`` record
    (phase ``serialize``) for each value that holds one. The full mapping is in
    ``docs/log_format.md``.
    """
    return clean_value(value)


def serialization_notes(value: Any) -> list[str]:
    """What of a value returned by :func:`to_serializable` will not be logged faithfully."""
    return unserializable_notes(value)
