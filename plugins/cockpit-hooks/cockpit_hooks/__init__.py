"""cockpit-hooks: per-sample statistics from module hooks, in the user's own pass.

The cheapest statistics provider: no extra forward or backward pass, per-sample gradients
kept factored. Pass the model to the Cockpit (``Cockpit(model, ...)``) or call
``cp.attach(model)``; ``cp.check(model)`` shows which parameters it serves.
"""

from cockpit_hooks.provider import HooksProvider
from cockpit_hooks.rules import RULES, Rule, Use, rule_for

__all__ = ["RULES", "HooksProvider", "Rule", "Use", "rule_for"]
