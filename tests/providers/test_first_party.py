"""The first-party providers pass the conformance kit they ship to third parties."""

from __future__ import annotations

import pytest

from cockpit_core.statistics.func import FuncProvider
from cockpit_core.testing import check_provider, tiny_cnn, tiny_mlp
from cockpit_core.testing.transformer import tiny_transformer

cockpit_hooks = pytest.importorskip("cockpit_hooks")
cockpit_backpack = pytest.importorskip("cockpit_backpack")

# BackPACK warns about every module of the transformer it has no extension for
pytestmark = pytest.mark.filterwarnings("ignore:Extension saving to grad_batch:UserWarning")


def test_func_provider():
    report = check_provider(FuncProvider)
    for problem in ("mlp", "cnn", "transformer"):
        assert not any(report.unsupported[problem].values())  # it supports every parameter


def test_hooks_provider():
    report = check_provider(cockpit_hooks.HooksProvider)
    assert len(report.checked["transformer"]["batch_l2"]) == 16
    # the learned positional embedding, owned by the model itself, is captured where the
    # model adds it to the batch
    assert not report.unsupported["transformer"]["batch_l2"]


def _extended_problems():
    """BackPACK needs extended models: tiny_mlp and tiny_cnn are, the transformer partly."""
    return [tiny_mlp(), tiny_cnn(), tiny_transformer(extended=True)]


def test_backpack_provider():
    report = check_provider(cockpit_backpack.BackpackProvider, problems=_extended_problems())
    for problem in ("mlp", "cnn"):
        assert not any(report.unsupported[problem].values())
        assert set(report.checked[problem]) >= {"diag_hessian", "diag_ggn_exact", "batch_dot"}
    # in the transformer only the extended nn.Linear layers of the MLP block and the head
    assert sorted(report.checked["transformer"]["batch_l2"]) == [
        "encoder.linear1.bias",
        "encoder.linear1.weight",
        "encoder.linear2.bias",
        "encoder.linear2.weight",
        "head.bias",
        "head.weight",
    ]
