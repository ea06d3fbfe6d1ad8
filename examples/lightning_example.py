"""Track a PyTorch Lightning training with ``CockpitCallback`` (CPU, a few seconds).

A small MLP learns a synthetic 3-class problem. The LightningModule is written as for any
Lightning run: nothing in it is for cockpit. The callback builds the Cockpit from the
optimizer's parameters, attaches it to the module (module hooks compute the per-sample
statistics), takes the per-sample losses from the network's output and the batch's targets
(``cross_entropy``, checked against the loss ``training_step`` returns; ``alpha`` needs
them), computes the quantities inside Lightning's backward pass (so they describe the
unclipped gradients; Lightning clips the norm to 1 afterwards), logs every value to the
Trainer's logger (a CSV file here) and closes the Cockpit however training ends. Gradient
accumulation of 2 batches of 32 gives the statistics of the batch of 64. Needs
``pip install cockpit-lightning`` (here: ``pip install -e plugins/cockpit-lightning``)::

    python examples/lightning_example.py [LOG_PATH]

On a GPU, ``precision="16-mixed"`` needs no change here: the callback hands Lightning's
GradScaler to the Cockpit, so the values are of the unscaled gradients.
"""

from __future__ import annotations

import csv
import sys
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from cockpit_lightning import CockpitCallback

STEPS, BATCH, ACCUMULATE = 60, 32, 2


def make_data(n: int = 1024) -> torch.utils.data.TensorDataset:
    """Inputs in R^10; the label is which of three fixed directions has the largest score."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 10, generator=gen)
    y = (x @ torch.randn(10, 3, generator=gen)).argmax(1)
    return torch.utils.data.TensorDataset(x, y)


class Classifier(pl.LightningModule):
    """A plain MLP classifier."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)
        )

    def training_step(self, batch, batch_idx):
        """The mean cross-entropy loss of the batch."""
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        """SGD with momentum."""
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main() -> None:
    """Train 60 steps while tracking, then print a summary."""
    torch.manual_seed(0)
    callback = CockpitCallback(
        quantities=["economy", "mean_gsnr", {"name": "hess_max_ev", "every": 20}],
        log=sys.argv[1] if len(sys.argv) > 1 else None,
        per_param=False,  # only totals to the logger
    )
    loader = torch.utils.data.DataLoader(
        make_data(), batch_size=BATCH, shuffle=True, drop_last=True
    )
    with tempfile.TemporaryDirectory() as folder:
        logger = pl.loggers.CSVLogger(folder, name="cockpit")
        trainer = pl.Trainer(
            max_steps=STEPS,
            accelerator="cpu",
            accumulate_grad_batches=ACCUMULATE,
            gradient_clip_val=1.0,  # clipping runs after the Cockpit step
            callbacks=[callback],
            logger=logger,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(Classifier(), loader)
        with open(Path(logger.log_dir) / "metrics.csv", newline="") as f:
            keys = sorted(k for k in next(csv.reader(f)) if k.startswith("cockpit/"))
    print(f"logged to the CSV logger: {', '.join(keys)}")

    cp = callback.cockpit
    out = cp.get_output()
    for step in (0, 20, 40):
        v = out[step]
        print(
            f"step {step:2d}: loss {v['loss']:.3f}  |g| {v['grad_norm']['total']:.3f}  "
            f"alpha {v['alpha']['alpha']:.2f}  mean GSNR {v['mean_gsnr']['total']:.3f}  "
            f"max Hessian eigenvalue {v['hess_max_ev']['value']:.3f}"
        )
    print(f"errors: {cp.errors or 'none'}")


if __name__ == "__main__":
    main()
