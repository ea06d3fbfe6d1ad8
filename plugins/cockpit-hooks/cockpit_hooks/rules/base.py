"""What a rule is: how one module type's per-sample gradients follow from its inputs and outputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from cockpit_core import PerSampleGrads


class Unsupported(ValueError):
    """A use of a module that the rule cannot serve; the message says why (and what to do)."""


Piece = tuple[Any, Tensor]
"""``(saved, grad_output)``: what a rule kept from one use, and the gradient of its output."""


@dataclass
class Use:
    """One use of a module's parameters in the forward pass.

    Attributes:
        params: ``(owner module, attribute)`` of each parameter this use feeds.
        saved: What the rule keeps from the forward pass (e.g. the layer input).
        output: The tensor whose gradient completes this use (its output).

    """

    params: tuple[tuple[torch.nn.Module, str], ...]
    saved: Any
    output: Tensor


class Rule:
    """Per-sample gradients of the parameters of one kind of module.

    A rule sees the forward pass of a module, keeps what it needs (:meth:`uses`), and once
    the gradients of the outputs arrived during ``backward`` forms the per-sample gradients
    of each parameter (:meth:`per_sample`). Gradients ``grad`` of a module output are those
    of the mini-batch loss, the mean of per-sample losses, so ``B * grad[n]`` is the
    gradient of sample ``n``'s own loss (batch on dimension 0).

    Class attributes:
        modules: The module classes the rule handles (exact types: a subclass may change
            the forward pass).
        class_names: Qualified names (``"package.module.Class"``) of further module
            classes the rule handles, for classes of packages the plugin does not import
            (``transformers``' ``Conv1D``).
        intercepts: A functional the module's ``forward`` calls (e.g.
            ``F.multi_head_attention_forward``); the rule then computes it itself in
            :meth:`intercept` instead of observing the module's output.
        label: How :meth:`cockpit_core.StatisticProvider.describe` names the rule.
        generic_fallback: Whether a module this rule refuses (:meth:`supports`) treats the
            samples independently all the same, so the generic rule may serve it.

    """

    modules: ClassVar[tuple[type, ...]] = ()
    class_names: ClassVar[tuple[str, ...]] = ()
    intercepts: ClassVar[Callable[..., Any] | None] = None
    label: ClassVar[str] = ""
    generic_fallback: ClassVar[bool] = False

    def handles(self, module: torch.nn.Module) -> bool:
        """Whether ``module``'s exact type is one of the rule's."""
        cls = type(module)
        return cls in self.modules or f"{cls.__module__}.{cls.__qualname__}" in self.class_names

    def name(self, module: torch.nn.Module) -> str:
        """``"Linear rule"``: the rule's label, or the module's class."""
        return f"{self.label or type(module).__name__} rule"

    def supports(self, module: torch.nn.Module) -> str | None:
        """``None`` if the rule handles this configuration of ``module``, else why not."""
        return None

    def owned(self, module: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
        """``(owner, attribute)`` of the parameters the rule serves for ``module``."""
        return [(module, name) for name, _ in module.named_parameters(recurse=False)]

    def uses(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> list[Use]:
        """What to keep of one forward call of ``module`` (forward-hook rules)."""
        return []

    def intercept(
        self,
        module: torch.nn.Module,
        record: Callable[[Use], None],
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Compute ``func(*args, **kwargs)`` and ``record`` its uses (intercepting rules)."""
        return func(*args, **kwargs)

    def per_sample(
        self, owner: torch.nn.Module, attr: str, pieces: list[Piece], batch_size: int
    ) -> PerSampleGrads:
        """The per-sample gradients of ``owner.<attr>`` from all its uses' pieces."""
        raise NotImplementedError

    def broadcast(self, saved: Any, batch_size: int, added: bool) -> Any:
        """What the rule kept of a use whose output was broadcast over the batch, made per-sample.

        The module ran once for the whole batch (positions ``[1, T]`` or ``[T]`` looked up
        once) and its output was broadcast into batched tensors; the provider captured the
        gradient at the broadcast, one per sample. The input is the same for every sample:
        ``added`` says whether the output lacked the batch axis (then one is prepended to
        the input), else its dimension 0 has size 1. Tensors and objects with an
        ``inputs`` tensor (:class:`~cockpit_hooks.rules.linear.LinearInput`) are expanded.
        """
        if isinstance(saved, Tensor):
            return expand_batch(saved, batch_size, added)
        inputs = getattr(saved, "inputs", None)
        # a dataclass instance (what a rule keeps), not a dataclass type
        is_instance = dataclasses.is_dataclass(saved) and not isinstance(saved, type)
        if is_instance and isinstance(inputs, Tensor):
            return dataclasses.replace(saved, inputs=expand_batch(inputs, batch_size, added))
        raise ValueError(
            f"the rule cannot expand what it kept ({type(saved).__name__}) to the batch"
        )


def expand_batch(tensor: Tensor, batch_size: int, added: bool) -> Tensor:
    """``tensor`` as ``batch_size`` equal samples: a new batch axis (``added``) or dimension 0 of 1."""
    if added:
        tensor = tensor.unsqueeze(0)
    elif tensor.dim() == 0 or tensor.shape[0] != 1:
        raise ValueError(
            f"the module's output was broadcast over the batch but its input has shape "
            f"{tuple(tensor.shape)}, not one sample on dimension 0"
        )
    return tensor.expand(batch_size, *tensor.shape[1:])


def first_input(args: tuple[Any, ...], kwargs: dict[str, Any], name: str = "input") -> Tensor:
    """The module's first argument, given by position or as ``name=...``."""
    if args:
        first: Tensor = args[0]
    elif name in kwargs:
        first = kwargs[name]
    else:
        raise ValueError(f"the module was called without its {name!r} argument")
    return first


def batch_first(tensor: Tensor, batch_size: int, what: str) -> Tensor:
    """``tensor`` itself if its dimension 0 is the batch; raise ``ValueError`` saying so if not."""
    if tensor.dim() == 0 or tensor.shape[0] != batch_size:
        got = "a scalar" if tensor.dim() == 0 else f"{tensor.shape[0]} entries on dimension 0"
        broadcast = (
            "the module seems to run once for the whole batch and its output is "
            "broadcast over the samples (e.g. positions [1, T] or [T] looked up once), "
            "which hides the per-sample gradients from module hooks; expand its input to "
            "the batch first (positions.expand(B, -1)), or let torch.func serve it "
            "(cp.attach(model, loss_fn))"
        )
        if tensor.dim() > 0 and tensor.shape[0] == 1:
            fix = broadcast
        else:
            fix = (
                "module hooks need the batch on dimension 0 (batch_first=True layouts). If "
                f"it is, info['batch_size'] is wrong: pass the size of the mini-batch. Or {broadcast}"
            )
        raise ValueError(f"{what} has {got}, but the batch has {batch_size} samples: {fix}")
    return tensor


def sum_over_middle(tensor: Tensor, keep_last: int) -> Tensor:
    """Sum over every dimension between the batch (0) and the last ``keep_last`` ones."""
    dims = tuple(range(1, tensor.dim() - keep_last))
    return tensor.sum(dim=dims) if dims else tensor
