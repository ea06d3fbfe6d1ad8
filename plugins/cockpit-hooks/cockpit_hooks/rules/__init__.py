"""The rules of the module-hook provider: one module family per file.

Each rule (:class:`~cockpit_hooks.rules.base.Rule`) turns a module's inputs and output
gradients into the typed per-sample gradients of its parameters.
"""

from __future__ import annotations

import torch

from cockpit_hooks.rules.attention import AttentionRule
from cockpit_hooks.rules.base import Rule, Use
from cockpit_hooks.rules.batchnorm import BatchNormRule
from cockpit_hooks.rules.conv import ConvRule
from cockpit_hooks.rules.conv1d import Conv1DRule
from cockpit_hooks.rules.embedding import EmbeddingRule, EmbeddingSubclassRule
from cockpit_hooks.rules.functional import FunctionalRule
from cockpit_hooks.rules.generic import GenericRule
from cockpit_hooks.rules.linear import LinearRule
from cockpit_hooks.rules.norm import GroupNormRule, LayerNormRule

RULES: tuple[Rule, ...] = (
    LinearRule(),
    Conv1DRule(),
    EmbeddingRule(),
    EmbeddingSubclassRule(),
    LayerNormRule(),
    GroupNormRule(),
    BatchNormRule(),
    ConvRule(),
    AttentionRule(),
)
"""Every dedicated rule, in the order they are tried."""

GENERIC = GenericRule()
"""The rule of any other module with its own parameters (re-runs that module per sample)."""

FUNCTIONAL = FunctionalRule()
"""The rule of a module's own parameters passed to ``F.linear``, ``F.layer_norm``, ..."""


def rule_for(module: torch.nn.Module) -> Rule | None:
    """The dedicated rule for ``module``'s exact type, if any."""
    for rule in RULES:
        if rule.handles(module):
            return rule
    return None


__all__ = ["FUNCTIONAL", "GENERIC", "RULES", "Rule", "Use", "rule_for"]
