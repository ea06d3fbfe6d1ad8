"""BackPACK's module hooks, installed only for forward passes whose backward is tracked.

BackPACK's ``extend`` gives every extended module a forward hook that stores its input and
output, and a full backward hook that runs the extensions (Dangel et al., 2020,
"BackPACK: Packing more into backprop"). A full backward hook wraps the module's inputs
and outputs in extra autograd nodes at *every* forward pass, tracked or not: 5-12% of a
plain step of the 3c3d CNN and ~90% of the 0.2 ms step of a linear model
(``benchmarks/results/analysis.md``).

:func:`extend` registers the same two BackPACK hook functions but keeps their handles, so
the hooks can be removed while nothing needs them. Each :class:`~cockpit_core.Cockpit`
states after every step whether the *next* forward pass needs them (:func:`want`); the
hooks are installed while any live Cockpit wants them, and always when none has said
otherwise. Modules extended with BackPACK's own ``extend`` keep their hooks for good.
"""

from __future__ import annotations

import warnings
import weakref

import torch
from backpack import hook_run_extensions, hook_store_io, memory_cleanup
from backpack.utils.module_classification import is_no_op
from torch.utils.hooks import RemovableHandle

HOOK_NOTE = (
    "Full backward hook is firing when gradients are computed with respect to module outputs"
)
"""PyTorch's note for a full backward hook on a module whose inputs need no gradient (the
first layer): harmless for BackPACK's hooks, and repeated at every Hessian-vector product."""

EXTENDED_FLAG = "_backpack_extend"
"""The attribute BackPACK sets on extended modules (also set here)."""

_handles: weakref.WeakKeyDictionary[torch.nn.Module, list[RemovableHandle]] = (
    weakref.WeakKeyDictionary()
)
_wants: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()
_installed = True


def extend(module: torch.nn.Module) -> torch.nn.Module:
    """Prepare a model or loss module for per-sample statistics (BackPACK's ``extend``).

    Call it on the model and on the loss function before training::

        model = cockpit_backpack.extend(model)
        loss_fn = cockpit_backpack.extend(torch.nn.CrossEntropyLoss())

    Like BackPACK's ``extend`` it hooks every module that is not a container, but the
    Cockpit removes the hooks for forward passes whose backward it does not track, so
    untracked steps cost what plain training costs (``docs/performance.md``). It also
    hides PyTorch's harmless "Full backward hook is firing ..." note that the hooks cause
    (a warning filter for that one message).

    Args:
        module: The model or the loss module; changed in place.

    Returns:
        ``module`` itself.

    """
    warnings.filterwarnings("ignore", message=HOOK_NOTE, category=UserWarning)
    for sub in module.modules():
        if getattr(sub, EXTENDED_FLAG, False) or is_no_op(sub):
            continue
        setattr(sub, EXTENDED_FLAG, True)
        _handles[sub] = _register(sub) if _installed else []
    return module


def want(owner: object, needed: bool) -> None:
    """Record whether ``owner`` needs the hooks for the next forward pass, and apply it."""
    _wants[owner] = needed
    _apply()


def withdraw(owner: object) -> None:
    """Forget ``owner``'s wish (e.g. a closed Cockpit)."""
    _wants.pop(owner, None)
    _apply()


def installed() -> bool:
    """Whether the hooks of modules extended by :func:`extend` are installed now."""
    return _installed


def switchable(model: torch.nn.Module | None = None) -> bool:
    """Whether any live module (of ``model``, if given) was extended by :func:`extend`.

    Only such modules' hooks can be off; those of ``backpack.extend`` are always on.
    """
    if model is None:
        return len(_handles) > 0
    return any(module in _handles for module in model.modules())


def _apply() -> None:
    global _installed
    target = not _wants or any(_wants.values())
    if target == _installed:
        return
    _installed = target
    for module in list(_handles.keys()):
        if target:
            _handles[module] = _register(module)
        else:
            for handle in _handles[module]:
                handle.remove()
            _handles[module] = []
            memory_cleanup(module)  # the stored input/output of the last tracked pass


def _register(module: torch.nn.Module) -> list[RemovableHandle]:
    return [
        module.register_forward_hook(hook_store_io),
        module.register_full_backward_hook(hook_run_extensions),
    ]
