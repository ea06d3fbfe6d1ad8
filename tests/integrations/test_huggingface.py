"""CockpitTrainer gives the values of a Cockpit in a hand-written loop, before clipping."""

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

transformers = import_framework("transformers")

from cockpit_core import Cockpit, extend  # noqa: E402
from cockpit_core.integrations.huggingface import CockpitTrainer  # noqa: E402


class Wrapped(torch.nn.Module):
    """An HF-style model: takes named inputs, returns a dict with the mean loss."""

    def __init__(self):
        super().__init__()
        self.net = make_model()
        self.loss_fn = extend(torch.nn.CrossEntropyLoss())

    def forward(self, x, labels):
        logits = self.net(x)
        return {"loss": self.loss_fn(logits, labels), "logits": logits}


class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = data()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def test_trainer_matches_a_hand_written_loop_and_sees_unclipped_gradients(tmp_path):
    model = Wrapped()
    cp = Cockpit(model.net.named_parameters(), QUANTITIES, on_error="raise")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=16,  # the whole data set: one batch per step
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="sgd",
        weight_decay=0.0,
        max_grad_norm=CLIP,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
    )
    CockpitTrainer(model=model, args=args, train_dataset=Data(), cockpit=cp).train()

    expected, params = reference(clip=CLIP)
    assert all(expected[s]["grad_norm"]["total"] > CLIP for s in expected)  # clipping acts
    assert_outputs_equal(cp.get_output(), expected)  # so the values are from before it
    assert_params_equal(model.net.parameters(), params)  # and the updates were clipped
