"""Module hooks on a transformer under torch.distributed (2 processes, gloo, CPU, float64).

The CNN of ``test_ddp.py`` exercises only the hooks' convolution and linear rules. Here
each process trains the transformer of ``_transformer_problem`` (token and position
``nn.Embedding``, ``nn.MultiheadAttention`` in a ``TransformerEncoderLayer``, LayerNorm,
linear layers) with ``Cockpit(model, ...)``, so module hooks serve every parameter, on
equal (12/12) and unequal (15/9) local batches. Every first-order quantity on every rank
must equal one process on the global batch of 24 whose statistics come from an
independent provider, ``torch.func`` (``backend="func"``); histogram counts are identical.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from _transformer_problem import CONFIGS, QUANTITIES, STEPS, batch, make_model  # noqa: E402
from test_ddp import ATOL_SCALE, RTOL, assert_same, launch  # noqa: E402

from cockpit_core import Cockpit  # noqa: E402

pytest.importorskip("cockpit_hooks")

IDS = [f"{a}/{b}" for a, b in CONFIGS]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> list[dict]:
    return launch("_transformer_worker.py", 2, tmp_path_factory.mktemp("ddp_transformer"))


@pytest.fixture(scope="module")
def reference() -> dict:
    """One process, the global batch, every statistic from ``torch.func``."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cp = Cockpit(
        model.named_parameters(), QUANTITIES, on_error="raise", backend="func", distributed="off"
    )
    cp.attach(model, torch.nn.CrossEntropyLoss(reduction="none"))
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        losses = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
        info = {
            "loss": loss,
            "individual_losses": losses,
            "batch_size": len(x),
            "optimizer": opt,
            "inputs": x,
            "targets": y,
        }
        with cp(step, info=info):
            loss.backward()
        opt.step()
    served = {p.served for p in cp.check(model).params}
    assert served == {"func"}, served
    return cp.get_output()


@pytest.mark.parametrize("sizes", CONFIGS, ids=IDS)
def test_every_quantity_equals_one_process_on_the_global_batch(outputs, reference, sizes):
    names = {q if isinstance(q, str) else q["name"] for q in QUANTITIES}
    assert {k for v in reference.values() for k in v} == names, "reference misses quantities"
    for rank, result in enumerate(outputs):
        assert_same(
            result[sizes]["output"],
            reference,
            RTOL["float64"],
            f"rank{rank}",
            ATOL_SCALE["float64"],
        )


@pytest.mark.parametrize("sizes", CONFIGS, ids=IDS)
def test_hooks_served_attention_embedding_and_layer_norm(outputs, sizes):
    for rank, result in enumerate(outputs):
        result = result[sizes]
        assert result["ok"], f"rank{rank}"
        assert set(result["served"]) == set(result["owners"]), f"rank{rank}: not every parameter"
        assert set(result["served"].values()) == {"hooks"}, f"rank{rank}: {result['served']}"
        covered = {result["owners"][name] for name in result["served"]}
        assert {"Embedding", "MultiheadAttention", "LayerNorm", "Linear"} <= covered, covered
        # the attention's own projections, both embeddings, both LayerNorms
        for name in (
            "embed.weight",
            "positions.weight",
            "encoder.self_attn.in_proj_weight",
            "encoder.self_attn.in_proj_bias",
            "encoder.norm1.weight",
            "encoder.norm2.bias",
        ):
            assert name in result["served"], name
