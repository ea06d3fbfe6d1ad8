"""``cockpit check`` with a sample on the models people train (issue 28).

On a ``transformers`` GPT-2 and a nanoGPT, one real tracked step says which rule serves each
parameter (``Conv1D``, the tied embedding and head, the positions looked up once, the
model's own LayerNorm class), and the report is ok; on a model that would fail, the
command exits 1 naming the parameter and the fix.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from cockpit_core import Cockpit
from cockpit_core.cli.main import main
from cockpit_core.testing.models import NanoGPT, tiny_gpt2

B, T, V = 4, 8, 40
QUANTITIES = ["norm_test", "inner_test", "mean_gsnr", "grad_hist_1d"]


def _ids() -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))


def test_gpt2_check_names_the_rule_of_every_parameter():
    pytest.importorskip("transformers")
    model = tiny_gpt2()
    ids = _ids()
    cp = Cockpit(model, QUANTITIES)
    report = cp.check(model, sample=lambda m: m(input_ids=ids, labels=ids).loss)
    assert report.ok, str(report)
    assert report.sample is not None and report.sample.forward_passes == 1
    text = str(report)
    assert "hooks (Conv1D rule): parameter(s) 'transformer.h.0.attn.c_attn.weight'" in text
    assert "Embedding + Linear rules (tied: 'transformer.wte', 'lm_head')" in text
    assert "Embedding rule, its output captured where broadcast into the batch" in text
    assert "LayerNorm rule" in text
    cp.close()


def test_nanogpt_check_names_the_rule_of_every_parameter():
    torch.manual_seed(0)
    model = NanoGPT(vocab=V, block_size=16, d=24, layers=2)
    ids = _ids()
    cp = Cockpit(model, QUANTITIES)
    report = cp.check(model, sample=lambda m: m(ids, ids)[1])
    assert report.ok, str(report)
    text = str(report)
    assert "functional rule (F.layer_norm)" in text  # nanoGPT's own LayerNorm class
    assert "Embedding + Linear rules (tied: 'transformer.wte', 'lm_head')" in text
    cp.close()


class _MatrixParameter(torch.nn.Module):
    """The model multiplies its own parameter as a matrix: no module hook can split it."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6, 6))
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.head(x @ self.w)


def test_cli_exits_1_naming_the_parameter_and_the_fix(monkeypatch, capsys):
    module = types.ModuleType("cockpit_check_real_models")
    module.matrix = _MatrixParameter
    monkeypatch.setitem(sys.modules, "cockpit_check_real_models", module)
    spec = ["check", "cockpit_check_real_models:matrix", "--quantities", "norm_test"]
    assert main([*spec, "--input-shape", "6", "--loss", "cross_entropy", "--backend", "hooks"]) == 1
    out = capsys.readouterr().out
    assert "'w' (_MatrixParameter)" in out
    assert "_MatrixParameter.forward uses its parameter 'w' in" in out
    assert "move that computation into a module (e.g. nn.Linear)" in out
    assert "NOT OK" in out
