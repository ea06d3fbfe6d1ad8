"""Brute-force definitions of per-sample statistics, for checking a statistics provider.

Given the per-sample gradients ``g_n`` of one parameter (``[B, *shape]``, e.g. from
:func:`~cockpit_core.testing.reference.per_sample_gradients`), :func:`reference_statistic`
computes what a statistic denotes, straight from its definition; :func:`relative_error`
measures how far a provider's value is from it. The transforms :func:`directions`,
:func:`cubes`, :func:`dots` and :func:`dots_factored` are the ones
:func:`~cockpit_core.testing.check_provider` requests (a ``per_sample_projection``, a
transform needing every element, a transform with a ``factored_fn``)::

    from cockpit_core.testing.providers.reference import reference_statistic, relative_error

    expected = reference_statistic(BATCH_L2, grads, param)
    assert relative_error(value, expected) <= 1e-10
"""

from __future__ import annotations

import torch
from torch import Tensor

from cockpit_core.statistics.kinds import StatisticKind
from cockpit_core.statistics.per_sample import DenseGrads, PerSampleGrads
from cockpit_core.statistics.statistic import Statistic


def directions(grad: Tensor, param: Tensor) -> Tensor:
    """Two directions for a ``per_sample_projection``: the final gradient and ``cos(theta)``.

    Args:
        grad: The parameter's final gradient ``p.grad``.
        param: The parameter's value ``theta``.

    Returns:
        ``[2, *param.shape]``.

    """
    return torch.stack([grad, torch.cos(param)])


def cubes(grads: Tensor, param: Tensor) -> Tensor:
    """``theta * sum_n g_n^3``: a transform needing every element, additive over samples.

    Args:
        grads: Per-sample gradients ``[B, *param.shape]``.
        param: The parameter's value ``theta``.

    Returns:
        A tensor of the parameter's shape (fit for ``reduce="sum"``).

    """
    return (grads**3).sum(0) * param


def dots(grads: Tensor, param: Tensor) -> Tensor:
    """``g_n . theta`` from the materialized per-sample gradients.

    Args:
        grads: Per-sample gradients ``[B, *param.shape]``.
        param: The parameter's value ``theta``.

    Returns:
        ``[B]`` (fit for ``reduce="gather"``).

    """
    return grads.flatten(1) @ param.flatten()


def dots_factored(grads: PerSampleGrads, param: Tensor) -> Tensor:
    """``g_n . theta`` from any form of per-sample gradients (:meth:`PerSampleGrads.dot`).

    The ``factored_fn`` of :func:`dots`: it must return what :func:`dots` returns on
    ``grads.materialize()``.

    Args:
        grads: The per-sample gradients in the provider's form.
        param: The parameter's value ``theta``.

    Returns:
        ``[B]``.

    """
    return grads.dot(param.unsqueeze(0))[:, 0]


def reference_statistic(
    stat: Statistic, grads: Tensor, param: Tensor, grad: Tensor | None = None
) -> Tensor:
    """The value of a per-sample statistic, computed from its definition.

    Built-in kinds by their formulas (``batch_l2``: ``||g_n||^2``; ``sum_grad_squared``:
    ``sum_n g_n * g_n``; ``batch_dot``: ``g_n . g_m``; ``grad_batch``: ``g_n``;
    ``batch_projection``: ``g_n . v_k`` with the final gradient or the statistic's
    directions ``v_k``); a ``per_sample_transform`` by its ``fn``; any other per-sample
    kind by its own ``from_per_sample`` on the dense gradients.

    Args:
        stat: The statistic.
        grads: Per-sample gradients ``g_n`` of one parameter, ``[B, *param.shape]``.
        param: The parameter's value ``theta``.
        grad: The parameter's final gradient ``p.grad`` (projections only); default the
            mean of ``grads`` (the gradient of the mean loss).

    Returns:
        The reference value, shaped as the statistic's value.

    """
    flat = grads.flatten(1)
    kind = str(stat.kind)
    if kind == "batch_l2":
        return (flat**2).sum(1)
    if kind == "sum_grad_squared":
        return (grads**2).sum(0)
    if kind == "batch_dot":
        return flat @ flat.T
    if kind == "grad_batch":
        return grads
    if kind == "batch_projection":
        if grad is None:
            grad = grads.mean(0)
        if stat.fn is None:
            return flat @ grad.flatten()
        return flat @ stat.fn(grad, param).flatten(1).T
    if stat.fn is not None:  # a per_sample_transform
        return stat.fn(grads, param)
    own = stat.kind
    if not isinstance(own, StatisticKind) or own.from_per_sample is None:
        raise TypeError(f"no reference for {stat.describe()}: its kind has no from_per_sample.")
    value: Tensor = own.from_per_sample(DenseGrads(grads), stat, param)  # a plugin's kind
    return value


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """``max |actual - expected| / max |expected|`` (absolute where the reference is zero).

    Args:
        actual: The value to check.
        expected: The reference, of the same shape.

    Returns:
        The relative error (``0.0`` for empty tensors).

    Raises:
        ValueError: The shapes differ.

    """
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {tuple(actual.shape)} != {tuple(expected.shape)}")
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    err = float((actual - expected).abs().max()) if expected.numel() else 0.0
    return err / scale if scale > 0 else err
