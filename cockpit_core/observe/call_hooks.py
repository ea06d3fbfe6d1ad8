"""The watch over the torch-function calls that armed probes read: :class:`CallHooks`.

While a :class:`~cockpit_core.observe.probe.Probe` with ``functions`` is armed, every
module of the model carries a forward pre-hook and a forward hook that keep the stack of
running modules, and the model's own pre-hook puts a :class:`CallMode` (a
``TorchFunctionMode``) at the bottom of the mode stack for the duration of its forward
pass, if that pass belongs to the training step (see ``watching``). The mode runs every
torch function unchanged and, after a call of a watched function, hands it to the probes
that select its owner, the innermost running module. At the bottom, the mode sees what
every mode above it passes on, and a mode entered or left meanwhile (by the user, or in
another forward hook) keeps its place. Checkpointed blocks that run forward again during
``backward`` run outside the model's forward pass: their calls are not seen. Nothing stays
on the model while no such probe is armed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from cockpit_core.observe.loss_catcher import push_under, remove_mode
from cockpit_core.observe.probe import FunctionCall, Probe, ProbeResults


class CallMode(TorchFunctionMode):
    """Runs every torch function; tells its :class:`CallHooks` about the watched ones."""

    def __init__(self, hooks: CallHooks):
        super().__init__()
        self.hooks = hooks

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        try:
            probes = self.hooks.watched.get(func)
        except TypeError:  # an unhashable callable: never one of the watched functions
            probes = None
        if probes:
            self.hooks.called(func, probes, args, kwargs, result)
        return result


class CallHooks:
    """Watches the calls of the functions that the armed probes name (``Probe.functions``).

    Args:
        watching: Whether a forward pass now belongs to the user's training step (not
            cockpit's own pass, not under ``torch.no_grad()``).
        max_calls: Calls kept per owner and probe between two takes (older ones are
            dropped).

    """

    def __init__(self, watching: Callable[[], bool], max_calls: int):
        self.watching = watching
        self.max_calls = max_calls
        self.model: torch.nn.Module | None = None  # set by the owner, then re-armed
        self.probes: tuple[Probe, ...] = ()
        self.results = ProbeResults()
        self.handles: list[Any] = []
        self.names: dict[int, str] = {}  # id(module) -> name, every module of the model
        self.chosen: dict[int, frozenset[str]] = {}  # id(module) -> keys of probes reading it
        self.watched: dict[Any, tuple[Probe, ...]] = {}  # function -> probes watching it
        self.mode: CallMode | None = None
        self.stack: list[torch.nn.Module] = []  # the modules whose forward is running
        self.depth = 0  # nesting of the model's own calls while the mode is on
        self.passes = 0  # forward passes watched since the last take

    def __deepcopy__(self, memo: dict[int, object]) -> CallHooks:
        """Itself: a copy of the model keeps hooks that ignore it (its modules are unknown)."""
        return self

    def arm(self, probes: Iterable[Probe]) -> bool:
        """Hook the modules for ``probes`` (none: remove every hook).

        Returns:
            Whether hooks are on the model now.

        """
        probes = tuple({p.key: p for p in probes}.values())
        if [p.key for p in probes] == [p.key for p in self.probes] and (
            self.handles or not probes or self.model is None
        ):
            return bool(self.handles)
        for handle in self.handles:
            handle.remove()
        self._leave_mode()
        self.handles, self.names, self.chosen, self.watched = [], {}, {}, {}
        self.probes = probes
        if not probes or self.model is None:
            return False
        watched: dict[Any, list[Probe]] = {}
        for probe in probes:
            for function in probe.functions:
                watched.setdefault(function, []).append(probe)
        self.watched = {f: tuple(ps) for f, ps in watched.items()}
        for name, module in self.model.named_modules():
            self.names[id(module)] = name
            keys = set()
            for probe in probes:
                try:
                    if probe.select(name, module):
                        keys.add(probe.key)
                except Exception as err:  # a plugin's selector must not stop training
                    self.results.errors.setdefault(probe.key, failure("select", name, err))
            self.chosen[id(module)] = frozenset(keys)
            self.handles.append(module.register_forward_pre_hook(self._enter))
            self.handles.append(module.register_forward_hook(self._leave, always_call=True))
        return True

    def take(self) -> ProbeResults:
        """What the probes recorded since the last take (then forgotten).

        A probe that recorded nothing although a forward pass was watched has an empty
        mapping: the pass made no call it reads.
        """
        results, self.results = self.results, ProbeResults()
        if self.passes:
            for probe in self.probes:
                if probe.key not in results.errors:
                    results.values.setdefault(probe.key, {})
        self.passes = 0
        return results

    def clear(self) -> None:
        """Forget what was recorded."""
        self.results = ProbeResults()
        self.passes = 0

    def close(self) -> None:
        """Remove every hook and forget everything."""
        self.arm(())
        self.clear()

    def pause(self) -> CallMode | None:
        """Take the mode off the stack until :meth:`resume` (cockpit's own calls in hooks).

        Returns:
            The mode taken off, ``None`` if none was on.

        """
        mode = self.mode
        if mode is not None:
            remove_mode(mode)
        return mode

    def resume(self, mode: CallMode | None) -> None:
        """Put back at the bottom of the stack the mode :meth:`pause` took off, if still on."""
        if mode is not None and mode is self.mode:
            push_under(mode)

    # -- the hooks --------------------------------------------------------------------------

    def _enter(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if id(module) not in self.names:  # a deep copy of the model carries the hook
            return
        if module is self.model:
            if self.mode is not None:
                self.depth += 1
            elif self.watching() and not in_backward():
                self.mode = CallMode(self)
                push_under(self.mode)
                self.depth, self.stack = 1, []
                self.passes += 1
        if self.mode is not None:
            self.stack.append(module)

    def _leave(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self.mode is None or id(module) not in self.names:
            return
        for i in range(len(self.stack) - 1, -1, -1):  # its own entry, innermost first
            if self.stack[i] is module:
                del self.stack[i:]
                break
        if module is self.model:
            self.depth -= 1
            if self.depth <= 0:
                self._leave_mode()

    def _leave_mode(self) -> None:
        if self.mode is not None:
            remove_mode(self.mode)
        self.mode, self.stack, self.depth = None, [], 0

    def called(
        self,
        func: Callable[..., Any],
        probes: tuple[Probe, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: Any,
    ) -> None:
        """A watched function returned: run the probes that read its owner."""
        if not self.watching() or in_backward():
            return
        owner = self.stack[-1] if self.stack else self.model
        if owner is None:
            return
        name = self.names.get(id(owner), "")
        chosen = self.chosen.get(id(owner), frozenset())
        for probe in probes:
            if probe.key not in chosen or probe.key in self.results.errors:
                continue
            try:
                with torch.no_grad():
                    value = probe.reduce(owner, FunctionCall(func, args, kwargs), result)
            except Exception as err:  # recorded for the step; training goes on
                self.results.errors[probe.key] = failure("reduce", name, err)
                continue
            calls = self.results.values.setdefault(probe.key, {}).setdefault(name, [])
            calls.append(value)
            del calls[: -self.max_calls]


def in_backward() -> bool:
    """Whether autograd is running a backward pass (checkpointed blocks run forward again)."""
    return torch._C._current_graph_task_id() != -1


def failure(what: str, name: str, err: Exception) -> str:
    """Why a probe has no result: its ``select`` or ``reduce`` raised ``err`` at ``name``."""
    where = f"module '{name}'" if name else "the model"
    return f"its {what} raised {type(err).__name__}: {err} (at {where})"
