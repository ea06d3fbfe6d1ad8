"""Whether recomputed per-sample gradients belong to the gradient the user's ``backward`` made.

Per-sample statistics assume ``p.grad = mean_n g_n`` (times the loss scale). Providers that
read the user's own forward and backward pass satisfy it by construction; a provider that
``recomputes`` the pass after ``backward`` (``torch.func``) does only if its pass is the
user's: same random numbers, same model state, same loss. Comparing the mean of its
per-sample gradients with ``p.grad`` catches a pass that differs.

The comparison fits ``p.grad ~ c * mean_n g_n`` by least squares and looks at the relative
residual ``||p.grad - c * mean|| / ||p.grad||``, which no scale factor changes (a
``GradScaler``'s, or a loss that is not a mean: the per-sample-mean loop check reports
those through ``c``), while a pass with other dropout masks changes the direction of the
mean by a fraction of its size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cockpit_core.engine.loop_checks import gradient_precision

STRICTEST = 1e-8
"""The smallest :func:`tolerance`: residuals below it need no precision check (no sync)."""

LOOSEST = 3e-2
"""The tolerance of half-precision gradients, for a pass whose precision is unknown."""


def residuals(grads: Sequence[Tensor], means: Sequence[Tensor]) -> Tensor:
    """Per parameter ``||g - c m|| / ||g||`` with ``c = (g . m) / (m . m)`` (no sync).

    Each in its gradient's precision (at least float32). The residual is formed as a
    difference of vectors, not of squared norms, so it resolves values far below the
    tolerance of that precision. 0 where both vanish; 1 where only the mean does; ``inf``
    where only the gradient does.

    Returns:
        A ``[len(grads)]`` float64 tensor on the first gradient's device.

    """
    device = grads[0].device
    rows = []
    for grad, mean in zip(grads, means):
        dtype = torch.promote_types(grad.dtype, torch.float32)
        g = grad.detach().reshape(-1).to(dtype)
        m = mean.detach().reshape(-1).to(device=g.device, dtype=dtype)
        mm = torch.dot(m, m)
        scale = torch.dot(g, m) / mm.clamp_min(torch.finfo(dtype).tiny)
        rest = torch.linalg.vector_norm(g - scale * m)
        rows.append(torch.stack([rest, torch.linalg.vector_norm(g), mm]).to(device, torch.float64))
    rest, norm, mm = torch.stack(rows).unbind(1)
    out = torch.where(norm > 0, rest / torch.where(norm > 0, norm, 1.0), float("inf"))
    return torch.where((norm == 0) & (mm == 0), 0.0, out)


def residual(grad: Tensor, mean: Tensor) -> Tensor:
    """:func:`residuals` of one parameter (a 0-dim tensor)."""
    return residuals([grad], [mean])[0]


def floor(grad: Tensor) -> float:
    """The smallest :func:`tolerance` ``grad`` can have (by its dtype alone, no sync)."""
    if grad.dtype == torch.float64:
        return STRICTEST
    if grad.dtype == torch.float32:
        return 1e-3
    return LOOSEST


def tolerance(grad: Tensor, autocast: torch.dtype | None = None) -> float:
    """Accepted :func:`residual` for ``grad``, by the precision it was formed in.

    ``autocast``: the lower precision the user's forward pass ran in (``torch.autocast``),
    if any. The recomputation runs in the parameters' precision, so even gradients formed
    in float32 (of LayerNorm or embedding weights, behind bfloat16 activations) differ from
    it by that precision's rounding: the tolerance is then that of ``autocast``.

    float64: 1e-8 (rounding of the batched sum against the per-sample sums, ~1e-16, grows
    by the ratio of per-sample gradient norms to the norm of their mean). float32: 1e-3 as
    for the module hooks' completeness check, 1e-2 on a GPU that may run float32 matmuls
    and convolutions in TF32 (10 mantissa bits). bfloat16/float16 gradients (``autocast``,
    detected by :func:`~cockpit_core.engine.loop_checks.gradient_precision`, or under
    ``autocast``): 4 unit roundoffs, at least 3e-2. Another network's per-sample gradients (other dropout masks) miss by a
    fraction of the gradient's size, far above these.
    """
    dtype = gradient_precision(grad.detach())
    if autocast is not None and torch.finfo(autocast).eps > torch.finfo(dtype).eps:
        dtype = autocast
    if dtype == torch.float64:
        return 1e-8
    if dtype == torch.float32:
        if grad.is_cuda and (
            torch.backends.cuda.matmul.allow_tf32
            or torch.backends.cudnn.allow_tf32
            or torch.get_float32_matmul_precision() != "highest"
        ):
            return 1e-2
        return 1e-3
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 1e-3
    return max(LOOSEST, 4 * eps)


def mismatch_message(who: str, names: list[str], worst: float, tol: float) -> str:
    """Why the statistics of ``names`` that ``who`` recomputed are missing."""
    listed = ", ".join(f"'{n}'" for n in names[:5]) + (
        f" and {len(names) - 5} more" if len(names) > 5 else ""
    )
    return (
        f"{who} recomputed per-sample gradients of {listed} whose mean does not match "
        f"p.grad (relative residual {worst:.2g}, tolerance {tol:.0e}): the recomputed pass "
        "differs from your forward and backward pass (random numbers cockpit could not "
        "replay, state that changes between calls, another loss than loss_fn), or p.grad is "
        "not the gradient of the mean of the per-sample losses (extra loss terms, gradients "
        "changed inside the `with cp(...)` block). Those statistics are missing at this "
        "step rather than computed for another network."
    )
