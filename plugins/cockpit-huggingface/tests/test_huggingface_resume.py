"""A Trainer resumed from a checkpoint continues its Cockpit (``cockpit_state.pt``).

``CockpitCallback.on_save`` writes ``cp.state_dict()`` into each checkpoint folder;
``trainer.train(resume_from_checkpoint=...)`` (a folder, or ``True`` for the last one)
loads it into the new Cockpit, so ``distance`` keeps its origin (no reset to 0) and the
two-step ``update_size`` of the checkpoint's last step ends after the restart.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# the helpers shared with the core's tests (tests/integrations/_common.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "integrations"))
from _common import data, import_framework, plain_model  # noqa: E402

transformers = import_framework("transformers")

from cockpit_huggingface import STATE_FILE, CockpitCallback  # noqa: E402

from cockpit_core.log import read_run  # noqa: E402

QUANTITIES = ["loss", "grad_norm", "distance", "update_size"]


class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = data()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Model(torch.nn.Module):
    """An HF-style model: named inputs, a dict with the mean loss."""

    def __init__(self):
        super().__init__()
        self.net = plain_model()

    def forward(self, x, labels):
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def _train(out, log, max_steps, resume=None):
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=16,  # the whole data set: the same batch every step
        learning_rate=0.5,
        lr_scheduler_type="constant",
        optim="sgd",
        weight_decay=0.0,
        max_grad_norm=0.0,
        report_to=[],
        use_cpu=True,
        save_strategy="steps",
        save_steps=3,
        logging_strategy="no",
        disable_tqdm=True,
    )
    callback = CockpitCallback(quantities=QUANTITIES, on_error="raise", console=False, log=log)
    trainer = transformers.Trainer(
        model=Model(), args=args, train_dataset=Data(), callbacks=[callback]
    )
    trainer.train(resume_from_checkpoint=resume)
    return callback.cockpit.get_output()


@pytest.mark.parametrize("resume", ["folder", True])
def test_distance_and_update_size_continue_after_resuming(tmp_path, resume):
    reference = _train(tmp_path / "reference", None, 6)
    log = tmp_path / "log.jsonl"
    first = _train(tmp_path / "run", log, 3)
    checkpoint = tmp_path / "run" / "checkpoint-3"
    assert (checkpoint / STATE_FILE).is_file()
    assert torch.load(checkpoint / STATE_FILE, weights_only=True)["step"] == 3
    resumed = _train(tmp_path / "run", log, 6, str(checkpoint) if resume == "folder" else True)
    assert sorted(first) == [1, 2, 3] and sorted(resumed) == [3, 4, 5, 6]
    assert set(resumed[3]) == {"update_size"}  # started before the checkpoint
    for step in range(1, 7):
        values = {**first.get(step, {}), **resumed.get(step, {})}
        for key in ("distance", "update_size", "loss"):
            if key in reference[step]:
                got, want = values[key], reference[step][key]
                got = got["total"] if isinstance(got, dict) else got
                want = want["total"] if isinstance(want, dict) else want
                assert got == pytest.approx(want, rel=1e-5), (step, key)
    assert resumed[4]["distance"]["total"] > resumed[3]["update_size"]["total"] > 0
    data = read_run(log)
    assert sorted(data.output) == [1, 2, 3, 4, 5, 6] and data.resumed[0]["step"] == 3
    assert set(data.output[3]) == set(reference[3])
