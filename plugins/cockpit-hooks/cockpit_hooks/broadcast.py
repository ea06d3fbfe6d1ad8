"""Per-sample gradients captured where the forward pass broadcasts a tensor into the batch.

Some tensors enter the batch by broadcasting: a position table looked up once for the
whole batch (``wpe(arange(T))``, positions ``[1, T]``), a bare parameter added to or
multiplied into batched activations (a ViT's ``x + self.pos_embed``, an RMSNorm's
``self.weight * x``) or expanded to it (``self.cls_token.expand(B, -1, -1)``). Autograd
sums the gradient over the samples where the broadcast is undone, so no hook on the
tensor itself sees the per-sample part. :class:`BroadcastMode` is a
``TorchFunctionMode`` active during the root module's forward pass of a tracked step; when
a tracked tensor meets a batched one in an elementwise operation, it hands the operation
the tensor *explicitly expanded* to the batch (the same values, so the result is
unchanged) and hooks the expanded tensor, whose gradient is per sample:

    g_n(t) = B * sum_{axes t was broadcast over} dL/d(expand(t))[n].

Views and casts of a tracked tensor that keep its elements in order (``view``,
``reshape``, ``unsqueeze``, ``squeeze``, ``flatten``, ``to``, ``contiguous``) are followed
and their gradients mapped back, and so are parts selected by basic indexing (a position
table cut to the sequence, ``pos[:, :T]``, ``narrow``, a row ``table[2]``), whose gradients
go back into zeros of the whole tensor's shape; rows gathered by an integer index
(``table[index]``, a relative position bias) add their gradients to their rows, and axes
reordered (``permute``, ``transpose``, ``.t()``) are put back in order. Elementwise operations
linear in a tracked tensor whose other operands are constants (``x * 0.5 - 1``, a causal
mask ``torch.where(allowed, x, -inf)``) are followed too, and a tracked ``attn_mask`` of
``scaled_dot_product_attention`` (T5's relative position bias), which the kernel would
broadcast over the batch itself, is expanded and captured like an operand.

A tracked parameter passed as the weight or bias of a supported functional (``F.linear``,
``F.layer_norm``, ``F.rms_norm``, ``F.embedding``) is handed to a callback, which records
the call for :mod:`cockpit_hooks.rules.functional`. Any other differentiable use of a tracked tensor is
recorded, so that its per-sample gradients are reported incomplete instead of wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from cockpit_hooks.rules.functional import FunctionalCall, bind

T = Tensor
_ELEMENTWISE = frozenset(
    {
        torch.add,
        torch.sub,
        torch.subtract,
        torch.mul,
        torch.multiply,
        torch.div,
        torch.divide,
        torch.true_divide,
        torch.where,
        T.add,
        T.sub,
        T.mul,
        T.div,
        T.__add__,
        T.__radd__,
        T.__sub__,
        T.__rsub__,
        T.__mul__,
        T.__rmul__,
        T.__truediv__,
        T.__rtruediv__,
    }
)
"""Broadcasting elementwise operations: an operand may be expanded to the result's shape."""

_IN_PLACE = frozenset(
    {T.add_, T.sub_, T.mul_, T.div_, T.__iadd__, T.__isub__, T.__imul__, T.__itruediv__}
)
"""In-place elementwise operations: the other operands may be expanded, not the target."""

_EXPAND = frozenset({T.expand, T.expand_as, T.broadcast_to, torch.broadcast_to})
"""Operations that broadcast their input themselves."""

_FOLLOW = frozenset(
    {
        T.to,
        T.type,
        T.type_as,
        T.float,
        T.double,
        T.half,
        T.bfloat16,
        T.contiguous,
        T.clone,
        T.view,
        T.view_as,
        T.reshape,
        T.reshape_as,
        T.unsqueeze,
        T.squeeze,
        T.flatten,
        T.unflatten,
        torch.reshape,
        torch.unsqueeze,
        torch.squeeze,
        torch.flatten,
        torch.unflatten,
    }
)
"""Operations whose output holds the input's elements in the same order (maybe cast)."""

_REORDER = frozenset(
    {
        T.permute,
        torch.permute,
        T.transpose,
        torch.transpose,
        T.swapaxes,
        T.swapdims,
        torch.swapaxes,
        torch.swapdims,
        T.t,
        torch.t,
    }
)
"""Operations whose output holds the input's elements with its axes reordered."""

_SDPA = torch.nn.functional.scaled_dot_product_attention
"""Attention whose additive ``attn_mask`` the kernel broadcasts over the batch."""

_SELECT = frozenset({T.__getitem__, T.narrow, torch.narrow})
"""Operations whose output is a part of the input: with basic indexing (integers, slices,
``None``, ``...``) a view, e.g. a position table cut to the sequence, ``pos[:, :T]``; or
rows gathered by an integer tensor, ``table[index]`` (a relative position bias)."""


@dataclass(eq=False)
class Origin:
    """A tensor whose per-sample gradients are captured where it is broadcast.

    Attributes:
        shape: Its shape.
        key: For a parameter, its index among the tracked parameters (else ``None``).
        receive: Called during ``backward`` with the per-sample gradients of the loss
            w.r.t. it, ``[B, *shape]`` (not yet multiplied by ``B``), once per broadcast.
        broadcast_at: The operations at which it was broadcast (and captured).
        other_uses: The operations that used it otherwise (differentiably).

    """

    shape: torch.Size
    receive: Callable[[Tensor], None]
    key: int | None = None
    broadcast_at: list[str] = field(default_factory=list)
    other_uses: list[str] = field(default_factory=list)


@dataclass
class _Tracked:
    """A tracked tensor: the tensor itself (its ``id`` stays valid), its origin, the way back."""

    tensor: Tensor
    origin: Origin
    back: Callable[[Tensor], Tensor]


class BroadcastMode(TorchFunctionMode):
    """Captures per-sample gradients of tracked tensors at their broadcasts into the batch.

    Args:
        batch_size: ``B``, the batch of the forward pass (dimension 0 of its input).
        on_functional: Called with a supported functional call, its tracked parameters
            (``{argument name: origin}``) and its output; returns whether it recorded the
            call (else these are other uses).

    """

    def __init__(
        self,
        batch_size: int,
        on_functional: Callable[[FunctionalCall, dict[str, Origin], Tensor], bool] | None = None,
    ):
        super().__init__()
        self.batch_size = batch_size
        self.on_functional = on_functional
        self._tracked: dict[int, _Tracked] = {}

    def track(self, tensor: Tensor, origin: Origin) -> None:
        """Follow ``tensor`` (a parameter, or a module's output) from now on."""
        self._tracked[id(tensor)] = _Tracked(tensor, origin, _identity)

    def release(self) -> None:
        """Forget every tracked tensor (the forward pass ended)."""
        self._tracked = {}

    def __torch_function__(  # noqa: D105
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if not self._tracked:
            return func(*args, **kwargs)
        if func in _ELEMENTWISE or func in _IN_PLACE:
            return self._elementwise(func, args, kwargs)
        if func is _SDPA:
            args, kwargs = self._attention_mask(args, kwargs)
        call = bind(func, args, kwargs) if self.on_functional is not None else None
        if call is not None:
            return self._functional(func, call, args, kwargs)
        hits = [self._tracked[id(a)] for a in _tensors(args, kwargs) if id(a) in self._tracked]
        out = func(*args, **kwargs)
        if not hits:
            return out
        if func in _EXPAND and len(hits) == 1 and args and args[0] is hits[0].tensor:
            if isinstance(out, Tensor) and self._capture(hits[0], out, _name(func)):
                return out
        elif func in _FOLLOW and len(hits) == 1 and args and args[0] is hits[0].tensor:
            if isinstance(out, Tensor) and out.numel() == hits[0].tensor.numel():
                self._follow(hits[0], out)
                return out
        elif func in _REORDER and len(hits) == 1 and args and args[0] is hits[0].tensor:
            order = _permutation(func, args, kwargs)
            if order is not None and isinstance(out, Tensor):
                self._reorder(hits[0], out, order)
                return out
        elif func in _SELECT and len(hits) == 1 and args and args[0] is hits[0].tensor:
            key = _basic_key(func, args, kwargs)
            rows = _row_index(func, args, kwargs) if key is None else None
            if key is not None and isinstance(out, Tensor):
                self._select(hits[0], out, key)
                return out
            if rows is not None and isinstance(out, Tensor):
                self._gather(hits[0], out, rows)
                return out
        if any(isinstance(t, Tensor) and t.requires_grad for t in tree_flatten(out)[0]):
            for hit in hits:
                hit.origin.other_uses.append(_name(func))
        return out

    def _elementwise(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Expand every tracked operand that the operation broadcasts over the batch."""
        tensors = _tensors(args, kwargs)
        if not any(id(a) in self._tracked for a in tensors):
            return func(*args, **kwargs)
        try:
            shape = torch.broadcast_shapes(*(t.shape for t in tensors))
        except RuntimeError:  # the operation raises its own error
            return func(*args, **kwargs)
        target = args[0] if func in _IN_PLACE and args else None
        new_args = list(args)
        others: list[tuple[int, _Tracked]] = []  # tracked operands not broadcast over the batch
        for k, a in enumerate(args):
            hit = self._tracked.get(id(a)) if isinstance(a, Tensor) else None
            if hit is None:
                continue
            if a is not target and _batch_broadcast(a.shape, shape, self.batch_size):
                expanded = a.expand(shape)
                if self._capture(hit, expanded, _name(func)):
                    new_args[k] = expanded
                    continue
            others.append((k, hit))
        for key, a in kwargs.items():
            if isinstance(a, Tensor) and id(a) in self._tracked:
                self._tracked[id(a)].origin.other_uses.append(f"{_name(func)}({key}=...)")
        out = func(*new_args, **kwargs)
        scale = _linear_factor(func, args, kwargs, others[0][0]) if len(others) == 1 else None
        if scale is not None and isinstance(out, Tensor) and target is None:
            self._scaled(others[0][1], out, scale)  # e.g. a bias masked before it is broadcast
            return out
        for _, hit in others:
            hit.origin.other_uses.append(_name(func))
        return out

    def _attention_mask(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """An attention call's arguments, its tracked ``attn_mask`` expanded to the batch.

        A tracked mask is an additive bias (e.g. T5's relative position bias); the kernel
        would broadcast it over the batch itself, where no hook sees it, so it gets the
        mask expanded and captured like an elementwise operation's operand.
        """
        positional = len(args) > 3
        mask = args[3] if positional else kwargs.get("attn_mask")
        hit = self._tracked.get(id(mask)) if isinstance(mask, Tensor) else None
        query = args[0] if args else kwargs.get("query")
        key = args[1] if len(args) > 1 else kwargs.get("key")
        if hit is None or not isinstance(query, Tensor) or not isinstance(key, Tensor):
            return args, kwargs
        assert isinstance(mask, Tensor)  # hit is not None
        try:
            shape = torch.broadcast_shapes(mask.shape, (*query.shape[:-1], key.shape[-2]))
        except RuntimeError:  # the call raises its own error
            return args, kwargs
        if not _batch_broadcast(mask.shape, shape, self.batch_size):
            return args, kwargs
        expanded = mask.expand(shape)
        if not self._capture(hit, expanded, "scaled_dot_product_attention(attn_mask=...)"):
            return args, kwargs
        if positional:
            return (*args[:3], expanded, *args[4:]), kwargs
        return args, {**kwargs, "attn_mask": expanded}

    def _functional(
        self, func: Any, call: FunctionalCall, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A supported functional: its tracked parameters go to :attr:`on_functional`."""
        roles = {
            role: hit.origin
            for role, t in call.parameters().items()
            if (hit := self._tracked.get(id(t))) is not None
            and hit.back is _identity
            and hit.origin.key is not None
        }
        out = func(*args, **kwargs)
        recorded = (
            bool(roles)
            and isinstance(out, Tensor)
            and call.unsupported() is None
            and self.on_functional is not None
            and self.on_functional(call, roles, out)
        )
        if isinstance(out, Tensor) and out.requires_grad:
            handled = set(map(id, roles.values())) if recorded else set()
            for t in _tensors(args, kwargs):
                hit = self._tracked.get(id(t))
                if hit is not None and id(hit.origin) not in handled:
                    hit.origin.other_uses.append(_name(func))
        return out

    def _capture(self, hit: _Tracked, expanded: Tensor, where: str) -> bool:
        """Hook ``expanded`` (``hit``'s tensor broadcast to ``[B, ...]``): per-sample gradients."""
        source = hit.tensor
        if not expanded.requires_grad or not _batch_broadcast(
            source.shape, expanded.shape, self.batch_size
        ):
            return False
        rank = len(expanded.shape)
        aligned = (1,) * (rank - source.dim()) + tuple(source.shape)
        origin, back, batch = hit.origin, hit.back, self.batch_size
        origin.broadcast_at.append(where)

        def on_grad(grad: Tensor) -> None:
            per_sample = grad.sum_to_size((batch, *aligned[1:])).reshape(batch, *source.shape)
            origin.receive(back(per_sample))

        expanded.register_hook(on_grad)
        return True

    def _follow(self, hit: _Tracked, out: Tensor) -> None:
        """Track ``out``, a reordering-free view or cast of ``hit``'s tensor."""
        shape, dtype, back = tuple(hit.tensor.shape), hit.tensor.dtype, hit.back

        def to_source(per_sample: Tensor) -> Tensor:
            return back(per_sample.reshape(per_sample.shape[0], *shape).to(dtype))

        self._tracked[id(out)] = _Tracked(out, hit.origin, to_source)

    def _select(self, hit: _Tracked, out: Tensor, key: tuple[Any, ...]) -> None:
        """Track ``out = hit.tensor[key]`` (basic indexing): gradients go back into zeros."""
        shape, back = tuple(hit.tensor.shape), hit.back

        def to_source(per_sample: Tensor) -> Tensor:
            whole = per_sample.new_zeros(per_sample.shape[0], *shape)
            whole[(slice(None), *key)] = per_sample.reshape(per_sample.shape[0], *out.shape)
            return back(whole)

        self._tracked[id(out)] = _Tracked(out, hit.origin, to_source)

    def _scaled(self, hit: _Tracked, out: Tensor, scale: Tensor | float) -> None:
        """Track ``out``, elementwise ``scale * hit.tensor`` plus constants (broadcast)."""
        shape, back = tuple(hit.tensor.shape), hit.back
        aligned = (1,) * (out.dim() - len(shape)) + shape

        def to_source(per_sample: Tensor) -> Tensor:
            batch = per_sample.shape[0]
            local = per_sample.reshape(batch, *out.shape) * scale
            return back(local.sum_to_size((batch, *aligned)).reshape(batch, *shape))

        self._tracked[id(out)] = _Tracked(out, hit.origin, to_source)

    def _gather(self, hit: _Tracked, out: Tensor, rows: Tensor) -> None:
        """Track ``out = hit.tensor[rows]``: each gathered row's gradient adds to its row."""
        shape, back = tuple(hit.tensor.shape), hit.back
        flat = rows.reshape(-1) % shape[0]  # negative rows count from the end

        def to_source(per_sample: Tensor) -> Tensor:
            batch = per_sample.shape[0]
            whole = per_sample.new_zeros(batch, *shape)
            parts = per_sample.reshape(batch, flat.numel(), *shape[1:])
            return back(whole.index_add_(1, flat.to(per_sample.device), parts))

        self._tracked[id(out)] = _Tracked(out, hit.origin, to_source)

    def _reorder(self, hit: _Tracked, out: Tensor, order: list[int]) -> None:
        """Track ``out = hit.tensor.permute(order)``: gradients are permuted back."""
        back = hit.back
        inverse = [order.index(axis) for axis in range(len(order))]

        def to_source(per_sample: Tensor) -> Tensor:
            shaped = per_sample.reshape(per_sample.shape[0], *out.shape)
            return back(shaped.permute(0, *(k + 1 for k in inverse)))

        self._tracked[id(out)] = _Tracked(out, hit.origin, to_source)


def _identity(t: Tensor) -> Tensor:
    return t


_NEGATED_SECOND = frozenset({torch.sub, torch.subtract, T.sub, T.__sub__})
_ADDITIVE = frozenset({torch.add, T.add, T.__add__, T.__radd__, T.__rsub__}) | _NEGATED_SECOND
_PRODUCT = frozenset({torch.mul, torch.multiply, T.mul, T.__mul__, T.__rmul__})
_QUOTIENT = frozenset({torch.div, torch.divide, torch.true_divide, T.div, T.__truediv__})


def _linear_factor(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], k: int
) -> Tensor | float | None:
    """``d out / d args[k]`` of an elementwise operation linear in ``args[k]``, or ``None``.

    Only where every other operand is constant (no gradient): ``x + c``, ``c - x``,
    ``x * c``, ``x / c`` and ``torch.where(mask, x, c)`` (masking a bias before adding it);
    the output's per-sample gradients then map back to ``x`` by this factor.
    """
    if any(isinstance(a, Tensor) and a.requires_grad for j, a in enumerate(args) if j != k):
        return None
    if kwargs and set(kwargs) != {"alpha"} or not isinstance(kwargs.get("alpha", 1), (int, float)):
        return None
    alpha = float(kwargs.get("alpha", 1))
    if func in _ADDITIVE and len(args) == 2:
        if func is T.__rsub__:
            return -1.0 if k == 0 else None
        if k == 1:
            return -alpha if func in _NEGATED_SECOND else alpha
        return 1.0
    other = args[1 - k] if len(args) == 2 else None
    if not isinstance(other, (Tensor, int, float)) or isinstance(other, bool) or kwargs:
        other = None
    if func in _PRODUCT and other is not None:
        return other if isinstance(other, Tensor) else float(other)
    if func in _QUOTIENT and other is not None and k == 0:
        if isinstance(other, Tensor):
            return other.reciprocal()
        return 1.0 / other if other != 0 else None
    condition = args[0] if func is torch.where and len(args) == 3 else None
    if isinstance(condition, Tensor) and condition.dtype == torch.bool and k in (1, 2):
        return condition if k == 1 else ~condition
    return None


def _permutation(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int] | None:
    """``order`` with ``out = input.permute(order)`` for a reordering call, or ``None``."""
    ndim = args[0].dim()
    rest = list(args[1:]) + list(kwargs.values())
    if func in (T.t, torch.t):
        return [1, 0] if ndim == 2 else list(range(ndim))
    if func in (T.permute, torch.permute):
        dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest
        if len(dims) != ndim or not all(isinstance(d, int) for d in dims):
            return None
        return [d % ndim for d in dims]
    if len(rest) != 2 or not all(isinstance(d, int) for d in rest) or ndim == 0:
        return None
    order = list(range(ndim))
    a, b = rest[0] % ndim, rest[1] % ndim
    order[a], order[b] = order[b], order[a]
    return order


def _row_index(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """The integer index tensor of ``table[index]`` (rows of dimension 0), else ``None``."""
    if func is not T.__getitem__ or kwargs or len(args) != 2:
        return None
    key = args[1][0] if isinstance(args[1], tuple) and len(args[1]) == 1 else args[1]
    if not isinstance(key, Tensor) or key.is_floating_point() or key.is_complex():
        return None
    return None if key.dtype == torch.bool or args[0].dim() == 0 else key


def _basic_key(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The index of a selection as a tuple of basic indices, or ``None`` (advanced indexing)."""
    if func is T.__getitem__:
        key = args[1] if len(args) > 1 else None
        key = key if isinstance(key, tuple) else (key,)
        basic = all(k is None or k is Ellipsis or isinstance(k, (int, slice)) for k in key)
        return key if basic and not kwargs and not any(isinstance(k, bool) for k in key) else None
    params = list(args[1:]) + [kwargs.get(k) for k in ("dim", "start", "length") if k in kwargs]
    if len(params) != 3 or not all(isinstance(v, int) for v in params):
        return None
    dim, start, length = params
    return (*(slice(None),) * (dim % args[0].dim()), slice(start, start + length))


def _batch_broadcast(shape: torch.Size, result: torch.Size, batch_size: int) -> bool:
    """Whether ``shape`` is broadcast over dimension 0 (the batch) of ``result``."""
    if len(result) == 0 or result[0] != batch_size or len(shape) > len(result):
        return False
    return len(shape) < len(result) or shape[0] == 1


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """The tensors among a call's arguments, and inside list or tuple arguments (``cat``)."""
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(t for t in a if isinstance(t, Tensor))
    return out


def _name(func: Any) -> str:
    """``torch.matmul``, ``TensorBase.mm``: how a use is named in messages."""
    # functions' (qualified) names are strings
    name = cast(str, getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func)))
    return name if "." in name else f"torch.{name}"
