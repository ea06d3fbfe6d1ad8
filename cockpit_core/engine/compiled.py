"""Models compiled with ``torch.compile``: tracked steps run eagerly, the others compiled.

Cockpit observes a tracked step with module hooks and ``TorchFunctionMode``s (per-sample
statistics) and differentiates its graph twice (Hessian-vector products). Inside a compiled
region hooks break the graph and force recompilation, ``aot_autograd`` has no double
backward, and a compiled backward with donated buffers refuses ``retain_graph=True``. So
while a tracked forward pass is coming (from the end of the step before it to the end of
the tracked step), cockpit sets the compiler's stance to ``"force_eager"``
(``torch.compiler.set_stance``): compiled functions run their original Python code, exactly
as without compilation, and their compiled graphs stay cached for the untracked steps,
which run compiled with no hook installed. The stance in effect before is restored when no
Cockpit of the process needs eager execution any more.

Nothing is switched while ``torch._dynamo`` is not loaded (no ``torch.compile`` in the
process yet, and importing it would cost seconds): the next switch looks again.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch


def uncompiled(module: torch.nn.Module) -> torch.nn.Module:
    """The module that ``torch.compile(module)`` wrapped, or ``module`` itself.

    Its parameters carry the names of the model (no ``_orig_mod.`` prefix), and hooks on
    it run whenever the compiled wrapper runs it eagerly.
    """
    inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) else module


class EagerStance:
    """One Cockpit's wish that compiled code run eagerly (while it must observe a step).

    The compiler's stance is process-wide, so the wishes of every live Cockpit are
    combined: compiled code runs eagerly while at least one wants it, and the stance in
    effect before the first wish comes back when none does. A Cockpit that is closed, or
    garbage-collected without being closed, withdraws its wish.
    """

    def __init__(self) -> None:
        self.active = False
        self._token = _Token()
        weakref.finalize(self._token, _WISHES.refresh)  # collected unclosed: wish withdrawn

    def set(self, eager: bool) -> None:
        """Run compiled code eagerly from now on (``eager``), or as the others wish."""
        if eager == self.active:
            return
        if eager and not _WISHES.add(self._token):
            return  # nothing compiled in this process yet: asked again at the next step
        if not eager:
            _WISHES.discard(self._token)
        self.active = eager


class _Token:
    """A wish of one :class:`EagerStance` (referenced weakly by :data:`_WISHES`)."""


class _Wishes:
    """The live wishes for eager execution, and the stance to restore when none is left."""

    def __init__(self) -> None:
        self._tokens: weakref.WeakSet[_Token] = weakref.WeakSet()
        self._prior: Any = None
        self._eager = False

    def add(self, token: _Token) -> bool:
        """Wish eager execution; ``False`` if the compiler cannot be switched (yet)."""
        set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
        frames = sys.modules.get("torch._dynamo.eval_frame")
        if set_stance is None or frames is None:  # torch < 2.6, or nothing compiled yet
            return False
        self._tokens.add(token)
        self.refresh()
        return True

    def discard(self, token: _Token) -> None:
        """Withdraw a wish."""
        self._tokens.discard(token)
        self.refresh()

    def refresh(self) -> None:
        """Switch the stance to what the live wishes say."""
        set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
        frames = sys.modules.get("torch._dynamo.eval_frame")
        if set_stance is None or frames is None:
            return
        wanted = len(self._tokens) > 0
        if wanted == self._eager:
            return
        if wanted:
            self._prior = getattr(frames, "_stance", None)
            set_stance("force_eager")
        elif self._prior is None:
            set_stance("default")
        else:
            set_stance(
                self._prior.stance,
                skip_guard_eval_unsafe=self._prior.skip_guard_eval_unsafe,
                force_backend=self._prior.backend,
            )
        self._eager = wanted


_WISHES = _Wishes()
