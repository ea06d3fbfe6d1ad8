"""``Trainer.fit(ckpt_path=...)`` continues the callback's Cockpit from Lightning's checkpoint.

The callback's ``state_dict`` (``cp.state_dict()`` of each Cockpit) goes into the
checkpoint; when Lightning restores the callback, ``on_train_start`` loads it into the new
Cockpit, so ``distance`` keeps its origin (no reset to 0) and the two-step
``update_size`` of the checkpoint's last step ends after the restart.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# the helpers shared with the core's tests (tests/integrations/_common.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "integrations"))
from _common import data, import_framework, plain_model  # noqa: E402

pl = import_framework("lightning.pytorch")

from cockpit_lightning import CockpitCallback  # noqa: E402

from cockpit_core.log import read_run  # noqa: E402

QUANTITIES = ["loss", "grad_norm", "distance", "update_size"]


class Stock(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = plain_model()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)


def _fit(root, log, max_steps, ckpt_path=None):
    loader = torch.utils.data.DataLoader(  # the whole data set: the same batch every step
        torch.utils.data.TensorDataset(*data()), batch_size=16
    )
    callback = CockpitCallback(quantities=QUANTITIES, on_error="raise", dashboard=False, log=log)
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=root, filename="{step}", every_n_train_steps=3, save_top_k=-1
    )
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        callbacks=[callback, checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(Stock(), loader, ckpt_path=ckpt_path)
    return callback.cockpit.get_output()


def test_distance_and_update_size_continue_after_fit_with_ckpt_path(tmp_path):
    reference = _fit(tmp_path / "reference", None, 6)
    log = tmp_path / "log.jsonl"
    first = _fit(tmp_path / "run", log, 3)
    checkpoint = tmp_path / "run" / "step=3.ckpt"
    saved = torch.load(checkpoint, weights_only=False)
    (state,) = [s for k, s in saved["callbacks"].items() if "CockpitCallback" in str(k)]
    assert state["cockpits"]["0"]["step"] == 2
    resumed = _fit(tmp_path / "run", log, 6, checkpoint)
    assert sorted(first) == [0, 1, 2] and sorted(resumed) == [2, 3, 4, 5]
    assert set(resumed[2]) == {"update_size"}  # started before the checkpoint
    for step in range(6):
        values = {**first.get(step, {}), **resumed.get(step, {})}
        for key in ("loss", "distance", "update_size"):
            if key not in reference[step]:  # update_size of the last step: no next step
                continue
            got, want = values[key], reference[step][key]
            got = got["total"] if isinstance(got, dict) else got
            want = want["total"] if isinstance(want, dict) else want
            assert got == pytest.approx(want, rel=1e-5), (step, key)
    assert resumed[3]["distance"]["total"] > resumed[2]["update_size"]["total"] > 0
    data_ = read_run(log)
    assert sorted(data_.output) == list(range(6)) and data_.resumed[0]["step"] == 2
