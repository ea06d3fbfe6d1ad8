"""Track a Hugging Face ``Trainer`` run with ``CockpitMixin`` + ``CockpitCallback`` (CPU).

A small MLP in the Hugging Face model convention (named inputs, ``labels``, an output dict
with ``loss``) learns a synthetic 3-class problem. ``MyTrainer`` stands for your own
``Trainer`` subclass; cockpit composes with it by one more base class, ``CockpitMixin``,
and one callback, which builds the Cockpit, attaches it to the model, reports every value
through ``Trainer.log`` (to ``report_to``) and closes it when training ends. The quantities
are computed inside the training step, before the Trainer clips the gradient norm to 1;
with gradient accumulation (2 micro-batches of 32) they describe the batch of 64. Needs
``pip install -e ".[huggingface]"``::

    python examples/huggingface_example.py [LOG_PATH]

On a GPU, ``fp16=True`` needs no change here: the mixin hands the Accelerator's GradScaler
to the Cockpit, so the values are of the unscaled gradients (docs/mixed_precision.md).
"""

from __future__ import annotations

import sys
import tempfile

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

from cockpit_core.integrations.huggingface import CockpitCallback, CockpitMixin

STEPS, BATCH, ACCUMULATE = 60, 32, 2


class Data(torch.utils.data.Dataset):
    """Inputs in R^10; the label is which of three fixed directions has the largest score."""

    def __init__(self, n: int = 1024):
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 10, generator=gen)
        self.y = (self.x @ torch.randn(10, 3, generator=gen)).argmax(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"features": self.x[i], "labels": self.y[i]}


class Classifier(torch.nn.Module):
    """An MLP returning ``{"loss", "logits"}`` like HF models do."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)
        )

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """Logits and the mean cross-entropy loss of the batch."""
        logits = self.net(features)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class MyTrainer(Trainer):
    """Your own Trainer subclass (here it only counts its steps)."""

    steps = 0

    def training_step(self, *args, **kwargs):
        """The Trainer's step, counted."""
        self.steps += 1
        return super().training_step(*args, **kwargs)


class TrackedTrainer(CockpitMixin, MyTrainer):
    """Your Trainer with cockpit: the mixin goes first."""


def per_sample_losses(inputs: dict, outputs: dict) -> dict:
    """Extra ``info`` for the Cockpit step: the per-sample losses (for early stopping, alpha)."""
    losses = F.cross_entropy(outputs["logits"], inputs["labels"], reduction="none")
    return {"individual_losses": losses.detach()}


def main() -> None:
    """Train 60 steps while tracking, then print a summary."""
    torch.manual_seed(0)
    callback = CockpitCallback(
        quantities=["loss", "grad_norm", "norm_test", "inner_test", "mean_gsnr", "early_stopping"],
        cockpit_info=per_sample_losses,
        log=sys.argv[1] if len(sys.argv) > 1 else None,
        report=False,  # True (the default) sends every value through Trainer.log
    )
    with tempfile.TemporaryDirectory() as out_dir:
        args = TrainingArguments(
            output_dir=out_dir,
            max_steps=STEPS,
            per_device_train_batch_size=BATCH,
            gradient_accumulation_steps=ACCUMULATE,
            learning_rate=0.1,
            lr_scheduler_type="constant",
            optim="sgd",
            max_grad_norm=1.0,  # clipping runs after the Cockpit step
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_drop_last=True,  # equal micro-batches: exact accumulated statistics
        )
        trainer = TrackedTrainer(
            model=Classifier(), args=args, train_dataset=Data(), callbacks=[callback]
        )
        trainer.train()  # the callback closes the Cockpit at the end

    cp = trainer.cockpit
    out = cp.get_output()
    print(f"{trainer.steps} training steps (micro-batches), {len(out)} tracked steps")
    for step in (0, 20, 40):
        v = out[step]
        print(
            f"step {step:2d}: loss {v['loss']:.3f}  |g| {v['grad_norm']['total']:.3f}  "
            f"norm test {v['norm_test']['total']:.2f}  mean GSNR {v['mean_gsnr']['total']:.3f}  "
            f"early stopping {v['early_stopping']['total']:.2f}"
        )
    print(f"errors: {cp.errors or 'none'}")


if __name__ == "__main__":
    main()
