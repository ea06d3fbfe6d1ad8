"""The user's BackPACK extensions (``cp(step, *extensions)``) merged by value with cockpit's.

Cockpit 1.0.2 merged the user's extensions with its own by class and silently kept one set
of hyperparameters. Here two extensions are *equal* when they have the same BackPACK class
and the same hyperparameters: every attribute of the instance except BackPACK's bookkeeping
(its saved quantities, its table of module extensions) and cockpit's markers, i.e.
``savefield``, ``_fail_mode``, ``_subsampling``, ``_mc_samples``, ``loss_hessian_strategy``,
KFAC's strategies and whatever a subclass adds. Extensions that save to the same field
(``p.diag_ggn_mc``) but are not equal *conflict*: one backward pass can compute only one.

Equal extensions run once: the user's instance runs (its results are exactly those of
``with backpack(extension)``) and cockpit reads its own statistics from them.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from cockpit_core.errors import RequirementConflictError

_BOOKKEEPING = frozenset({"saved_quantities", "_BackpropExtension__module_extensions"})
_MISSING = object()


def base_class(extension: Any) -> type[Any]:
    """The BackPACK class of ``extension`` (cockpit's guarded subclasses name theirs)."""
    return getattr(extension, "cockpit_base", type(extension))


def hyperparameters(extension: Any) -> dict[str, Any]:
    """``{"savefield": "diag_ggn_mc", "mc_samples": 2, ...}``: what makes two extensions equal."""
    return {
        name.lstrip("_"): value
        for name, value in vars(extension).items()
        if name not in _BOOKKEEPING and not name.startswith("cockpit_")
    }


def equal(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` compute the same: same class, same hyperparameters."""
    return base_class(a) is base_class(b) and not differences(a, b)


def differences(a: Any, b: Any) -> list[str]:
    """The hyperparameters in which ``a`` and ``b`` differ, as ``"mc_samples=2 vs 1"``."""
    ha, hb = hyperparameters(a), hyperparameters(b)
    return [
        f"{key}={_show(ha.get(key, _MISSING))} vs {_show(hb.get(key, _MISSING))}"
        for key in sorted(ha.keys() | hb.keys())
        if not _same_value(ha.get(key, _MISSING), hb.get(key, _MISSING))
    ]


def describe(extension: Any) -> str:
    """``DiagGGNMC(mc_samples=2)``: the class and its constructor arguments that are set.

    Arguments at a default of ``None`` (``BatchGrad()``) are left out.
    """
    cls = base_class(extension)
    hyper = hyperparameters(extension)
    try:
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        parameters = []
    args = []
    for param in parameters:
        if param.name not in hyper or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        value = hyper[param.name]
        if value is None and param.default is None:
            continue
        args.append(f"{param.name}={_show(value)}")
    return f"{cls.__name__}({', '.join(args)})"


def merge(
    own: Sequence[Any], requests: Sequence[Any], needs: Mapping[int, str]
) -> tuple[list[Any], set[str]]:
    """The extensions of one backward pass: cockpit's own and the user's, merged by value.

    Args:
        own: Cockpit's extensions for the step's statistics.
        requests: The user's extensions (``cp(step, *requests)``).
        needs: For ``id(extension)`` of each of ``own``, what needs it (for messages), e.g.
            ``"the statistic diag_ggn_mc(mc_samples=1) of quantity 'x'"``.

    Returns:
        ``(extensions, fields)``: what ``backpack(...)`` runs, cockpit's in their order
        (an equal user extension in the place of cockpit's, so that Monte-Carlo samples
        of cockpit's statistics are drawn as without the user's extensions), then the
        user's others; and the save fields the user asked for (left on the parameters).

    Raises:
        RequirementConflictError: Two extensions save to the same field with other
            hyperparameters (two of the user's, or the user's and cockpit's).

    """
    users: dict[str, Any] = {}
    for ext in requests:
        other = users.setdefault(ext.savefield, ext)
        if other is not ext and not equal(other, ext):
            raise RequirementConflictError(
                f"cp(step, ...) got two BackPACK extensions that save to p.{ext.savefield} "
                f"with different hyperparameters: {describe(other)} and {describe(ext)} "
                f"({_differ(other, ext)}). One backward pass computes only one of them: "
                "pass one, or run the other in a backward pass of its own."
            )
    merged, taken = [], set()
    for ext in own:
        user = users.get(ext.savefield)
        if user is None:
            merged.append(ext)
            continue
        if not equal(user, ext):
            raise RequirementConflictError(
                f"The BackPACK extension {describe(user)} passed to cp(step, ...) conflicts "
                f"with {describe(ext)}, which cockpit computes in the same backward pass for "
                f"{needs.get(id(ext), 'a quantity')}: both save to p.{ext.savefield}, with "
                f"different hyperparameters ({_differ(user, ext)}). One backward pass "
                f"computes only one of them: pass {describe(ext)} instead (it is computed "
                "once, for both), give the quantity the same options, or track the quantity "
                "at other steps."
            )
        merged.append(user)  # the user's instance computes it for both
        taken.add(id(user))
    merged.extend(ext for ext in users.values() if id(ext) not in taken)
    return merged, set(users)


def _differ(a: Any, b: Any) -> str:
    if base_class(a) is not base_class(b):
        return f"classes {base_class(a).__name__} vs {base_class(b).__name__}"
    return "; ".join(differences(a, b)) or "no difference in their attributes"


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and bool(torch.equal(a.cpu(), b.cpu()))
        )
    try:
        return bool(a == b)
    except Exception:  # values that do not compare (e.g. lists of tensors): not equal
        return False


def _show(value: Any) -> str:
    if value is _MISSING:
        return "(unset)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
