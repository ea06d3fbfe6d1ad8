"""Per-sample gradients of one parameter, materialized or in factored form.

For a linear layer ``y = W a + b`` the per-sample gradients are outer products,
``g_n(W) = d_n a_n^T`` and ``g_n(b) = d_n`` with ``d_n = dl_n/dy_n``. Their norms, dot products
and sums of squares follow from the factors without forming the ``B x out x in`` tensor
(Dangel et al., 2020, BackPACK, Sec. 2; Goodfellow, 2015, "Efficient per-example gradient
computations"):

    ||g_n||^2 = ||d_n||^2 ||a_n||^2,   g_n . g_m = (d_n . d_m)(a_n . a_m),
    sum_n g_n * g_n = (d*d)^T (a*a).

Every statistic is computed the same way whatever other statistics are requested, so a
value does not depend on which quantities share the step.
"""

from __future__ import annotations

from torch import Tensor


class MaterializedGrads:
    """Per-sample gradients held as a ``[B, *shape]`` tensor."""

    def __init__(self, grads: Tensor):
        self.grads = grads
        self._flat = grads.flatten(start_dim=1)

    def batch_l2(self) -> Tensor:
        """``||g_n||^2``, shape ``[B]``."""
        return (self._flat**2).sum(1)

    def batch_dot(self) -> Tensor:
        """``g_n . g_m``, shape ``[B, B]``."""
        return self._flat @ self._flat.T

    def sum_grad_squared(self) -> Tensor:
        """``sum_n g_n * g_n``, parameter shape."""
        return (self.grads**2).sum(0)

    def materialize(self) -> Tensor:
        """The per-sample gradients, ``[B, *shape]``."""
        return self.grads


class FactoredLinearGrads:
    """Per-sample gradients of a linear layer's weight, ``g_n = d_n a_n^T``.

    Args:
        inputs: Layer inputs ``a``, shape ``[B, in]``.
        grad_outputs: Gradients of the per-sample losses w.r.t. the outputs, ``[B, out]``.

    """

    def __init__(self, inputs: Tensor, grad_outputs: Tensor):
        self.a = inputs
        self.d = grad_outputs
        self._materialized: Tensor | None = None

    def batch_l2(self) -> Tensor:
        """``||d_n||^2 ||a_n||^2``."""
        return (self.d**2).sum(1) * (self.a**2).sum(1)

    def batch_dot(self) -> Tensor:
        """``(d_n . d_m)(a_n . a_m)``."""
        return (self.d @ self.d.T) * (self.a @ self.a.T)

    def sum_grad_squared(self) -> Tensor:
        """``(d*d)^T (a*a)``, shape ``[out, in]``."""
        return (self.d**2).T @ (self.a**2)

    def materialize(self) -> Tensor:
        """``d_n a_n^T``, shape ``[B, out, in]`` (formed once, on first use)."""
        if self._materialized is None:
            self._materialized = self.d.unsqueeze(2) * self.a.unsqueeze(1)
        return self._materialized
