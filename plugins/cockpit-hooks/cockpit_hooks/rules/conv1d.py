"""``transformers``' ``Conv1D`` (GPT-2's linear layers): ``y = x W + b`` with ``W`` of shape ``[in, out]``.

A linear layer with a transposed weight: for the input ``a_n`` (``[T, in]``, any leading
axes flattened) and the gradient ``d_n`` of sample ``n``'s own loss w.r.t. the output,

    g_n(W) = sum_t a_nt d_nt^T,    g_n(b) = sum_t d_nt,

the factored form of :mod:`cockpit_hooks.rules.linear` with the roles of the two factors
swapped (Goodfellow, 2015, "Efficient per-example gradient computations"). The class is
matched by its qualified name, so the plugin does not import ``transformers``.
"""

from __future__ import annotations

import torch

from cockpit_core import OuterProductGrads, PerSampleGrads
from cockpit_hooks.rules.base import Piece
from cockpit_hooks.rules.linear import LinearRule, bias_grads, weight_grads


class Conv1DRule(LinearRule):
    """``transformers.pytorch_utils.Conv1D`` (``weight`` ``[in, out]``, ``bias`` ``[out]``).

    Its uses are a linear layer's (the input, completed by the output's gradient).
    """

    modules = ()
    class_names = ("transformers.pytorch_utils.Conv1D",)

    def per_sample(
        self, owner: torch.nn.Module, attr: str, pieces: list[Piece], batch_size: int
    ) -> PerSampleGrads:
        """``sum_t a_nt d_nt^T`` for the weight (``[in, out]``), ``sum_t d_nt`` for the bias."""
        shape = getattr(owner, attr).shape
        if attr == "bias":
            return bias_grads(pieces, batch_size, shape)
        linear = weight_grads(pieces, batch_size, torch.Size((shape[1], shape[0])))
        assert isinstance(linear, OuterProductGrads)
        return OuterProductGrads(linear.d, linear.a)  # g_n = sum_t a_nt d_nt^T
