"""The forward hooks of armed probes: :class:`ProbeHooks`.

The planner arms the probes the coming step needs; each selected module gets one forward
hook that runs the probes selecting it and keeps what they return until the step takes it
(:meth:`ProbeHooks.take`). Probes of function calls (``Probe.functions``) go to a
:class:`~cockpit_core.observe.call_hooks.CallHooks`, whose results are taken with these.
Nothing stays on the model while no probe is armed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch

from cockpit_core.observe.call_hooks import CallHooks
from cockpit_core.observe.probe import Probe, ProbeResults

MAX_CALLS = 256
"""Calls kept per module and probe between two takes (older ones are dropped), so that a
loop that never enters a tracked step cannot grow them without bound."""


class ProbeHooks:
    """Forward hooks on the modules the armed probes select.

    Args:
        watching: Whether a forward pass now belongs to the user's training step (not
            cockpit's own pass, not under ``torch.no_grad()``).

    """

    def __init__(self, watching: Callable[[], bool]):
        self.watching = watching
        self.model: torch.nn.Module | None = None
        self.probes: tuple[Probe, ...] = ()
        self.results = ProbeResults()
        self.handles: list[Any] = []
        self.hooked: dict[int, str] = {}  # id(module) -> its name, for the hooked modules
        self.calls = CallHooks(watching, MAX_CALLS)  # the probes of function calls

    def attach(self, model: torch.nn.Module | None) -> None:
        """Read the modules of ``model`` (the armed probes move to it)."""
        probes = (*self.probes, *self.calls.probes)
        self.arm(())
        self.model = self.calls.model = model
        self.arm(probes)

    def arm(self, probes: Iterable[Probe]) -> bool:
        """Hook the modules ``probes`` select (none: remove every hook).

        Returns:
            Whether hooks are on the model now.

        """
        unique = tuple({p.key: p for p in probes}.values())
        calling = self.calls.arm(p for p in unique if p.functions)
        probes = tuple(p for p in unique if not p.functions)
        if [p.key for p in probes] == [p.key for p in self.probes] and (
            self.handles or not probes or self.model is None
        ):
            return bool(self.handles) or calling
        for handle in self.handles:
            handle.remove()
        self.handles, self.hooked, self.probes = [], {}, probes
        if not probes or self.model is None:
            return calling
        for name, module in self.model.named_modules():
            chosen = []
            for probe in probes:
                try:
                    if probe.select(name, module):
                        chosen.append(probe)
                except Exception as err:  # a plugin's selector must not stop training
                    self.results.errors.setdefault(probe.key, _failure("select", name, err))
            if chosen:
                hook = partial(self._called, name, tuple(chosen))
                self.handles.append(module.register_forward_hook(hook))
                self.hooked[id(module)] = name
        return bool(self.handles) or calling

    def take(self) -> ProbeResults:
        """What the probes recorded since the last take (then forgotten)."""
        results, self.results = self.results, ProbeResults()
        results.extend(self.calls.take())
        return results

    def clear(self) -> None:
        """Forget what was recorded."""
        self.results = ProbeResults()
        self.calls.clear()

    def close(self) -> None:
        """Remove every hook and forget everything."""
        self.arm(())
        self.clear()
        self.calls.close()

    def _called(
        self,
        name: str,
        probes: tuple[Probe, ...],
        module: torch.nn.Module,
        args: tuple[Any, ...],
        out: Any,
    ) -> None:
        if self.hooked.get(id(module)) != name:  # a deep copy of the model carries the hook
            return
        if not self.watching() or _in_backward():  # checkpointing recomputes in backward
            return
        mode = self.calls.pause()  # the probes' own torch calls are no attention calls
        try:
            with torch.no_grad():
                for probe in probes:
                    if probe.key in self.results.errors:
                        continue
                    try:
                        value = probe.reduce(module, args, out)
                    except Exception as err:  # recorded for the step; training goes on
                        self.results.errors[probe.key] = _failure("reduce", name, err)
                        continue
                    calls = self.results.values.setdefault(probe.key, {}).setdefault(name, [])
                    calls.append(value)
                    if len(calls) > MAX_CALLS:
                        del calls[:-MAX_CALLS]
        finally:
            self.calls.resume(mode)


def _in_backward() -> bool:
    """Whether autograd is running a backward pass (checkpointed blocks run forward again)."""
    return torch._C._current_graph_task_id() != -1


def _failure(what: str, name: str, err: Exception) -> str:
    where = f"module '{name}'" if name else "the model"
    return f"its {what} raised {type(err).__name__}: {err} (at {where})"
