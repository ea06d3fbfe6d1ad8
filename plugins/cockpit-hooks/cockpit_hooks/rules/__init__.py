"""The rules of the module-hook provider: one module family per file.

Each rule (:class:`~cockpit_hooks.rules.base.Rule`) turns a module's inputs and output
gradients into the typed per-sample gradients of its parameters.
"""

from __future__ import annotations

import torch

from cockpit_hooks.rules.attention import AttentionRule
from cockpit_hooks.rules.base import Rule, Use
from cockpit_hooks.rules.conv import ConvRule
from cockpit_hooks.rules.embedding import EmbeddingRule
from cockpit_hooks.rules.linear import LinearRule
from cockpit_hooks.rules.norm import GroupNormRule, LayerNormRule

RULES: tuple[Rule, ...] = (
    LinearRule(),
    EmbeddingRule(),
    LayerNormRule(),
    GroupNormRule(),
    ConvRule(),
    AttentionRule(),
)
"""Every rule, in the order they are tried."""


def rule_for(module: torch.nn.Module) -> Rule | None:
    """The rule for ``module``'s exact type, if any."""
    for rule in RULES:
        if type(module) in rule.modules:
            return rule
    return None


__all__ = ["RULES", "Rule", "Use", "rule_for"]
