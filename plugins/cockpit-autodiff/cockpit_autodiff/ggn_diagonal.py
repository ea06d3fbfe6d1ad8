"""Diagonal of the generalized Gauss-Newton matrix by per-sample vector-Jacobian products.

The generalized Gauss-Newton (GGN) matrix of the mean mini-batch loss is (Schraudolph,
2002, "Fast curvature matrix-vector products for second-order gradient descent")

    G = (1/B) sum_n J_n^T H_n J_n,

with ``J_n = d f(x_n) / d theta`` the ``[C, D]`` Jacobian of sample ``n``'s model output
and ``H_n = d^2 l_n / d f^2`` the ``[C, C]`` Hessian of its loss w.r.t. that output. With
any factorization ``H_n = S_n S_n^T`` (``S_n`` of shape ``[C, K]``) its diagonal is

    diag(G) = (1/B) sum_n sum_k (J_n^T s_nk)^2,

one vector-Jacobian product (VJP) per column ``s_nk`` of ``S_n``. Exactly, ``K = C``
(a square-root factor of ``H_n``). The Monte-Carlo (MC) estimate replaces ``S_n`` by ``M``
random vectors with ``E[s s^T] = H_n``, scaled by ``1/sqrt(M)`` (Martens & Grosse, 2015,
"Optimizing neural networks with Kronecker-factored approximate curvature", section 5;
Dangel et al., 2020, "BackPACK: packing more into backprop", ``DiagGGNMC``):

    diag(G) ~ (1/B) sum_n (1/M) sum_m (J_n^T s_nm)^2,

which is unbiased. The VJPs are batched with ``torch.func``: ``vmap`` over samples of
``vjp`` of the per-sample output function, and ``vmap`` over the columns of ``S_n``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap

from cockpit_core.engine.attention import math_attention

SUPPORTED_LOSSES = ("cross_entropy", "mse")


@contextlib.contextmanager
def _functorch_safe(model: nn.Module) -> Iterator[None]:
    """Hide module hooks that cannot run under ``torch.func`` transforms, then restore them.

    Full backward (pre-)hooks wrap a module's inputs and outputs in an ``autograd.Function``
    without ``setup_context``, which functorch rejects; they could not fire here anyway.
    BackPACK's forward hooks (``backpack.extend``) would store batched tensors on the
    modules, so they are hidden too. Every other hook stays active.
    """
    swapped: list[tuple[nn.Module, str, object]] = []
    try:
        for module in model.modules():
            if module._backward_pre_hooks:
                swapped.append((module, "_backward_pre_hooks", module._backward_pre_hooks))
                module._backward_pre_hooks = type(module._backward_pre_hooks)()
            if module._backward_hooks and module._is_full_backward_hook:
                swapped.append((module, "_backward_hooks", module._backward_hooks))
                module._backward_hooks = type(module._backward_hooks)()
            hooks = module._forward_hooks
            if any(getattr(h, "__module__", "").startswith("backpack") for h in hooks.values()):
                swapped.append((module, "_forward_hooks", hooks))
                module._forward_hooks = type(hooks)(
                    (k, h)
                    for k, h in hooks.items()
                    if not getattr(h, "__module__", "").startswith("backpack")
                )
        yield
    finally:
        for module, attr, original in reversed(swapped):
            setattr(module, attr, original)


def _cross_entropy_sqrt(logits: Tensor) -> Tensor:
    """Square-root factor of the softmax cross-entropy Hessian w.r.t. the logits.

    ``H = diag(p) - p p^T`` with ``p = softmax(f)``; ``S = diag(sqrt(p)) - p sqrt(p)^T``
    satisfies ``S S^T = diag(p) - 2 p p^T + p (sqrt(p)^T sqrt(p)) p^T = H`` because
    ``sum_c p_c = 1``. Its columns are ``s_k = sqrt(p_k) (e_k - p)``, so
    ``H = sum_k p_k (e_k - p)(e_k - p)^T``, the expectation the MC factor samples.

    Args:
        logits: ``[C]`` logits of one sample.

    Returns:
        ``[C, C]`` matrix ``S^T``: row ``k`` is the column ``s_k``, ``sum_k s_k s_k^T = H``.

    """
    p = torch.softmax(logits, dim=-1)
    sqrt_p = p.sqrt()
    return torch.diag_embed(sqrt_p) - sqrt_p.unsqueeze(-1) * p.unsqueeze(-2)


def _cross_entropy_mc(logits: Tensor, gumbel: Tensor) -> Tensor:
    """MC factor of the cross-entropy Hessian: ``s = p - onehot(y~)``, ``y~ ~ Cat(p)``.

    ``E[s s^T] = p p^T - 2 p p^T + diag(p) = H``. The class is drawn by the Gumbel-max trick
    (``y~ = argmax(log p + g)`` with standard Gumbel noise ``g``), so the randomness comes
    from outside ``vmap``.

    Args:
        logits: ``[C]`` logits of one sample.
        gumbel: ``[M, C]`` standard Gumbel noise.

    Returns:
        ``[M, C]`` sampled vectors (unscaled).

    """
    p = torch.softmax(logits, dim=-1)
    drawn = torch.argmax(torch.log_softmax(logits, dim=-1) + gumbel, dim=-1)  # [M]
    classes = torch.arange(logits.shape[-1], device=logits.device)
    onehot = (drawn.unsqueeze(-1) == classes).to(logits.dtype)  # [M, C]
    return p - onehot


def ggn_diagonal(
    model: nn.Module,
    params: dict[str, Tensor],
    inputs: Tensor,
    targets: Tensor,
    loss: str,
    mc_samples: int | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Diagonal of the GGN of the mean mini-batch loss, exact or Monte-Carlo.

    ``diag(G) = (1/B) sum_n sum_k (J_n^T s_nk)^2`` where ``S_n S_n^T = H_n`` (Schraudolph,
    2002). Loss Hessians w.r.t. the model output ``f_n`` (``C`` entries per sample):

    * ``"cross_entropy"`` (``F.cross_entropy``, logits ``[B, C]``):
      ``H_n = diag(p_n) - p_n p_n^T``, ``S_n = diag(sqrt(p_n)) - p_n sqrt(p_n)^T``
      (columns ``sqrt(p_nk) (e_k - p_n)``);
      MC: ``s = p_n - onehot(y~)``, ``y~ ~ Cat(p_n)`` (Martens & Grosse, 2015; Dangel et
      al., 2020, BackPACK ``DiagGGNMC``).
    * ``"mse"`` (``nn.MSELoss(reduction="mean")`` = ``(1/B) sum_n l_n`` with
      ``l_n = (1/C) ||f_n - y_n||^2``, output of any shape ``[B, ...]``):
      ``H_n = (2/C) I``, ``S_n = sqrt(2/C) I``; MC: ``s = sqrt(2/C) z``, ``z ~ N(0, I)``.

    The loss Hessian does not depend on the targets for either loss; ``targets`` is only
    checked against the batch size.

    Args:
        model: The network; evaluated as ``functional_call(model, params, (inputs,))`` on
            one sample at a time under ``vmap``, so it must treat samples independently (no
            batch norm in training mode, no dropout).
        params: Parameters to differentiate, keyed by ``model.named_parameters()`` names
            (a subset is fine; the others keep the module's values).
        inputs: ``[B, ...]`` mini-batch inputs.
        targets: ``[B, ...]`` mini-batch targets.
        loss: ``"cross_entropy"`` or ``"mse"``.
        mc_samples: ``None`` for the exact diagonal (``C`` VJPs per sample), else the number
            ``M`` of sampled vectors per sample (``M`` VJPs per sample).
        generator: Random generator of the MC draws (default: torch's global one).

    Returns:
        ``diag(G)`` keyed and shaped like ``params``, in the parameters' dtype.

    Raises:
        ValueError: For an unknown ``loss``, a non-positive ``mc_samples``, a batch size
            mismatch, or cross-entropy outputs that are not ``[B, C]``.

    """
    if loss not in SUPPORTED_LOSSES:
        raise ValueError(f"Unknown loss {loss!r}; supported: {', '.join(SUPPORTED_LOSSES)}.")
    if mc_samples is not None and mc_samples < 1:
        raise ValueError(f"mc_samples must be a positive integer or None, got {mc_samples}.")
    if len(inputs) != len(targets):
        raise ValueError(f"Batch size mismatch: {len(inputs)} inputs, {len(targets)} targets.")
    if not params:
        return {}

    names = list(params)
    first = next(iter(params.values()))
    dtype, device = first.dtype, first.device
    batch = len(inputs)

    with _functorch_safe(model), torch.no_grad():  # output shape only, from one sample
        out_shape = functional_call(model, params, (inputs[:1],)).shape[1:]
    classes = math.prod(out_shape)
    if loss == "cross_entropy" and len(out_shape) != 1:
        raise ValueError(
            f"cross_entropy expects outputs of shape [B, C], got [B, {', '.join(map(str, out_shape))}]."
        )

    # Noise is drawn outside vmap, from ``generator`` (on its device), in the parameters' dtype.
    draw_on = device if generator is None else generator.device
    if mc_samples is None:
        noise = torch.zeros(batch, 0, dtype=dtype, device=device)  # unused placeholder
    elif loss == "cross_entropy":
        uniform = torch.rand(
            batch, mc_samples, classes, generator=generator, dtype=dtype, device=draw_on
        ).to(device)
        tiny = torch.finfo(dtype).tiny
        exponential = -torch.log(uniform.clamp(min=tiny))  # Exp(1), > 0 as u < 1
        noise = -torch.log(exponential.clamp(min=tiny))  # standard Gumbel
    else:
        noise = torch.randn(
            batch, mc_samples, classes, generator=generator, dtype=dtype, device=draw_on
        ).to(device)
    # 1/M of the MC average folded into the vectors: (J^T s / sqrt(M))^2 = (J^T s)^2 / M.
    mse_scale = math.sqrt(2.0 / classes)
    mc_scale = 1.0 if mc_samples is None else 1.0 / math.sqrt(mc_samples)

    def per_sample(x_n: Tensor, noise_n: Tensor) -> dict[str, Tensor]:
        def output(p: dict[str, Tensor]) -> Tensor:
            out: Tensor = functional_call(model, p, (x_n.unsqueeze(0),))
            return out.reshape(-1)

        # without has_aux, vjp returns (output, pullback)
        f_n, vjp_fn = cast("tuple[Tensor, Callable[..., Any]]", vjp(output, params))
        f_n = f_n.detach()
        if loss == "cross_entropy":
            if mc_samples is None:
                factors = _cross_entropy_sqrt(f_n)  # [C, C]
            else:
                factors = _cross_entropy_mc(f_n, noise_n) * mc_scale  # [M, C]
        elif mc_samples is None:
            factors = mse_scale * torch.eye(classes, dtype=f_n.dtype, device=f_n.device)
        else:
            factors = (mse_scale * mc_scale) * noise_n  # [M, C]
        (grads,) = vmap(vjp_fn)(factors)  # each [K, *shape]
        return {k: (g**2).sum(0) for k, g in grads.items()}

    with _functorch_safe(model), math_attention(), torch.enable_grad():
        per_n = vmap(per_sample)(inputs, noise)  # each [B, *shape]
    return {k: per_n[k].sum(0).div(batch).to(params[k].dtype) for k in names}
