"""The Lightning callback gives the values of a Cockpit in a hand-written loop, before clipping."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import (  # noqa: E402
    CLIP,
    LR,
    QUANTITIES,
    STEPS,
    assert_outputs_equal,
    assert_params_equal,
    data,
    import_framework,
    make_model,
    reference,
)

pl = import_framework("lightning.pytorch")

from cockpit_core import Cockpit, extend  # noqa: E402
from cockpit_core.integrations.lightning import CockpitCallback  # noqa: E402


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_model()
        self.loss_fn = extend(torch.nn.CrossEntropyLoss())

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.cockpit_info = {"batch_size": len(x)}
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def test_callback_matches_a_hand_written_loop_and_sees_unclipped_gradients(tmp_path):
    module = Module()
    cp = Cockpit(module.net.named_parameters(), QUANTITIES, on_error="raise")
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        gradient_clip_val=CLIP,
        gradient_clip_algorithm="norm",
        callbacks=[CockpitCallback(cp)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, loader)

    expected, params = reference(clip=CLIP)
    assert all(expected[s]["grad_norm"]["total"] > CLIP for s in expected)  # clipping acts
    assert_outputs_equal(cp.get_output(), expected)  # so the values are from before it
    assert_params_equal(module.net.parameters(), params)  # and the updates were clipped
