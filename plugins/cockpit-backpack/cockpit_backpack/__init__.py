"""cockpit-backpack: statistics from BackPACK (per-sample gradients, curvature diagonals).

Extend the model and the loss module once, before training::

    from cockpit_backpack import extend

    model, loss_fn = extend(model), extend(torch.nn.CrossEntropyLoss())
"""

from cockpit_backpack.hook_switch import extend
from cockpit_backpack.provider import BackpackProvider

__all__ = ["BackpackProvider", "extend"]
