"""Keep the graph of a step's loss for Hessian-vector products without ``retain_graph``.

Quantities such as ``hess_max_ev`` differentiate the loss twice after ``backward()``, so
the autograd graph must survive it. ``loss.backward(retain_graph=cp.retain_graph(step))``
keeps it; without that argument, cockpit keeps it itself: ``Tensor.backward`` calls
``torch.autograd.backward`` through the module attribute at call time, and while the
``with cp(step, ...)`` block of a step that needs the graph is open (a :class:`KeepGraph`
is active), that attribute is a wrapper that passes ``retain_graph=True``. Every
``backward`` inside such a block keeps its graph (the graph is freed with the tensors that
reference it, after the step). The wrapper is removed when the last block closes, also
when it raised; if other code replaced ``torch.autograd.backward`` meanwhile, the wrapper
stays underneath it and passes calls through unchanged.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any

import torch
import torch.autograd

_LOCK = threading.Lock()
_ACTIVE = 0
_ORIGINAL: Any = None
_WRAPPER: Any = None


def _wrap(original: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if _ACTIVE:
            bound = signature.bind(*args, **kwargs)
            bound.arguments["retain_graph"] = True
            args, kwargs = bound.args, bound.kwargs
        return original(*args, **kwargs)

    return backward


class KeepGraph:
    """While entered, every ``torch.autograd.backward`` call keeps the graph.

    Enter and exit it once (a step's block does); instances nest across Cockpits.
    """

    def __init__(self) -> None:
        self.active = False

    def __enter__(self) -> KeepGraph:
        global _ACTIVE, _ORIGINAL, _WRAPPER
        with _LOCK:
            if torch.autograd.backward is not _WRAPPER or _WRAPPER is None:
                _ORIGINAL = torch.autograd.backward
                _WRAPPER = _wrap(_ORIGINAL)
                torch.autograd.backward = _WRAPPER
            _ACTIVE += 1
            self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        global _ACTIVE
        with _LOCK:
            if not self.active:
                return
            self.active = False
            _ACTIVE -= 1
            if _ACTIVE == 0 and torch.autograd.backward is _WRAPPER:
                torch.autograd.backward = _ORIGINAL
