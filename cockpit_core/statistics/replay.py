"""The random draws of the user's forward pass, recorded and replayed per sample.

The ``func`` provider (:mod:`cockpit_core.statistics.func`) computes per-sample gradients
after ``backward`` by running the model again, one sample at a time under ``vmap``. A
stochastic forward pass (dropout) must use the random numbers of the user's pass there,
or the per-sample gradients belong to another network than the one whose gradient
``backward`` produced. Re-seeding cannot do it: the batched pass draws one ``[B, ...]``
mask per dropout call, which no per-sample draw reproduces. The masks themselves are
recorded and replayed:

* **Recording** (:class:`ForwardRecorder`, :class:`RecordingMode`): a forward pre-hook on
  the attached model, armed for tracked steps, enters a ``TorchFunctionMode`` for the
  forward pass. Each dropout call (``F.dropout``, ``F.dropout1d/2d/3d``,
  ``torch.dropout``, ``torch.feature_dropout``, which ``nn.Dropout`` modules call) runs
  unchanged; the mode then sets the generator back to its state before the call, makes the
  same call on a tensor of ones (which yields the call's mask multiplier: the draws depend
  on the shape, dtype and device only) and restores the state after the call. The user's
  outputs and random stream stay those of training without cockpit. Attention dropout
  (``scaled_dot_product_attention`` with ``dropout_p > 0``, also inside
  ``F.multi_head_attention_forward``) is recorded alike, on the attention weights' shape,
  and verified: attention computed by its formula with the recorded mask must reproduce
  the kernel's output (a fused GPU kernel draws its mask otherwise: such a step is
  refused).
* **Accounting**: the default generators' states (CPU and the model's CUDA devices) are
  compared before and after every recorded call and at the end of the forward pass.
  Random numbers drawn by anything else (``torch.rand`` in ``forward``, ``alpha_dropout``,
  ``rrelu``, a random function given its own ``generator``) make the record
  unreplayable, with the names of the random functions called.
* **Replay** (:class:`ReplayMode`): inside ``vmap(grad(...))`` the k-th dropout call of the
  one-sample forward pass multiplies by sample ``n``'s slice of the k-th recorded mask (the
  masks are batched inputs of ``vmap``); attention dropout computes attention by its
  formula with that slice. The calls must come in the same order, with the same
  probabilities, and a call recorded on ``[R, ...]`` (``R = B * r``, the batch on dimension
  0, e.g. ``[B * heads, T, S]``) must see ``[r, ...]``; anything else refuses the step.

A model without randomness pays two generator-state reads per observed forward pass: the
mode is entered only while the model has dropout modules in training mode or has drawn
random numbers before (and once, on the first observed forward pass in training mode,
to find out).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode, redispatch_function
from torch.utils._pytree import tree_flatten

KEEP_RECORDS = 4
"""Forward passes kept for the steps' collections (micro-batches may run all forwards first)."""

_FUNCTIONAL_DROPOUTS = (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d)
_ATEN_DROPOUTS = {
    torch.dropout: (torch.dropout, False),
    torch.dropout_: (torch.dropout, True),
    torch.feature_dropout: (torch.feature_dropout, False),
    torch.feature_dropout_: (torch.feature_dropout, True),
}
_ATTENTION = F.scaled_dot_product_attention
_DESCEND = (F.multi_head_attention_forward,)
"""Composite functions whose inner calls the modes must see (dropout inside attention)."""


def _random_functions() -> dict[Any, str]:
    """Functions that draw random numbers and cannot be replayed, by display name."""
    out: dict[Any, str] = {}
    for name in (
        "rand",
        "randn",
        "randint",
        "rand_like",
        "randn_like",
        "randint_like",
        "randperm",
        "bernoulli",
        "multinomial",
        "normal",
        "poisson",
        "alpha_dropout",
        "alpha_dropout_",
        "feature_alpha_dropout",
        "feature_alpha_dropout_",
        "native_dropout",
        "rrelu",
        "rrelu_",
    ):
        if hasattr(torch, name):
            out[getattr(torch, name)] = f"torch.{name}"
    for name in (
        "bernoulli",
        "bernoulli_",
        "uniform_",
        "normal_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "random_",
        "multinomial",
    ):
        if hasattr(torch.Tensor, name):
            out[getattr(torch.Tensor, name)] = f"Tensor.{name}"
    for name in ("alpha_dropout", "feature_alpha_dropout", "rrelu", "gumbel_softmax"):
        if hasattr(F, name):
            out[getattr(F, name)] = f"F.{name}"
    return out


_RANDOM = _random_functions()


class ReplayError(RuntimeError):
    """The recomputed forward pass does not make the random calls the user's pass made."""


@dataclass
class Draw:
    """One random call of the user's forward pass.

    Attributes:
        kind: ``"dropout"`` (elementwise or channel dropout) or ``"attention"``.
        name: The function, for messages.
        p: Its dropout probability.
        mask: Which entries were kept, ``[B, R / B, ...]`` for a call on ``[R, ...]``.
        scale: The factor the kept entries were multiplied by (a 0-dim tensor).

    """

    kind: str
    name: str
    p: float
    mask: Tensor
    scale: Tensor


@dataclass
class ForwardRecord:
    """What one forward pass drew.

    Attributes:
        batch: Dimension 0 of its first input tensor (``None``: no tensor input).
        inputs: Weak references to its input tensors (to match ``info["inputs"]``).
        captured: Whether the recording mode saw the pass (else only its random-number
            consumption is known).
        draws: The recorded random calls, in order.
        stray: Whether random numbers were drawn outside the recorded calls.
        random_calls: Names of unreplayable random functions it called.
        problems: Why some call cannot be replayed.
        checks: ``(error, tolerance, what)`` to verify once (attention outputs).
        autocast: The lower precision of ``torch.autocast`` the pass ran under, if any.

    """

    batch: int | None
    inputs: list[weakref.ref[Tensor]] = field(default_factory=list)
    captured: bool = False
    draws: list[Draw] = field(default_factory=list)
    stray: bool = False
    random_calls: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    checks: list[tuple[Tensor, float, str]] = field(default_factory=list)
    autocast: torch.dtype | None = None

    @property
    def random(self) -> bool:
        """Whether the forward pass drew random numbers."""
        return bool(self.draws or self.stray or self.problems)

    def problem(self) -> str | None:
        """Why this pass cannot be replayed, ``None`` if it can (one device sync)."""
        if self.checks:
            errors = torch.stack([e.detach().double().reshape(()) for e, _, _ in self.checks])
            for value, (_, tol, what) in zip(errors.tolist(), self.checks):
                if not value <= tol:  # NaN fails too
                    self.problems.append(
                        f"{what} did not reproduce the kernel's output with the recorded "
                        f"dropout mask (relative error {value:.2g}): the attention kernel "
                        "drew its dropout mask in a way cockpit cannot read (a fused GPU "
                        "kernel); run attention in the math kernel on tracked steps "
                        "(torch.nn.attention.sdpa_kernel(SDPBackend.MATH)) or set its "
                        "dropout to 0"
                    )
            self.checks = []
        if self.problems:
            return "; ".join(dict.fromkeys(self.problems))
        if self.stray:
            if not self.captured:
                return (
                    "it drew random numbers while cockpit was not recording them (it "
                    "records the forward passes of tracked steps from now on)"
                )
            names = ", ".join(sorted(self.random_calls)) or "an operation other than dropout"
            return f"it drew random numbers cockpit cannot replay per sample ({names})"
        return None


# -- generators ---------------------------------------------------------------------------


def generator(device: torch.device) -> torch.Generator | None:
    """The default generator random calls on ``device`` draw from (``None``: unsupported)."""
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return None


def _states(generators: Sequence[torch.Generator]) -> list[Tensor]:
    return [g.get_state() for g in generators]


def _same(a: Sequence[Tensor], b: Sequence[Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _restore(generators: Sequence[torch.Generator], states: Sequence[Tensor]) -> None:
    for g, s in zip(generators, states):
        g.set_state(s)


@contextlib.contextmanager
def generators_kept(devices: Sequence[torch.device]) -> Iterator[None]:
    """Restore the default generators of ``devices`` (and the CPU's) on exit."""
    gens = _unique([generator(torch.device("cpu"))] + [generator(d) for d in devices])
    states = _states(gens)
    try:
        yield
    finally:
        _restore(gens, states)


def _unique(gens: Sequence[torch.Generator | None]) -> list[torch.Generator]:
    out: list[torch.Generator] = []
    for g in gens:
        if g is not None and all(g is not h for h in out):
            out.append(g)
    return out


# -- the random calls the modes handle ----------------------------------------------------

# scaled_dot_product_attention's (query, key, value, attn_mask, is_causal, scale, enable_gqa)
_AttentionArgs = tuple[Tensor, Tensor, Tensor, Tensor | None, bool, float | None, bool]


@dataclass
class _Call:
    """One handled random call, normalized."""

    kind: str
    name: str
    p: float
    shape: tuple[int, ...]
    apply: Callable[[Tensor], Tensor]  # the call's result for a mask multiplier
    redraw: Callable[[torch.dtype], Tensor]  # the same draw on ones: the mask multiplier
    device: torch.device
    attention: _AttentionArgs | None = None


def _bind(
    names: Sequence[str], defaults: Sequence[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
    """The values of ``names`` in a call ``(*args, **kwargs)``, with their defaults."""
    rest = zip(names[len(args) :], defaults[len(args) :])
    return list(args) + [kwargs.get(n, d) for n, d in rest]


def _lookup(table: dict[Any, Any], func: Any) -> Any:
    """``table.get(func)``, ``None`` for an unhashable ``func``."""
    try:
        return table.get(func)
    except TypeError:
        return None


def _random_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call | None:
    """``func(*args, **kwargs)`` as a :class:`_Call` if it is a dropout that draws, else ``None``."""
    if func in _FUNCTIONAL_DROPOUTS:
        x, p, training, inplace = _bind(
            ("input", "p", "training", "inplace"), (None, 0.5, True, False), args, kwargs
        )
        if not (training and 0.0 < float(p) < 1.0) or not isinstance(x, Tensor):
            return None
        return _dropout(x, float(p), bool(inplace), func.__name__, lambda t: func(t, p, True))
    aten = _lookup(_ATEN_DROPOUTS, func)
    if aten is not None:
        x, p, train = _bind(("input", "p", "train"), (None, 0.5, True), args, kwargs)
        if not (train and 0.0 < float(p) < 1.0) or not isinstance(x, Tensor):
            return None
        plain, inplace = aten
        return _dropout(x, float(p), inplace, f"torch.{func.__name__}", lambda t: plain(t, p, True))
    if func is _ATTENTION:
        q, k, v, mask, p, causal, scale, gqa = _bind(
            ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
            (None, None, None, None, 0.0, False, None, False),
            args,
            kwargs,
        )
        if not float(p) > 0.0:
            return None
        heads = (*k.shape[:-3], q.shape[-3]) if gqa and q.dim() >= 3 else k.shape[:-2]
        batch = torch.broadcast_shapes(q.shape[:-2], heads)
        shape = (*batch, q.shape[-2], k.shape[-2])
        device = q.device

        def redraw(dtype: torch.dtype) -> Tensor:
            return F.dropout(torch.ones(shape, dtype=dtype, device=device), float(p), True)

        def apply(multiplier: Tensor) -> Tensor:
            return attention(q, k, v, mask, bool(causal), scale, bool(gqa), multiplier)

        return _Call(
            "attention",
            "scaled_dot_product_attention",
            float(p),
            tuple(shape),
            apply,
            redraw,
            device,
            (q, k, v, mask, bool(causal), scale, bool(gqa)),
        )
    return None


def _dropout(
    x: Tensor, p: float, inplace: bool, name: str, draw: Callable[[Tensor], Tensor]
) -> _Call:
    def apply(multiplier: Tensor) -> Tensor:
        return x.mul_(multiplier) if inplace else x * multiplier

    def redraw(dtype: torch.dtype) -> Tensor:
        return draw(torch.ones_like(x, dtype=dtype))

    return _Call("dropout", name, p, tuple(x.shape), apply, redraw, x.device)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    multiplier: Tensor,
) -> Tensor:
    """Scaled dot-product attention by its formula, with dropout as ``weights * multiplier``.

    The operations of PyTorch's math kernel (query and key each scaled by the square root
    of the scale, boolean and causal masks as ``-inf`` biases, a softmax that gives 0 on
    fully masked rows), so its output agrees with the kernel's up to rounding.
    """
    length, source = q.shape[-2], k.shape[-2]
    factor = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    root = math.sqrt(abs(factor))
    if enable_gqa:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    weights = (q * (root if factor >= 0 else -root)) @ (k.transpose(-2, -1) * root)
    if is_causal:
        keep = torch.ones(length, source, dtype=torch.bool, device=q.device).tril()
        attn_mask = keep
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=weights.dtype).masked_fill(
                attn_mask.logical_not(), float("-inf")
            )
        weights = weights + attn_mask.to(weights.dtype)
    weights = (
        torch._safe_softmax(weights, -1) if hasattr(torch, "_safe_softmax") else weights.softmax(-1)
    )
    return (weights * multiplier.to(weights.dtype)) @ v


def _tolerance(dtype: torch.dtype) -> float:
    """Accepted relative error of attention by formula against the kernel in ``dtype``."""
    if dtype == torch.float64:
        return 1e-10
    if dtype == torch.float32:
        return 1e-4
    return 5e-2


# -- recording ----------------------------------------------------------------------------


class RecordingMode(TorchFunctionMode):
    """Records the mask of every dropout call of a forward pass (see the module docstring).

    Args:
        record: Where the draws go.
        generators: The default generators whose consumption is accounted for.

    """

    def __init__(self, record: ForwardRecord, generators: Sequence[torch.Generator]):
        super().__init__()
        self.record = record
        self.generators = list(generators)
        self.last = _states(self.generators)

    def __torch_function__(  # noqa: D105
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _DESCEND:
            with self:
                return redispatch_function(func, types, args, kwargs)
        try:
            call = _random_call(func, args, kwargs)
        except Exception:  # an unusual call: PyTorch reports it; its draws count as stray
            call = None
        if call is None:
            name = _lookup(_RANDOM, func)
            if kwargs.get("generator") is not None:
                name = name or getattr(func, "__name__", "a function")
                self.record.problems.append(
                    f"{name} draws from its own torch.Generator, which cockpit does not replay"
                )
            elif name is not None:
                self.record.random_calls.add(name)
            return func(*args, **kwargs)
        return self._record(call, func, args, kwargs)

    def _record(self, call: _Call, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        gen = generator(call.device)
        if gen is not None and all(gen is not g for g in self.generators):
            self.generators.append(gen)
            self.last.append(gen.get_state())
        before = _states(self.generators)
        if not _same(before, self.last):
            self.record.stray = True
        out = func(*args, **kwargs)
        after = _states(self.generators)
        self.last = after
        if gen is None:
            self.record.problems.append(
                f"{call.name} runs on {call.device.type}, whose random numbers cockpit "
                "cannot replay"
            )
            return out
        dtype = out.dtype if isinstance(out, Tensor) else torch.get_default_dtype()
        try:
            try:
                _restore(self.generators, before)
                with torch.no_grad():
                    multiplier = call.redraw(dtype)
                redrawn = _states(self.generators)
            finally:
                _restore(self.generators, after)
            if not _same(redrawn, after):
                self.record.problems.append(
                    f"cockpit could not reproduce the random draws of {call.name}"
                )
                return out
            self._keep(call, multiplier, out)
        except Exception as err:  # never break the user's forward pass: refuse the step
            self.record.problems.append(
                f"recording the mask of {call.name} failed ({type(err).__name__}: {err})"
            )
        return out

    def _keep(self, call: _Call, multiplier: Tensor, out: Any) -> None:
        record, batch = self.record, self.record.batch
        rows = multiplier.shape[0] if multiplier.dim() else 0
        if batch is None or rows == 0 or rows % batch:
            self.record.problems.append(
                f"{call.name} acts on a tensor of shape {list(multiplier.shape)} whose "
                f"dimension 0 is not a multiple of the batch size {batch}, so its mask "
                "cannot be split into the samples' masks (the batch must come first, "
                "e.g. batch_first=True)"
            )
            return
        with torch.no_grad():
            mask = (multiplier != 0).unflatten(0, (batch, rows // batch))
            scale = multiplier.amax()
            if call.attention is not None and isinstance(out, Tensor):
                q, k, v, attn_mask, causal, factor, gqa = call.attention
                with torch.autocast(out.device.type, enabled=False):
                    again = attention(
                        q.to(out.dtype),
                        k.to(out.dtype),
                        v.to(out.dtype),
                        attn_mask,
                        causal,
                        factor,
                        gqa,
                        multiplier,
                    )
                error = (again - out).abs().amax() / out.abs().amax().clamp_min(1e-30)
                record.checks.append((error, _tolerance(out.dtype), call.name))
        record.draws.append(Draw(call.kind, call.name, call.p, mask, scale))

    def finish(self) -> None:
        """Note random numbers drawn after the last recorded call (the forward pass ended)."""
        if not _same(_states(self.generators), self.last):
            self.record.stray = True


# -- replay -------------------------------------------------------------------------------


class ReplayMode(TorchFunctionMode):
    """Substitutes sample ``n``'s recorded masks in the one-sample forward pass under ``vmap``.

    Args:
        draws: The user's forward pass's random calls.
        masks: Per draw, the mask of the sample(s) being computed (a ``vmap`` input).

    """

    def __init__(self, draws: Sequence[Draw], masks: Sequence[Tensor]):
        super().__init__()
        self.draws, self.masks = list(draws), list(masks)
        self.count = 0

    def __torch_function__(  # noqa: D105
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _DESCEND:
            with self:
                return redispatch_function(func, types, args, kwargs)
        call = _random_call(func, args, kwargs)
        if call is None:
            return func(*args, **kwargs)
        k = self.count
        self.count += 1
        if k >= len(self.draws):
            raise ReplayError(
                f"the recomputed forward pass calls {call.name} more often than yours did "
                f"({len(self.draws)} random call(s))"
            )
        draw, mask = self.draws[k], self.masks[k]
        if draw.kind != call.kind or draw.p != call.p:
            raise ReplayError(
                f"random call {k + 1} of the recomputed forward pass is {call.name} with "
                f"p={call.p:g}, yours was {draw.name} with p={draw.p:g}"
            )
        if tuple(mask.shape) != call.shape:
            raise ReplayError(
                f"{call.name} (random call {k + 1}) acts on a tensor of shape "
                f"{list(call.shape)} in the one-sample forward pass, but each sample's part "
                f"of your forward pass's mask has shape {list(mask.shape)}: the batch is not "
                "on dimension 0 there (or a mask is shared by the samples)"
            )
        return call.apply(mask * draw.scale)

    def finish(self) -> None:
        """Raise :class:`ReplayError` unless every recorded call was replayed."""
        if self.count != len(self.draws):
            raise ReplayError(
                f"the recomputed forward pass made {self.count} random call(s), yours made "
                f"{len(self.draws)}"
            )


# -- the recorder ---------------------------------------------------------------------------


def _stochastic_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules that draw random numbers in training mode (dropout, attention dropout)."""
    kinds = (torch.nn.modules.dropout._DropoutNd, torch.nn.MultiheadAttention)
    return [m for m in model.modules() if isinstance(m, kinds)]


def _draws(module: torch.nn.Module) -> bool:
    if not module.training:
        return False
    p = module.dropout if isinstance(module, torch.nn.MultiheadAttention) else module.p
    return float(p) > 0.0  # type: ignore[arg-type]


def _tensors(tree: Any) -> list[Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, Tensor)]


class ForwardRecorder:
    """Forward hooks on the attached model that record the random draws of its passes.

    Args:
        keep: Most recent forward passes kept.

    """

    def __init__(self, keep: int = KEEP_RECORDS):
        self.keep = keep
        self.model: torch.nn.Module | None = None
        self.records: list[ForwardRecord] = []
        self.random: bool | None = None  # drew random numbers before / did not / unknown
        self._stochastic: list[torch.nn.Module] = []
        self._devices: list[torch.device] = []
        self._handles: list[Any] = []
        self._always = False
        self._when: Callable[[], bool] | None = None
        self._paused = 0
        self._depth = 0  # calls of the model inside its own forward pass
        # (record, recording mode, generators, their states at the start when not recording)
        self._active: (
            tuple[ForwardRecord, RecordingMode | None, list[torch.Generator], list[Tensor]] | None
        ) = None

    # -- state ----------------------------------------------------------------------------

    def attach(self, model: torch.nn.Module) -> None:
        """Record the forward passes of ``model`` (unhooks a previous model)."""
        self.arm(False)
        self.model = model
        self.random = None
        self._stochastic = _stochastic_modules(model)

    def stochastic(self) -> bool:
        """Whether the model draws random numbers: dropout in training mode, or seen before."""
        return bool(self.random) or any(_draws(m) for m in self._stochastic)

    @property
    def registered(self) -> bool:
        """Whether the hooks are on the model."""
        return bool(self._handles)

    def arm(self, always: bool, when: Callable[[], bool] | None = None) -> None:
        """Record every forward pass (``always``), or those for which ``when()`` holds.

        Neither: the hooks come off and the records are dropped.
        """
        self._always, self._when = always, when
        wanted = self.model is not None and (always or when is not None)
        if wanted and not self._handles:
            assert self.model is not None
            self._handles = [
                self.model.register_forward_pre_hook(self._before, with_kwargs=True),
                self.model.register_forward_hook(self._after, with_kwargs=True, always_call=True),
            ]
        elif not wanted:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            self.records.clear()
        if self.model is not None and wanted:
            self._devices = list(
                {p.device for p in self.model.parameters() if p.device.type != "cpu"}
            )

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Ignore forward passes inside (a provider runs its own pass on the model)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def take(self, inputs: Any, batch: int) -> ForwardRecord | None:
        """The record of the forward pass of ``inputs`` (else the last one of ``batch`` samples).

        Older records are dropped; the returned one stays (a fallback at the same step may
        need it again).
        """
        leaves = _tensors(inputs)
        found = None
        for index in range(len(self.records) - 1, -1, -1):
            refs = self.records[index].inputs
            if any(r() is t for r in refs for t in leaves):
                found = index
                break
        if found is None:
            for index in range(len(self.records) - 1, -1, -1):
                if self.records[index].batch == batch:
                    found = index
                    break
        if found is None:
            return None
        del self.records[:found]
        return self.records[0]

    # -- the hooks ------------------------------------------------------------------------

    def _before(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self._active is not None:
            self._depth += 1
            return
        if self._paused or not torch.is_grad_enabled():
            return
        if not self._always and not (self._when is not None and self._when()):
            return
        leaves = _tensors((args, kwargs))
        batch = int(leaves[0].shape[0]) if leaves and leaves[0].dim() else None
        record = ForwardRecord(batch, [weakref.ref(t) for t in leaves])
        device_type = leaves[0].device.type if leaves else "cpu"
        with contextlib.suppress(Exception):  # an unusual device type: no autocast to note
            if torch.is_autocast_enabled(device_type):
                record.autocast = torch.get_autocast_dtype(device_type)
        devices = [*self._devices, *(t.device for t in leaves[:1])]
        gens = _unique([torch.default_generator] + [generator(d) for d in devices])
        capture = self.stochastic() or (self.random is None and module.training)
        mode = None
        if capture:
            record.captured = True
            mode = RecordingMode(record, gens)
            mode.__enter__()  # type: ignore[no-untyped-call]  # unannotated in torch
        self._active = (record, mode, gens, _states(gens) if mode is None else [])

    def _after(
        self,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> None:
        if self._active is None:
            return
        if self._depth:
            self._depth -= 1
            return
        record, mode, gens, start = self._active
        self._active = None
        if mode is not None:
            mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # as __enter__
            mode.finish()
        elif not _same(_states(gens), start):
            record.stray = True
        if record.random:
            self.random = True
        elif record.captured and module.training and self.random is None:
            self.random = False
        self.records.append(record)
        del self.records[: -self.keep]
