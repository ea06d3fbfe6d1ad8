"""cockpit-autodiff: curvature diagonals of any model by automatic differentiation.

The ``autodiff`` provider computes ``diag_hessian`` (and, with :mod:`.ggn_diagonal`,
``diag_ggn_exact`` and ``diag_ggn_mc``) for every parameter of an attached model, from a
loss recomputed after the user's ``backward()``. BackPACK, where it supports a model, is
cheaper and preferred by ``backend="auto"``. See ``docs/any_model.md``.
"""

from cockpit_autodiff.provider import AutodiffProvider, hessian_diagonal

__all__ = ["AutodiffProvider", "hessian_diagonal"]
