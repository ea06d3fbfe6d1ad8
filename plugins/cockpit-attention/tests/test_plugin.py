"""The plugin: registration, protocol, the log, the panels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cockpit_attention import Attention
from cockpit_attention.instruments import INSTRUMENTS, layer_series

from cockpit_core import Cockpit, ConfigError
from cockpit_core.log import dumps, loads
from cockpit_core.plugin.registry import default_registry
from cockpit_core.testing import check_instrument, check_plugin, check_quantity
from cockpit_core.testing.models import NanoGPT
from cockpit_core.testing.transformer import tiny_transformer


def _nanogpt_output(steps: int = 4) -> dict:
    torch.manual_seed(0)
    model = NanoGPT(vocab=40, layers=3).double()
    cp = Cockpit(
        model, ["attention", {"name": "attention", "label": "s", "max_elements": 10, "queries": 4}]
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        idx = torch.randint(0, 40, (2, 8), generator=gen)
        loss = model(idx, idx)[1]
        with cp(step, loss=loss):
            loss.backward()
        opt.step()
        opt.zero_grad()
    assert not cp.errors
    return cp.get_output()


def test_registered_through_the_entry_point():
    registry = default_registry()
    assert registry.quantities["attention"].cls is Attention
    assert registry.quantities["attention"].distribution == "cockpit-attention"
    assert {"attention_max_logit", "attention_entropy"} <= set(registry.instruments)


def test_protocol_options_and_the_log():
    for name, field in Attention.Config.model_fields.items():
        assert not field.is_required() and field.description, name
    with pytest.raises(ConfigError, match="did you mean"):
        Attention(querys=8)
    with pytest.raises(ConfigError):
        Attention(queries=1)  # a standard error needs two
    check_quantity(Attention)  # an MLP: empty values
    check_quantity(Attention, problem=tiny_transformer())  # nn.TransformerEncoderLayer
    output = _nanogpt_output(2)
    for values in output.values():
        for key in ("attention", "s"):
            value = values[key]
            assert loads(dumps({"v": value}))["v"] == value
    assert output[0]["s"]["sampled"] == 4 and output[0]["attention"]["sampled"] is None


def test_the_label_shares_nothing_with_different_options():
    a, b = Attention(), Attention(max_elements=10)
    assert a.probe.key != b.probe.key and a.modules_probe.key == b.modules_probe.key
    assert Attention().probe.key == a.probe.key


def test_layer_series_matches_layers_by_name():
    output = {
        0: {"attention": {"modules": ["a", "b"], "max_logit": [[1.0, 3.0], [2.0, 0.5]]}},
        1: {"attention": {"modules": ["b", "c"], "max_logit": [[4.0], [5.0, 6.0]]}},
        2: {"other": 1.0},
    }
    steps, layers, table = layer_series(output, "max_logit", np.max)
    assert steps.tolist() == [0, 1] and layers == ["a", "b", "c"]
    np.testing.assert_array_equal(table, [[3.0, 2.0, np.nan], [np.nan, 4.0, 6.0]])


@pytest.mark.parametrize("inst", INSTRUMENTS, ids=lambda i: i.name)
def test_every_panel_draws_a_real_run_and_odd_values(inst):
    check_instrument(
        inst, output={s: {"attention": v["attention"]} for s, v in _nanogpt_output().items()}
    )
    layers = [f"transformer.h.{i}.attn" for i in range(9)]
    odd = {
        step: {
            "attention": {
                "modules": layers[: 9 - step] if step < 3 else [],
                "heads": [2] * (9 - step) if step < 3 else [],
                "max_logit": [[1.0 + step, math.inf if step == 1 else 2.0]] * (9 - step)
                if step < 3
                else [],
                "entropy": [[0.5, math.nan if step == 2 else 1.0]] * (9 - step) if step < 3 else [],
                "max": 2.0,
                "min_entropy": 0.5,
                "sampled": None,
            }
        }
        for step in range(4)
    }
    check_instrument(inst, output=odd)
    check_instrument(inst, output={0: {"attention": odd[3]["attention"]}})  # no layer at all


def test_check_plugin():
    output = {s: {"attention": v["attention"]} for s, v in _nanogpt_output().items()}
    report = check_plugin("attention", arguments={i.name: {"output": output} for i in INSTRUMENTS})
    assert "quantity attention" in report.checked
    assert {f"instrument {i.name}" for i in INSTRUMENTS} <= set(report.checked)
