"""What a quantity reads from the forward pass: a :class:`Probe` of module outputs.

A quantity declares probes in its :class:`~cockpit_core.Requirements`
(``Requirements(probes=(Probe(...),))``). On the steps it is tracked, the core puts a
forward hook on every module of the model that the probe selects and calls the probe's
``reduce`` on each output of the step's forward passes (before the ``with cp(...)`` block or
inside it). ``reduce`` runs on the output's device and returns small tensors, so nothing
waits for the device during the forward pass; the quantity reads the results with
:meth:`StepContext.probe <cockpit_core.context.StepContext.probe>` after ``backward`` and
moves them to the host once. Activation statistics, attention logits and output logits are
read this way (docs/writing_quantities.md, "Reading the forward pass").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

Select = Callable[[str, torch.nn.Module], bool]
"""``select(name, module)``: whether the probe reads ``module`` (``name`` as in
``model.named_modules()``, ``""`` for the model itself)."""

Reduce = Callable[[torch.nn.Module, tuple, Any], Any]
"""``reduce(module, inputs, output)``: what the probe keeps of one call of ``module``
(tensors on the output's device; no ``.item()``, no ``.cpu()``)."""


@dataclass(frozen=True)
class Probe:
    """A reduction of module outputs in the forward passes of a tracked step.

    Attributes:
        key: Unique name of the computation, including every option that changes the
            result (``"activations(rms,amax)"``); quantities that use the same key share
            one result, as for :func:`~cockpit_core.per_sample_transform`.
        select: Which modules it reads (:data:`Select`).
        reduce: What it keeps of each call (:data:`Reduce`). An exception in it is recorded
            for the step (the quantity then fails with it) and training goes on.

    """

    key: str
    select: Select = field(compare=False, repr=False)
    reduce: Reduce = field(compare=False, repr=False)


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
