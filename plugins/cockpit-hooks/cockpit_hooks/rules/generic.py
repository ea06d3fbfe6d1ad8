"""Any other module with its own parameters: per-sample gradients by re-running that module alone.

For a module ``f(theta, x)`` whose forward treats the samples independently (a custom
normalization class, a gated MLP, a hand-written adapter, ``nn.Bilinear``, ...), the
hooks already hold its input ``x_n`` and the gradient ``d_n`` of sample ``n``'s own loss
w.r.t. its output, so

    g_n(theta) = J_theta f(theta, x_n)^T d_n,

one vector-Jacobian product per sample, vectorized over the batch: ``vmap`` over samples
of ``vjp(lambda p: functional_call(module, p, x_n), theta)`` applied to ``d_n`` (Horace He
and Richard Zou, 2021, "functorch: JAX-like composable function transforms for PyTorch").
Only the module itself runs again, never the model. Its other parameters and children are
constants of the product; random operations inside the module are refused (``vmap``'s
``randomness="error"``) because a re-run would draw other values. A module whose forward
mixes the samples (a batch statistic) gives per-sample gradients whose mean differs from
the parameter's gradient, which the provider detects and reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor
from torch.func import functional_call, vjp, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from cockpit_core import DenseGrads, PerSampleGrads
from cockpit_hooks.rules.base import Piece, Rule, Unsupported, Use


@dataclass
class ModuleCall:
    """One call of a module: its arguments (detached), and whether its output was broadcast.

    Attributes:
        args: Positional arguments.
        kwargs: Keyword arguments.
        shape: The shape of the module's output.
        broadcast: The module ran once for the whole batch (set by the provider): every
            argument is then the same for all samples.
        result: The per-sample gradients of every own parameter, once computed.

    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    shape: torch.Size
    broadcast: bool = False
    result: dict[str, Tensor] | None = field(default=None, repr=False)


def _detached(x: Any) -> Any:
    return x.detach() if isinstance(x, Tensor) else x


class GenericRule(Rule):
    """A module without a dedicated rule, re-run per sample on its own inputs (``vmap`` of ``vjp``)."""

    label = "generic"

    def name(self, module: torch.nn.Module) -> str:  # noqa: D102
        return f"generic rule (vmap of {type(module).__name__}'s vjp)"

    def owned(self, module: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
        """The module's own parameters (its children's have rules of their own)."""
        return [(module, n) for n, _ in module.named_parameters(recurse=False)]

    def uses(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> list[Use]:
        """The call's arguments; the output's gradient completes the use."""
        if not isinstance(output, Tensor):
            raise Unsupported(
                f"the generic rule needs a module that returns one tensor; {type(module).__name__} "
                f"returned {type(output).__name__}"
            )
        call = ModuleCall(
            tree_map(_detached, tuple(args)), tree_map(_detached, dict(kwargs)), output.shape
        )
        return [Use(tuple(self.owned(module)), call, output)]

    def broadcast(self, saved: Any, batch_size: int, added: bool) -> Any:
        """The call as it was: its arguments are the same for every sample."""
        saved.broadcast = True
        return saved

    def per_sample(
        self, owner: torch.nn.Module, attr: str, pieces: list[Piece], batch_size: int
    ) -> PerSampleGrads:
        """``J^T d_n`` for every call of the module, summed (computed once for all its parameters)."""
        total = None
        for call, grad in pieces:
            if call.result is None:
                call.result = _vjp_per_sample(owner, call, grad * batch_size, batch_size)
            part = call.result[attr]
            total = part if total is None else total + part
        assert total is not None, "the provider passes at least one piece"
        return DenseGrads(total)


def _vjp_per_sample(
    module: torch.nn.Module, call: ModuleCall, d: Tensor, batch_size: int
) -> dict[str, Tensor]:
    """``vmap`` over samples of the module's ``vjp`` w.r.t. its own parameters, at ``d_n``."""
    theta = {n: p.detach() for n, p in module.named_parameters(recurse=False) if p.requires_grad}
    leaves, spec = tree_flatten((call.args, call.kwargs))
    dims = [
        0
        if isinstance(t, Tensor) and not call.broadcast and t.dim() > 0 and t.shape[0] == batch_size
        else None
        for t in leaves
    ]
    if not call.broadcast and 0 not in dims:
        raise ValueError(
            f"no argument of {type(module).__name__} has the batch ({batch_size} samples) on "
            "dimension 0"
        )

    shape = call.shape if call.broadcast else (1, *call.shape[1:])  # the output of one call

    def one(d_n: Tensor, *leaves_n: Any) -> dict[str, Tensor]:
        one_leaves = [t.unsqueeze(0) if dim == 0 else t for t, dim in zip(leaves_n, dims)]
        args, kwargs = tree_unflatten(one_leaves, spec)
        # without has_aux, vjp returns (output, pullback)
        _, pullback = cast(
            "tuple[Any, Callable[..., Any]]",
            vjp(lambda p: functional_call(module, p, args, kwargs), theta),
        )
        grads: dict[str, Tensor] = pullback(d_n.reshape(shape))[0]
        return grads

    with torch.enable_grad():
        return vmap(one, in_dims=(0, *dims), randomness="error")(d, *leaves)
