"""Keep the loss graph through Lightning's ``backward`` when a Cockpit step needs it.

Hessian-vector products (``hess_max_ev``, ``hess_trace`` with ``method="hutchinson"``)
differentiate the gradient again after ``backward``, so ``backward`` must be called with
``retain_graph=True`` at those steps. Lightning's ``on_before_backward`` hook cannot change
``backward``'s arguments, so :class:`GraphKeeper` wraps the precision plugin's ``backward``
(an attribute of this one plugin instance, removed when training ends): every backward
pass of the Trainer, automatic or ``manual_backward``, goes through it and on to
``LightningModule.backward(loss, *args, **kwargs)``. Nothing of the user's module changes.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from cockpit_core.errors import CockpitWarning


def accepts_retain_graph(backward: Any) -> bool:
    """Whether ``backward(loss, retain_graph=True)`` is a valid call of this method."""
    try:
        params = inspect.signature(backward).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is p.VAR_KEYWORD or p.name == "retain_graph" for p in params)


class GraphKeeper:
    """Adds ``retain_graph=True`` to the next backward pass after :meth:`want` is called.

    Attributes:
        wanted: Whether the next backward pass keeps the graph (reset after it).

    """

    def __init__(self) -> None:
        self.wanted = False
        self._plugin: Any = None
        self._wrapper: Any = None
        self._warned = False

    def install(self, trainer: Any) -> None:
        """Wrap ``trainer.strategy.precision_plugin.backward`` (once)."""
        plugin = trainer.strategy.precision_plugin
        if self._plugin is plugin:
            return
        self.remove()
        original = plugin.backward

        def backward(tensor: Any, model: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            keep, self.wanted = self.wanted, False
            if keep and len(args) < 2 and not kwargs.get("retain_graph"):
                if accepts_retain_graph(getattr(model, "backward", None)):
                    kwargs["retain_graph"] = True
                else:
                    self._warn(model)
            return original(tensor, model, optimizer, *args, **kwargs)

        plugin.backward = backward
        self._plugin, self._wrapper = plugin, backward

    def want(self, keep: bool) -> None:
        """Say whether the coming backward pass must keep the graph."""
        self.wanted = bool(keep)

    def remove(self) -> None:
        """Restore the plugin's own ``backward``."""
        plugin, self._plugin = self._plugin, None
        if plugin is not None and plugin.__dict__.get("backward") is self._wrapper:
            del plugin.__dict__["backward"]
        self._wrapper = None
        self.wanted = False

    def _warn(self, model: Any) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"cockpit: {type(model).__name__}.backward(loss) takes no retain_graph argument, so "
            "the loss graph is freed before Hessian-vector products (hess_max_ev, hess_trace "
            "'hutchinson') can use it; they record errors. Accept **kwargs in backward and "
            "pass them to loss.backward(...), or remove the override.",
            CockpitWarning,
            stacklevel=3,
        )
