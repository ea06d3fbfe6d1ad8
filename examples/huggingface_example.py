"""Track a Hugging Face ``Trainer`` run with ``CockpitTrainer`` (CPU, a few seconds).

A small MLP in the Hugging Face model convention (named inputs, ``labels``, an output dict
with ``loss``) learns a synthetic 3-class problem. The Trainer clips the gradient norm to
1; ``CockpitTrainer`` computes the quantities inside its ``training_step``, before the
clipping, so they describe the gradients the loss produced. Needs
``pip install -e ".[huggingface]"``::

    python examples/huggingface_example.py [LOG_PATH]

On a GPU, ``fp16=True`` needs no change here: ``CockpitTrainer`` hands the Accelerator's
GradScaler to the Cockpit, so the values are of the unscaled gradients
(docs/mixed_precision.md).
"""

from __future__ import annotations

import sys
import tempfile
import warnings

import torch
import torch.nn.functional as F
from transformers import TrainingArguments

from cockpit_core import Cockpit, extend
from cockpit_core.integrations.huggingface import CockpitTrainer

STEPS, BATCH = 60, 64
# BackPACK's module hooks fire on the first layer, whose input needs no gradient: harmless
warnings.filterwarnings("ignore", message="Full backward hook is firing")


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
    """An MLP extended for BackPACK, returning ``{"loss", "logits"}`` like HF models do."""

    def __init__(self):
        super().__init__()
        self.net = extend(
            torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
        )
        self.loss_fn = extend(torch.nn.CrossEntropyLoss())

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """Logits and the mean cross-entropy loss of the batch."""
        logits = self.net(features)
        return {"loss": self.loss_fn(logits, labels), "logits": logits}


def per_sample_losses(inputs: dict, outputs: dict) -> dict:
    """Extra ``info`` for the Cockpit step: the per-sample losses (for early stopping, alpha)."""
    losses = F.cross_entropy(outputs["logits"], inputs["labels"], reduction="none")
    return {"individual_losses": losses.detach()}


def main() -> None:
    """Train 60 steps while tracking, then print a summary."""
    torch.manual_seed(0)
    model = Classifier()
    cp = Cockpit(
        model.net.named_parameters(),
        ["loss", "grad_norm", "norm_test", "inner_test", "mean_gsnr", "early_stopping", "alpha"],
        log=sys.argv[1] if len(sys.argv) > 1 else None,
    )
    with tempfile.TemporaryDirectory() as out_dir:
        args = TrainingArguments(
            output_dir=out_dir,
            max_steps=STEPS,
            per_device_train_batch_size=BATCH,
            learning_rate=0.1,
            lr_scheduler_type="constant",
            optim="sgd",
            max_grad_norm=1.0,  # clipping runs after the Cockpit step
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
        )
        trainer = CockpitTrainer(
            model=model,
            args=args,
            train_dataset=Data(),
            cockpit=cp,
            cockpit_info=per_sample_losses,
        )
        trainer.train()
    cp.close()  # flush and close the log (the Trainer does not own the Cockpit)

    out = cp.get_output()
    for step in (0, 20, 40):
        v = out[step]
        print(
            f"step {step:2d}: loss {v['loss']:.3f}  |g| {v['grad_norm']['total']:.3f}  "
            f"norm test {v['norm_test']['total']:.2f}  mean GSNR {v['mean_gsnr']['total']:.3f}  "
            f"early stopping {v['early_stopping']['total']:.2f}  alpha {v['alpha']['alpha']:.2f}"
        )
    print(f"errors: {cp.errors or 'none'}")


if __name__ == "__main__":
    main()
