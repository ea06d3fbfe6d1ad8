"""Gradient checkpointing (``torch.utils.checkpoint``) around the blocks of a transformer LM.

A pre-norm GPT-style language model as people write it: token embedding, learned positions
looked up with ``pos.expand(B, -1)``, causal self-attention through
``F.scaled_dot_product_attention(..., is_causal=True)`` with ``nn.Linear`` projections,
LayerNorm, a GELU MLP, each block called through ``checkpoint(block, x, use_reentrant=...)``.

Tracking a Hessian quantity switches attention to the math kernel (the fused kernel has no
double backward). Checkpointing recomputes the blocks during ``backward``, outside the
model's forward hooks; the recomputation must use the same kernel, or the non-reentrant
variant raises ``CheckpointError`` out of the user's ``backward``. Checked here:

- the user's ``backward`` and training go on in every mode, with the gradients of an
  untracked copy;
- in float64 the first-order statistics equal a per-sample autograd loop on a copy without
  checkpointing, and ``hess_max_ev`` the top eigenvalue of the explicit Hessian
  (non-reentrant); with ``use_reentrant=True`` (no ``torch.autograd.grad`` through it)
  Hessian quantities are refused with a recorded reason and the rest is exact;
- under bf16 autocast: no exception, finite values.
"""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from cockpit_core import Cockpit, CockpitWarning
from cockpit_core.engine.attention import math_attention
from cockpit_core.testing.reference import flat, per_sample_gradients_from_losses

VOCAB, SEQ, WIDTH, HEADS, LAYERS, BATCH = 7, 6, 8, 2, 2, 4
QUANTITIES = ["norm_test", "inner_test", "mean_gsnr", "hess_max_ev"]
MODES = {"non-reentrant": False, "reentrant": True}


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused ``qkv`` projection."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Token and position embeddings, blocks (checkpointed unless ``reentrant`` is None), head."""

    def __init__(self, reentrant: bool | None):
        super().__init__()
        self.reentrant = reentrant
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device).unsqueeze(0)
        x = self.tok(idx) + self.pos(pos.expand(B, -1))
        for block in self.blocks:
            if self.reentrant is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(self.ln_f(x))


def make_model(reentrant: bool | None, dtype: torch.dtype) -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(reentrant).to(dtype)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    idx = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return idx, torch.roll(idx, -1, dims=1)


def sequence_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sequence loss: the mean token cross-entropy of each sequence (``[B]``)."""
    tokens = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    return tokens.view(targets.shape).mean(1)


def train(reentrant: bool, dtype: torch.dtype, autocast: bool, quantities=QUANTITIES, steps=3):
    """Train a tracked model and an untracked copy side by side.

    The copy runs without checkpointing, its forward and backward in the math kernel the
    tracked model uses (a Hessian quantity is tracked), so its gradients must be equal.

    Returns:
        The Cockpit, the snapshots ``(params before the step, batch)`` of each step, and
        the largest relative difference of the gradients from the copy's.

    """
    model = make_model(reentrant, dtype)
    plain = copy.deepcopy(model)
    plain.reentrant = None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    cp = Cockpit(model, quantities)
    snapshots, worst = [], 0.0
    for step in range(steps):
        idx, targets = batch(step)
        snapshots.append(([p.detach().clone() for p in model.parameters()], idx, targets))
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(idx)
        losses = sequence_losses(logits, targets)
        loss = losses.mean()
        info = {"loss": loss, "individual_losses": losses, "batch_size": BATCH, "optimizer": opt}
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()

        plain_opt.zero_grad()
        with math_attention():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                plain_logits = plain(idx)
            sequence_losses(plain_logits, targets).mean().backward()
        for p, q in zip(model.parameters(), plain.parameters()):
            assert p.grad is not None and torch.isfinite(p.grad).all()
            worst = max(worst, float((p.grad - q.grad).norm() / q.grad.norm()))
        plain_opt.step()
    return cp, snapshots, worst


# -- references (float64, no checkpointing) ------------------------------------------------


def reference_statistics(params: list[torch.Tensor], idx, targets) -> dict[str, dict]:
    """norm_test, inner_test, mean_gsnr from per-sample gradients (one autograd call each)."""
    model = make_model(None, torch.float64)
    with torch.no_grad():
        for p, value in zip(model.parameters(), params):
            p.copy_(value)
    losses = sequence_losses(model(idx), targets)
    per_sample = per_sample_gradients_from_losses(losses, list(model.parameters()))
    grads = [g.mean(0) for g in per_sample]
    B = BATCH

    def norm_test(gs, g):
        sum_sq = (flat(gs, 1) ** 2).sum()
        grad_sq = (flat([g]) ** 2).sum()
        return math.sqrt(max(0.0, float(sum_sq - B * grad_sq)) / (B - 1) / (B * float(grad_sq)))

    def inner_test(gs, g):
        g_flat = flat([g])
        grad_sq = (g_flat**2).sum()
        proj = flat(gs, 1) @ g_flat
        return math.sqrt(float(((proj - grad_sq) ** 2).sum() / (B - 1) / (B * grad_sq**2)))

    def gsnr_sums(gs, g):
        var = (gs**2).mean(0) - g**2
        return float((g**2 / (var + 1e-5)).sum()), g.numel()

    sums = [gsnr_sums(gs, g) for gs, g in zip(per_sample, grads)]
    return {
        "norm_test": {
            "total": norm_test(per_sample, torch.cat([g.flatten() for g in grads])),
            "per_param": [norm_test([gs], g) for gs, g in zip(per_sample, grads)],
        },
        "inner_test": {
            "total": inner_test(per_sample, torch.cat([g.flatten() for g in grads])),
            "per_param": [inner_test([gs], g) for gs, g in zip(per_sample, grads)],
        },
        "mean_gsnr": {
            "total": sum(s for s, _ in sums) / sum(n for _, n in sums),
            "per_param": [s / n for s, n in sums],
        },
    }


def reference_hessian(params: list[torch.Tensor], idx, targets) -> torch.Tensor:
    """The explicit Hessian of the mean loss w.r.t. all parameters (flattened, in order)."""
    model = make_model(None, torch.float64)
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in params]
    theta = flat([p.detach() for p in params])

    def loss_of(vector: torch.Tensor) -> torch.Tensor:
        parts = torch.split(vector, [math.prod(s) for s in shapes])
        values = {n: t.view(s) for n, t, s in zip(names, parts, shapes)}
        return sequence_losses(functional_call(model, values, (idx,)), targets).mean()

    with math_attention():  # the fused kernel has no double backward
        return torch.autograd.functional.hessian(loss_of, theta, vectorize=True)


# -- tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("mode", list(MODES))
def test_training_goes_on_with_the_gradients_of_an_untracked_copy(mode, autocast):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cp, _, worst = train(MODES[mode], torch.float32, autocast)
    assert worst == 0.0, worst  # the same operations in the same order: bitwise equal
    said = [str(w.message) for w in caught if issubclass(w.category, CockpitWarning)]
    assert len(said) == (1 if MODES[mode] else 0), said  # only the reentrant refusal
    assert all("use_reentrant=True" in text for text in said)
    output = cp.get_output()
    assert sorted(output) == [0, 1, 2]
    for step in range(3):
        for key in ("norm_test", "inner_test", "mean_gsnr"):
            assert np.isfinite(output[step][key]["total"]), (step, key)
            assert np.isfinite(output[step][key]["per_param"]).all(), (step, key)
        if MODES[mode]:  # reentrant: refused, with the reason
            assert "hess_max_ev" not in output[step]
        else:
            assert np.isfinite(output[step]["hess_max_ev"]["value"])
    errors = [e for e in cp.errors if e["quantity"] != "hess_max_ev" or not MODES[mode]]
    assert not errors, errors
    # the math kernel is left after every backward pass
    assert torch._C._get_flash_sdp_enabled()
    # closed: under reentrant checkpointing an unclosed Cockpit is not garbage-collected
    # (found, not fixed: see the session note), and its wishes (eager compiled code,
    # BackPACK hooks) would outlive the test
    cp.close()


@pytest.mark.parametrize("mode", list(MODES))
def test_statistics_are_exact_in_float64(mode):
    reentrant = MODES[mode]
    probes = 100
    hessian_quantities = [
        {"name": "hess_max_ev", "tol": 1e-8},
        {"name": "hess_trace", "method": "hutchinson", "probes": probes},
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cp, snapshots, worst = train(
            reentrant, torch.float64, False, [*QUANTITIES[:3], *hessian_quantities]
        )
    assert worst == 0.0, worst
    output = cp.get_output()
    for step, (params, idx, targets) in enumerate(snapshots):
        expected = reference_statistics(params, idx, targets)
        for key, value in expected.items():
            got = output[step][key]
            np.testing.assert_allclose(got["total"], value["total"], rtol=1e-6, err_msg=key)
            np.testing.assert_allclose(got["per_param"], value["per_param"], rtol=1e-6)
        if reentrant:
            continue
        hessian = reference_hessian(params, idx, targets)
        top = torch.linalg.eigvalsh(hessian)[-1].item()
        np.testing.assert_allclose(output[step]["hess_max_ev"]["value"], top, rtol=1e-4)
        # Rademacher probes: Var[v^T H v] = 2 (||H||_F^2 - sum_i H_ii^2)
        variance = 2 * ((hessian**2).sum() - (torch.diagonal(hessian) ** 2).sum()).item()
        error = output[step]["hess_trace"]["total"] - torch.trace(hessian).item()
        assert abs(error) <= 4 * math.sqrt(variance / probes)
    if not reentrant:
        assert not cp.errors
        return
    # both refused at every step with the reason and what to do; training went on
    refused = sorted((e["quantity"], e["step"]) for e in cp.errors)
    assert refused == [(q, s) for q in ("hess_max_ev", "hess_trace") for s in range(3)]
    for error in cp.errors:
        assert error["error"].startswith("UnsupportedModelError")
        assert "torch.utils.checkpoint.checkpoint(..., use_reentrant=True)" in error["error"]
        assert "Pass use_reentrant=False" in error["error"]
    refusals = [w for w in caught if "use_reentrant=True" in str(w.message)]
    assert len(refusals) == 2  # once per quantity, not at every step


def test_backward_outside_a_tracked_block_recomputes_in_the_math_kernel():
    """The kernel belongs to the forward pass's graph, not to the ``with cp(...)`` block."""
    model = make_model(False, torch.float32)
    cp = Cockpit(model, ["hess_max_ev"])
    idx, targets = batch(0)
    for _ in range(2):  # e.g. a loop that enters cp(step) only at some steps
        model.zero_grad()
        sequence_losses(model(idx), targets).mean().backward()
        assert torch._C._get_flash_sdp_enabled()  # left after the pass
    assert all(p.grad is not None for p in model.parameters())
    cp.close()


def test_a_failed_backward_does_not_leave_the_math_kernel_on():
    model = make_model(False, torch.float32)
    cp = Cockpit(model, ["hess_max_ev"])
    idx, targets = batch(0)
    handle = model.blocks[0].mlp[0].weight.register_hook(_raise)
    with pytest.raises(ValueError, match="boom"):
        sequence_losses(model(idx), targets).mean().backward()
    handle.remove()
    cp.close()  # a kernel the failed pass still held is left
    assert torch._C._get_flash_sdp_enabled()


def _raise(grad: torch.Tensor) -> None:
    raise ValueError("boom")


def test_a_reentrant_checkpoint_is_recognized_in_the_graph_whatever_the_message():
    from cockpit_core.engine.hvp import _through_reentrant_checkpoint

    x = torch.ones(3, requires_grad=True)
    through = checkpoint(torch.sin, x, use_reentrant=True).sum()
    assert _through_reentrant_checkpoint(RuntimeError("another wording"), through)
    around = checkpoint(torch.sin, x, use_reentrant=False).sum()
    assert not _through_reentrant_checkpoint(RuntimeError("another wording"), around)
