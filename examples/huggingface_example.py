"""Track a Hugging Face ``Trainer`` run with one ``CockpitCallback`` (CPU, a few seconds).

A small MLP in the Hugging Face model convention (named inputs, ``labels``, an output dict
with ``loss`` and ``logits``) learns a synthetic 3-class problem with a stock ``Trainer``.
The callback is all cockpit needs: it finds the Trainer, builds the Cockpit, attaches it to
the model, computes the per-sample losses from the logits and the labels (here
``cross_entropy``, checked against the model's loss), runs each backward pass inside the
Cockpit step (before the Trainer clips the gradient norm to 1), reports every value
through ``Trainer.log`` at the Trainer's own step numbers, prints one line per logging
step and closes the Cockpit when training ends. With gradient accumulation (2
micro-batches of 32) the values describe the batch of 64. Needs
``pip install cockpit-huggingface`` (here: ``pip install -e plugins/cockpit-huggingface``)::

    python examples/huggingface_example.py [LOG_PATH]

On a GPU, ``fp16=True`` needs no change here: the callback hands the Accelerator's
GradScaler to the Cockpit, so the values are of the unscaled gradients
(docs/mixed_precision.md).
"""

from __future__ import annotations

import sys
import tempfile

import torch
import torch.nn.functional as F
from cockpit_huggingface import CockpitCallback
from transformers import Trainer, TrainingArguments

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


def main() -> None:
    """Train 60 steps while tracking, then print a summary."""
    torch.manual_seed(0)
    callback = CockpitCallback(
        quantities=["economy", "mean_gsnr", "early_stopping"],
        log=sys.argv[1] if len(sys.argv) > 1 else None,
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
            report_to=[],  # e.g. ["tensorboard"]: cockpit's scalars go there too
            save_strategy="no",
            logging_steps=20,  # the Trainer's line and cockpit's line every 20 steps
            disable_tqdm=True,
        )
        trainer = Trainer(model=Classifier(), args=args, train_dataset=Data(), callbacks=[callback])
        trainer.train()  # the callback closes the Cockpit at the end

    out = callback.cockpit.get_output()
    print(f"{len(out)} tracked steps, numbered as the Trainer's global_step (1 to {STEPS})")
    for step in (1, 20, 40):
        v = out[step]
        print(
            f"step {step:2d}: loss {v['loss']:.3f}  |g| {v['grad_norm']['total']:.3f}  "
            f"alpha {v['alpha']['alpha']:.2f}  mean GSNR {v['mean_gsnr']['total']:.3f}  "
            f"early stopping {v['early_stopping']['total']:.2f}"
        )
    print(f"errors: {callback.cockpit.errors or 'none'}")


if __name__ == "__main__":
    main()
