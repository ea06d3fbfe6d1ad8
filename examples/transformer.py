"""Track a tiny transformer encoder classifier: per-sample statistics and curvature, no BackPACK.

``cp.attach(model, loss_fn)`` tells cockpit the model: module hooks (``cockpit-hooks``)
then compute the per-sample statistics of the embedding, attention, LayerNorm and linear
parameters inside the training's own forward and backward pass, and ``torch.func``
those of the learned positional embedding (a parameter the model uses directly, which no
module hook sees); attention runs in the math kernel so that Hessian-vector products
work. The model is not extended for BackPACK at all. Runs on a CPU in a few seconds::

    python examples/transformer.py
"""

from __future__ import annotations

import torch

from cockpit_core import Cockpit
from cockpit_core.testing.transformer import TinyTransformer

STEPS, BATCH, SEQ, VOCAB = 30, 32, 8, 20


def make_data(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences; the class is whether token 0 occurs more often than token 1."""
    x = torch.randint(0, VOCAB, (n, SEQ), generator=gen)
    y = ((x == 0).sum(1) > (x == 1).sum(1)).long()
    return x, y


def main() -> None:
    """Train 30 steps while tracking, then print a summary."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = TinyTransformer(vocab=VOCAB, seq_len=SEQ, d_model=16, heads=2, ff=32, classes=2)
    per_sample_loss = torch.nn.CrossEntropyLoss(reduction="none")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    cp = Cockpit(
        model.named_parameters(),
        [
            "loss",
            "grad_norm",
            "norm_test",
            "inner_test",
            "mean_gsnr",
            "early_stopping",
            "grad_hist_1d",
            {"name": "hess_max_ev", "every": 10},
            {"name": "hess_trace", "method": "hutchinson", "every": 10},
        ],
        backend="auto",  # per parameter the cheapest provider: module hooks, else torch.func
        chunk_size=16,  # torch.func computes per-sample gradients of 16 samples at a time
    )
    cp.attach(model, per_sample_loss)
    print(cp.check(model), end="\n\n")

    for step in range(STEPS):
        x, y = make_data(BATCH, gen)
        opt.zero_grad()
        losses = per_sample_loss(model(x), y)
        loss = losses.mean()
        info = {
            "loss": loss,
            "individual_losses": losses.detach(),
            "batch_size": BATCH,
            "optimizer": opt,
            "inputs": x,  # torch.func recomputes the positional embedding's from these
            "targets": y,
        }
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()

    out = cp.get_output()
    for step in (0, 10, 20):
        v = out[step]
        print(
            f"step {step:2d}: loss {v['loss']:.3f}  norm test {v['norm_test']['total']:.3f}  "
            f"mean GSNR {v['mean_gsnr']['total']:.3f}  "
            f"max Hessian eigenvalue {v['hess_max_ev']['value']:.3f}  "
            f"Hessian trace ~ {v['hess_trace']['total']:.2f}"
        )
    print(f"errors: {cp.errors or 'none'}")


if __name__ == "__main__":
    main()
