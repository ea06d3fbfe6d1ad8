"""CockpitTrainer gives the values of a Cockpit in a hand-written loop, before clipping."""

from __future__ import annotations

import sys
import warnings
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

from cockpit_core import Cockpit, CockpitWarning, extend  # noqa: E402
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


def test_trainer_passes_the_accelerators_grad_scaler(tmp_path):
    """``fp16`` needs a GPU, so the Accelerator gets a GradScaler by hand (as fp16 would).

    Without clipping (the Accelerator unscales before clipping only in real fp16), the
    run must give the statistics and parameters of the unscaled reference.
    """
    model = Wrapped()
    cp = Cockpit(model.net.named_parameters(), QUANTITIES, on_error="raise")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=16,
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="sgd",
        weight_decay=0.0,
        max_grad_norm=0.0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
    )
    trainer = CockpitTrainer(model=model, args=args, train_dataset=Data(), cockpit=cp)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    trainer.accelerator.scaler = scaler  # prepare() hands it to the optimizer wrapper
    scaled = []
    scale = scaler.scale
    scaler.scale = lambda loss: scaled.append(1) or scale(loss)  # count the scaled losses
    with warnings.catch_warnings():  # unannounced scaling would warn
        warnings.simplefilter("error", CockpitWarning)
        trainer.train()

    assert len(scaled) == STEPS  # the loss was scaled by 1024 at every step

    expected, params = reference()
    assert_outputs_equal(cp.get_output(), expected)
    assert_params_equal(model.net.parameters(), params)
