"""What a quantity reads from the forward pass: a :class:`Probe` of module outputs or calls.

A quantity declares probes in its :class:`~cockpit_core.Requirements`
(``Requirements(probes=(Probe(...),))``). On the steps it is tracked, the core puts a
forward hook on every module of the model that the probe selects and calls the probe's
``reduce`` on each output of the step's forward passes (before the ``with cp(...)`` block or
inside it). ``reduce`` runs on the output's device and returns small tensors, so nothing
waits for the device during the forward pass; the quantity reads the results with
:meth:`StepContext.probe <cockpit_core.context.StepContext.probe>` after ``backward`` and
moves them to the host once. Activation statistics, attention logits and output logits are
read this way (docs/writing_quantities.md, "Reading the forward pass").

A probe with ``functions`` reads calls of torch functions instead (the queries and keys of
``F.scaled_dot_product_attention``, which no module hook sees): ``reduce`` gets each call of
one of them as a :class:`FunctionCall`, with the innermost module of the model that was
running (:mod:`cockpit_core.observe.call_hooks`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

Select = Callable[[str, torch.nn.Module], bool]
"""``select(name, module)``: whether the probe reads ``module`` (``name`` as in
``model.named_modules()``, ``""`` for the model itself)."""

Reduce = Callable[[torch.nn.Module, tuple[Any, ...], Any], Any]
"""``reduce(module, inputs, output)``: what the probe keeps of one call of ``module``
(tensors on the output's device; no ``.item()``, no ``.cpu()``). For a probe with
``functions``: ``reduce(owner, call, result)`` with ``call`` a :class:`FunctionCall`."""


class FunctionCall(NamedTuple):
    """One call of a function that a probe watches: the ``inputs`` its ``reduce`` gets.

    Attributes:
        function: Which of the probe's ``functions`` was called.
        args: Its positional arguments.
        kwargs: Its keyword arguments.

    """

    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Probe:
    """A reduction of module outputs (or function calls) in the forward passes of a tracked step.

    Attributes:
        key: Unique name of the computation, including every option that changes the
            result (``"activations(rms,amax)"``); quantities that use the same key share
            one result, as for :func:`~cockpit_core.per_sample_transform`.
        select: Which modules it reads (:data:`Select`); with ``functions``, the owners
            whose calls it reads (a call whose innermost running module is not selected is
            not read, nor handed to an enclosing module).
        reduce: What it keeps of each call (:data:`Reduce`). An exception in it is recorded
            for the step (the quantity then fails with it) and training goes on.
        functions: Empty (the default): the probe reads the outputs of the selected
            modules. Else the torch functions whose calls it reads, as PyTorch hands them to
            a ``TorchFunctionMode`` (``F.softmax``, ``torch.softmax`` and
            ``torch.Tensor.softmax`` are three functions). A function PyTorch writes in
            Python on top of others (``F.multi_head_attention_forward``, ``F.softmax``) is
            one call; the calls it makes inside are not seen. When a forward pass was
            watched and made no call it reads, ``ctx.probe(key)`` is ``{}``.

    """

    key: str
    select: Select = field(compare=False, repr=False)
    reduce: Reduce = field(compare=False, repr=False)
    functions: tuple[Callable[..., Any], ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "functions", tuple(self.functions))
        if not all(callable(f) for f in self.functions):
            raise ValueError(f"Probe {self.key!r}: functions must be callables.")


@dataclass
class ProbeResults:
    """What the probes of one step recorded.

    Attributes:
        values: ``{probe key: {module name: [reduce(...) of each call, in call order]}}``;
            a module called several times in a step (gradient accumulation, a module
            used twice) has several entries.
        errors: ``{probe key: why it has no result}`` (a ``reduce`` raised, no model).

    """

    values: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def extend(self, other: ProbeResults) -> None:
        """Add ``other``'s calls after these (a later micro-batch of the same step)."""
        for key, modules in other.values.items():
            mine = self.values.setdefault(key, {})
            for name, calls in modules.items():
                mine.setdefault(name, []).extend(calls)
        for key, why in other.errors.items():
            self.errors.setdefault(key, why)


def to_host(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """The small device tensors a probe kept, as numpy arrays, with one copy per device.

    What ``compute`` does with probe results: the tensors of one device and dtype are
    flattened into one, copied to the host at once, and cut back into their shapes, in the
    order given (a device copy per tensor would wait for the device once per module).
    """
    out: list[np.ndarray] = [np.empty(0)] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    for indices in groups.values():
        flat = torch.cat([tensors[i].reshape(-1) for i in indices]).cpu().numpy()
        bounds = np.cumsum([tensors[i].numel() for i in indices])[:-1]
        for i, part in zip(indices, np.split(flat, bounds)):
            out[i] = part.reshape(tuple(tensors[i].shape))
    return out
