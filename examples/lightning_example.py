"""Track a PyTorch Lightning training with ``CockpitCallback`` (CPU, a few seconds).

A small MLP learns a synthetic 3-class problem. Lightning clips the gradient norm to 1;
the callback computes the quantities inside Lightning's backward pass, so they describe
the unclipped gradients the loss produced. Needs ``pip install -e ".[lightning]"``::

    python examples/lightning_example.py [LOG_PATH]

On a GPU, ``precision="16-mixed"`` needs no change here: the callback hands Lightning's
GradScaler to the Cockpit, so the values are of the unscaled gradients. With several
optimizers (manual optimization), pass one Cockpit per optimizer,
``CockpitCallback({0: cp_a, 1: cp_b})`` (docs/integrations.md).
"""

from __future__ import annotations

import sys
import warnings

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from cockpit_core import Cockpit, extend
from cockpit_core.integrations.lightning import CockpitCallback

STEPS, BATCH = 60, 64
# BackPACK's module hooks fire on the first layer, whose input needs no gradient: harmless
warnings.filterwarnings("ignore", message="Full backward hook is firing")


def make_data(n: int = 1024) -> torch.utils.data.TensorDataset:
    """Inputs in R^10; the label is which of three fixed directions has the largest score."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 10, generator=gen)
    y = (x @ torch.randn(10, 3, generator=gen)).argmax(1)
    return torch.utils.data.TensorDataset(x, y)


class Classifier(pl.LightningModule):
    """An MLP whose modules are extended for BackPACK (per-sample statistics)."""

    def __init__(self):
        super().__init__()
        self.net = extend(
            torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
        )
        self.loss_fn = extend(torch.nn.CrossEntropyLoss())

    def training_step(self, batch, batch_idx):
        """Return the mean loss; hand per-sample losses to the Cockpit via ``cockpit_info``."""
        x, y = batch
        logits = self.net(x)
        losses = F.cross_entropy(logits, y, reduction="none")
        self.cockpit_info = {"individual_losses": losses.detach(), "batch_size": len(x)}
        return self.loss_fn(logits, y)

    def backward(self, loss, *args, **kwargs):
        """Keep the graph on steps whose quantities need Hessian-vector products."""
        loss.backward(retain_graph=self.cockpit.retain_graph(self.global_step))

    def configure_optimizers(self):
        """SGD with momentum."""
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main() -> None:
    """Train 60 steps while tracking, then print a summary."""
    torch.manual_seed(0)
    module = Classifier()
    cp = Cockpit(
        module.net.named_parameters(),
        [
            "loss",
            "grad_norm",
            "norm_test",
            "inner_test",
            "mean_gsnr",
            "early_stopping",
            "alpha",
            {"name": "hess_max_ev", "every": 20},
        ],
        log=sys.argv[1] if len(sys.argv) > 1 else None,
    )
    loader = torch.utils.data.DataLoader(make_data(), batch_size=BATCH, shuffle=True)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        gradient_clip_val=1.0,  # clipping runs after the Cockpit step
        callbacks=[CockpitCallback(cp)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)

    out = cp.get_output()
    for step in (0, 20, 40):
        v = out[step]
        print(
            f"step {step:2d}: loss {v['loss']:.3f}  |g| {v['grad_norm']['total']:.3f}  "
            f"norm test {v['norm_test']['total']:.2f}  mean GSNR {v['mean_gsnr']['total']:.3f}  "
            f"alpha {v['alpha']['alpha']:.2f}  "
            f"max Hessian eigenvalue {v['hess_max_ev']['value']:.3f}"
        )
    print(f"errors: {cp.errors or 'none'}")


if __name__ == "__main__":
    main()
