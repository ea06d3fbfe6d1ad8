"""Which rule serves which tracked parameter of a model (decided when the model is attached).

Every module with a dedicated rule (:data:`cockpit_hooks.rules.RULES`) claims the
parameters the rule owns. A parameter claimed through several modules (tied weights, e.g.
an embedding reused as the output head) gets one *serving* per module; its per-sample
gradient is the sum of theirs (:class:`cockpit_core.TiedGrads`). The own parameters of
any other module are *direct* parameters: the provider captures them where the forward
pass broadcasts them into the batch (:mod:`cockpit_hooks.broadcast`), and, unless the
module is the model itself, the generic rule can re-run their module per sample
(:mod:`cockpit_hooks.rules.generic`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cockpit_hooks.recording import sequence_first_modules
from cockpit_hooks.rules import GENERIC, Rule, rule_for


@dataclass(frozen=True)
class Serving:
    """One module's rule serving one parameter.

    Attributes:
        rule: The rule.
        module: The module whose forward is observed.
        owner: The module that registers the parameter.
        attr: The parameter's attribute in ``owner``.

    """

    rule: Rule
    module: torch.nn.Module
    owner: torch.nn.Module
    attr: str


@dataclass(frozen=True)
class Direct:
    """A parameter its own module uses directly in ``forward`` (no dedicated rule).

    Attributes:
        module: The module that registers it.
        attr: Its attribute there.
        generic: The generic rule's serving, or ``None`` for the model itself (re-running
            it would be a second pass of the model).

    """

    module: torch.nn.Module
    attr: str
    generic: Serving | None


@dataclass
class Servings:
    """How each tracked parameter (by index) is served, or why it is not."""

    rules: dict[int, list[Serving]] = field(default_factory=dict)
    direct: dict[int, Direct] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)

    def modules(self, i: int) -> list[torch.nn.Module]:
        """The modules whose forward passes parameter ``i`` needs observed."""
        if i in self.rules:
            return [s.module for s in self.rules[i]]
        direct = self.direct.get(i)
        if direct is not None and direct.generic is not None:
            return [direct.module]
        return []

    def serves(self, i: int) -> bool:
        """Whether parameter ``i`` is served at all."""
        return i in self.rules or i in self.direct

    def rule_of(self, module: torch.nn.Module) -> Rule | None:
        """The rule that observes ``module`` (dedicated or generic)."""
        for servings in self.rules.values():
            for s in servings:
                if s.module is module:
                    return s.rule
        for direct in self.direct.values():
            if direct.generic is not None and direct.module is module:
                return direct.generic.rule
        return None


def find_servings(model: torch.nn.Module, index: dict[int, int]) -> Servings:
    """The servings of the tracked parameters (``index``: ``id(parameter) -> index``)."""
    out = Servings()
    sequence_first = sequence_first_modules(model)
    candidates: dict[int, tuple[torch.nn.Module, str, str | None]] = {}
    for module in model.modules():
        rule = rule_for(module)
        why = sequence_first.get(module)
        if rule is not None:
            refusal = why or rule.supports(module)
            if refusal is None or why is not None or not rule.generic_fallback:
                _claim(out, index, rule, module, refusal)
                continue
            why = None  # the dedicated rule declines this configuration: generic rule
        for attr, p in module.named_parameters(recurse=False):
            i = index.get(id(p))
            if i is not None and i not in candidates:
                candidates[i] = (module, attr, why)
    for i, (module, attr, why) in candidates.items():
        if i in out.rules or i in out.reasons:
            continue  # also registered by a module with a rule: that rule's uses count
        if why is not None:
            out.reasons[i] = f"{type(module).__name__}: {why}"
            continue
        generic = None
        if module is not model:
            generic = Serving(GENERIC, module, module, attr)
        out.direct[i] = Direct(module, attr, generic)
    return out


def _claim(
    out: Servings, index: dict[int, int], rule: Rule, module: torch.nn.Module, why: str | None
) -> None:
    for owner, attr in rule.owned(module):
        i = index.get(id(getattr(owner, attr)))
        if i is None or i in out.reasons:
            continue
        servings = out.rules.get(i, [])
        if any(s.owner is owner for s in servings):
            continue  # claimed by an enclosing module (attention's out_proj)
        if why is not None:  # one refused use: the parameter is not served at all
            out.reasons[i] = f"{type(module).__name__}: {why}"
            out.rules.pop(i, None)
            continue
        out.rules[i] = [*servings, Serving(rule, module, owner, attr)]
