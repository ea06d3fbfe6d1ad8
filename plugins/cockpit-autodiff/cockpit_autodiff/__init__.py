"""cockpit-autodiff: curvature diagonals of any model by automatic differentiation.

The ``autodiff`` provider computes ``diag_hessian`` (and, with :mod:`.ggn_diagonal`,
``diag_ggn_exact`` and ``diag_ggn_mc``) for every parameter of an attached model, from a
loss recomputed after the user's ``backward()``. BackPACK, where it supports a model, is
cheaper and preferred by ``backend="auto"``. Its options (:mod:`.options`: the bound
``max_hvps`` on Hessian-vector products, ``block``, ``mc_seed``) are set per Cockpit with
:func:`autodiff_registry` (:mod:`.registry`). See ``docs/any_model.md``.
"""

from cockpit_autodiff.options import AutodiffOptions
from cockpit_autodiff.provider import AutodiffProvider, hessian_diagonal
from cockpit_autodiff.registry import autodiff_registry

__all__ = ["AutodiffOptions", "AutodiffProvider", "autodiff_registry", "hessian_diagonal"]
