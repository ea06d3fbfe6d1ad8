"""Normalizing user input and output values: parameter lists, output keys, loggable values."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cockpit_core.errors import ConfigError, MisuseError
from cockpit_core.quantity import Quantity


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


def check_unique_keys(quantities: list[Quantity], source: str | None) -> None:
    """Raise :class:`ConfigError` if two quantities would write the same output key."""
    seen: dict[str, int] = {}
    errors = []
    for i, q in enumerate(quantities):
        if q.key in seen:
            errors.append(
                (
                    f"quantities.{i}",
                    f"'{q.key}' is tracked twice (also entry {seen[q.key]}); "
                    "give one of them a distinct 'label'",
                )
            )
        seen.setdefault(q.key, i)
    if errors:
        raise ConfigError(errors, source)


def to_serializable(value: Any) -> Any:
    """Convert tensors to numpy/floats (recursively) so that values can be logged."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.item() if value.ndim == 0 else value.numpy()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): to_serializable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_serializable(v) for v in value]
    return value
