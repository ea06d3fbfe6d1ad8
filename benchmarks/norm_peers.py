"""Per-sample gradient norms as other tools compute them: the peers of issue 16.

Each peer trains like plain training and also computes every sample's gradient norm
(over all parameters) at every step:

- ``opacus``: Opacus ``GradSampleModule`` (its default hooks mode) on the model after
  ``opacus.validators.ModuleValidator.fix``, which swaps each ``nn.MultiheadAttention`` for
  Opacus' ``DPMultiheadAttention`` (built from ``nn.Linear``s; Opacus' validator rejects
  ``nn.MultiheadAttention``, and its ``torch.func`` fallback fails on it); forward,
  backward, then the norms from ``p.grad_sample``;
- ``opacus_plain``: the same fixed model without ``GradSampleModule``: what the module swap
  alone costs (no norms);
- ``vmap``: a plain forward and backward (``p.grad`` for the optimizer), then
  ``torch.func.vmap(torch.func.grad(...))`` over the batch with ``functional_call``, as the
  ``torch.func`` tutorial writes per-sample gradients, and the norms from those.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

PEERS = ("opacus", "opacus_plain", "vmap")
Batch = tuple[torch.Tensor, torch.Tensor]
PeerStep = Callable[[Batch, torch.optim.Optimizer], "torch.Tensor | None"]


def import_peer(name: str) -> None:
    """Import what ``name`` needs (so the caller can measure the memory that costs)."""
    if name in ("opacus", "opacus_plain"):
        import opacus.validators  # noqa: F401


def _sum_of_squares(grads: list[torch.Tensor]) -> torch.Tensor:
    """Per-sample squared norms ``[B]`` summed over per-sample gradients ``[B, ...]``."""
    return torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0)


def build_peer(
    name: str, model: nn.Module, loss_fn: nn.Module, info: dict
) -> tuple[nn.Module, PeerStep]:
    """``(module to optimize, step(batch, opt) -> per-sample norms or None)`` of a peer."""
    if name in ("opacus", "opacus_plain"):
        import opacus
        from opacus.validators import ModuleValidator

        info["opacus"] = opacus.__version__
        problems = ModuleValidator.validate(model, strict=False)
        info["opacus_validator_errors"] = sorted({type(e).__name__ for e in problems})
        fixed = ModuleValidator.fix(model) if problems else model
        info["opacus_fixed_modules"] = sorted(
            {type(m).__name__ for m in fixed.modules()}
            - {type(m).__name__ for m in model.modules()}
        )
        if name == "opacus_plain":

            def plain(batch: Batch, opt: torch.optim.Optimizer) -> None:
                x, y = batch
                opt.zero_grad()
                loss_fn(fixed(x), y).backward()
                opt.step()

            return fixed, plain
        from opacus import GradSampleModule

        gsm = GradSampleModule(fixed, batch_first=True, loss_reduction="mean")
        params = [p for p in gsm.parameters() if p.requires_grad]

        def opacus_step(batch: Batch, opt: torch.optim.Optimizer) -> torch.Tensor:
            x, y = batch
            opt.zero_grad()
            gsm.zero_grad(set_to_none=True)  # p.grad_sample too (Opacus accumulates it)
            loss_fn(gsm(x), y).backward()
            norms = _sum_of_squares([p.grad_sample for p in params]).sqrt()
            opt.step()
            return norms

        return gsm, opacus_step
    if name == "vmap":
        from torch.func import functional_call, grad, vmap

        buffers = dict(model.named_buffers())

        def sample_loss(params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = functional_call(model, (params, buffers), (x.unsqueeze(0),))
            return loss_fn(out, y.unsqueeze(0))

        per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))

        def vmap_step(batch: Batch, opt: torch.optim.Optimizer) -> torch.Tensor:
            x, y = batch
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
            norms = _sum_of_squares(list(per_sample(params, x, y).values())).sqrt()
            opt.step()
            return norms

        return model, vmap_step
    raise ValueError(f"unknown peer {name!r}: use {', '.join(PEERS)}")
