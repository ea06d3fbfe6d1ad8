"""The Lightning and Hugging Face examples of docs/integrations.md, run as written.

Each example is the ``python`` block after its marker comment in the doc, executed with
``exec`` in a fresh namespace that holds only what the text says is yours: ``module`` and
``loader`` (Lightning: a stock LightningModule, ``Linear-Tanh-Linear`` with
``cross_entropy``, float64), ``model`` and ``dataset`` (Hugging Face: a stock tiny GPT-2,
``GPT2LMHeadModel`` in float64, and eight rows of token ids whose labels end in a different
number of ``-100`` each, so that the micro-batches of a step hold different numbers of label
tokens). The examples run in a temporary folder (their relative paths land there).

The reference is a hand-written loop over the same micro-batches from the same initial
weights (the examples' runs and the loops agree to float64 rounding), with the same
optimizer (its state read by ``alpha``), learning rates and clipping, and cockpit's
``economy`` from the test provider ``autograd_loop``: one ``torch.autograd.grad`` per
sequence of the step's own forward pass, of the per-sample losses written out from their
definition (Lightning: the per-sample cross-entropy; Hugging Face: ``(B / N) sum_t
ce_nt`` with ``B`` the step's sequences and ``N`` the Trainer's ``num_items_in_batch``,
which the model divides its summed token losses by: for this model transformers 5.25
counts the labels before the shift, one more per sequence than it predicts). Every value
equals the reference to ``rtol`` 1e-6 (histogram counts within 4), at every step.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from _common import (  # noqa: E402
    STOCK_LR,
    compare,
    data,
    import_framework,
    loop_registry,
    plain_model,
)

from cockpit_core import Cockpit  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"
MARKER = "<!-- tests/integrations/test_docs_examples.py runs the next block ({}) -->"
ECONOMY = {
    "alpha",
    "distance",
    "grad_hist_1d",
    "grad_norm",
    "inner_test",
    "loss",
    "norm_test",
    "optimizer_hparams",
    "ortho_test",
    "update_size",
}
TWO_STEP = {"alpha", "update_size"}  # known only after the next step


def doc_block(framework: str) -> str:
    """The ``python`` block after the marker for ``framework`` in docs/integrations.md."""
    text = DOC.read_text(encoding="utf-8")
    marker = MARKER.format(framework)
    assert marker in text, f"{DOC.name} lost the marker of the {framework} example"
    block = re.search(r"```python\n(.*?)```", text.split(marker, 1)[1], re.S)
    assert block is not None, f"no python block after the {framework} marker"
    return block.group(1)


def run_example(framework: str, **yours: Any) -> dict[str, Any]:
    """Execute the example; returns its namespace."""
    namespace = dict(yours)
    exec(compile(doc_block(framework), f"{DOC.name} ({framework})", "exec"), namespace)
    return namespace


def assert_economy(output: dict, expected: dict, steps: list[int]) -> None:
    """Every economy quantity at every step (the two-step ones but at the last), as expected."""
    assert sorted(output) == sorted(expected) == steps
    for step in steps:
        want = ECONOMY - TWO_STEP if step == steps[-1] else ECONOMY
        assert set(output[step]) == want, step
    compare(output, expected)


# -- Lightning ------------------------------------------------------------------------------


def _lightning_module():
    pl = import_framework("lightning.pytorch")

    class Classifier(pl.LightningModule):
        """A LightningModule as users write it: nothing in it is for cockpit."""

        def __init__(self):
            super().__init__()
            self.net = plain_model()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=STOCK_LR)

    return Classifier().double()


def lightning_reference(batches: list, accumulate: int) -> dict:
    """The loop: SGD, ``accumulate`` micro-batches per step, per-sample cross-entropy."""
    model = plain_model().double()
    opt = torch.optim.SGD(model.parameters(), lr=STOCK_LR)
    cp = Cockpit(model, "economy", backend="autograd_loop", registry=loop_registry())
    for step in range(len(batches) // accumulate):
        micro = batches[step * accumulate : (step + 1) * accumulate]
        total = sum(len(x) for x, _ in micro)
        opt.zero_grad()
        with cp(step, info={"batch_size": total, "optimizer": opt}, accumulate=True) as run:
            for x, y in micro:
                losses = F.cross_entropy(model(x), y, reduction="none")
                loss = losses.mean() / accumulate  # as Lightning divides
                info = {"loss": loss, "individual_losses": losses, "batch_size": len(x)}
                with run.micro_batch(info):
                    loss.backward(retain_graph=True)
        opt.step()
    cp.close()
    return cp.get_output()


def test_the_lightning_example_tracks_economy_on_a_stock_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = _lightning_module()
    x, y = data()
    dataset = torch.utils.data.TensorDataset(x.double(), y)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4)  # 4 batches: 2 steps of 2
    namespace = run_example("Lightning", module=module, loader=loader)

    callback, output = namespace["callback"], namespace["output"]
    assert callback.cockpit.errors == [] and callback.cockpit.skipped == []
    assert (tmp_path / "run" / "cockpit.jsonl").stat().st_size > 0
    for row in output.values():
        row.pop("time", None)
    expected = lightning_reference(list(loader), accumulate=2)
    assert_economy(output, expected, [0, 1])


# -- Hugging Face ---------------------------------------------------------------------------

VOCAB, T, ROWS = 40, 8, 8


def token_rows() -> list[dict[str, torch.Tensor]]:
    """Eight rows of token ids; row ``i``'s last ``i % 4`` labels are ``-100`` (padding)."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (ROWS, T), generator=gen)
    rows = []
    for i in range(ROWS):
        labels = ids[i].clone()
        if i % 4:
            labels[-(i % 4) :] = -100
        rows.append({"input_ids": ids[i], "labels": labels})
    return rows


def causal_losses(logits: torch.Tensor, labels: torch.Tensor, step_rows: int, tokens: Any):
    """``l_n = (B / N) sum_t ce_nt``: next-token cross-entropy summed over each sequence."""
    ce = F.cross_entropy(
        logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), reduction="none", ignore_index=-100
    )
    return ce.view(len(labels), -1).sum(1) * (step_rows / tokens)


def same_optimizer(optimizer: Any, names: dict[int, str], model: torch.nn.Module) -> Any:
    """A fresh optimizer of ``optimizer``'s class and groups (by parameter name) for ``model``.

    The groups keep every entry (the scheduler's ``initial_lr`` too: ``optimizer_hparams``
    reports them).
    """
    accepted = inspect.signature(type(optimizer)).parameters
    params = dict(model.named_parameters())
    groups = [
        {
            **{k: v for k, v in group.items() if k != "params"},  # initial_lr too
            "params": [params[names[id(p)]] for p in group["params"]],
        }
        for group in optimizer.param_groups
    ]
    options = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return type(optimizer)(groups, **options)


def hugging_face_reference(
    calls: list, lrs: dict, model: torch.nn.Module, opt: Any, clip: float
) -> dict:
    """The loop over the Trainer's micro-batches (two per step), its optimizer and clipping.

    ``calls``: ``(input_ids, labels, num_items_in_batch)`` of each forward pass of the
    Trainer's model; ``opt``: the Trainer's optimizer over ``model`` (``same_optimizer``).
    """
    cp = Cockpit(model, "economy", backend="autograd_loop", registry=loop_registry())
    for step in sorted(lrs):
        micro = calls[2 * (step - 1) : 2 * step]
        rows = sum(len(ids) for ids, _, _ in micro)
        tokens = micro[0][2]  # the Trainer's count, the same for the step's micro-batches
        assert all(n == tokens for _, _, n in micro)
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        opt.zero_grad()
        with cp(step, info={"batch_size": rows, "optimizer": opt}, accumulate=True) as run:
            for ids, labels, _ in micro:
                out = model(input_ids=ids, labels=labels, num_items_in_batch=tokens)
                losses = causal_losses(out.logits, labels, rows, tokens)
                info = {"loss": out.loss, "individual_losses": losses, "batch_size": len(ids)}
                with run.micro_batch(info):
                    out.loss.backward(retain_graph=True)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    cp.close()
    return cp.get_output()


def test_the_hugging_face_example_tracks_economy_on_a_stock_gpt2(tmp_path, monkeypatch):
    """Also: cockpit's values of an update are logged at the Trainer's step of that update."""
    import_framework("transformers")
    from cockpit_core.testing.models import tiny_gpt2

    monkeypatch.chdir(tmp_path)
    model = tiny_gpt2(vocab=VOCAB).double()
    calls: list[tuple[torch.Tensor, torch.Tensor, Any]] = []

    def record(module, args, kwargs):
        ids, labels = kwargs["input_ids"].clone(), kwargs["labels"].clone()
        calls.append((ids, labels, kwargs["num_items_in_batch"]))

    model.register_forward_pre_hook(record, with_kwargs=True)
    namespace = run_example("Hugging Face", model=model, dataset=token_rows())

    trainer, callback, output = namespace["trainer"], namespace["callback"], namespace["output"]
    assert callback.cockpit.errors == [] and callback.cockpit.skipped == []
    assert (tmp_path / "out" / "cockpit.jsonl").stat().st_size > 0
    steps = list(range(1, trainer.state.global_step + 1))
    assert len(steps) >= 2 and len(calls) == 2 * len(steps)
    history: dict[int, dict[str, float]] = {}
    for entry in trainer.state.log_history:
        history.setdefault(entry["step"], {}).update(entry)
    for step in steps:  # the Trainer's own values of the update and cockpit's: one step
        logged = history[step]
        assert logged["cockpit/grad_norm/total"] == pytest.approx(logged["grad_norm"], rel=1e-6)
        assert logged["cockpit/loss"] == pytest.approx(logged["loss"], rel=1e-6)
        assert logged["cockpit/grad_norm/total"] == output[step]["grad_norm"]["total"]
    lrs = {step: history[step]["learning_rate"] for step in steps}
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    loop_model = tiny_gpt2(vocab=VOCAB).double()
    opt = same_optimizer(optimizer, names, loop_model)
    expected = hugging_face_reference(calls, lrs, loop_model, opt, trainer.args.max_grad_norm)
    assert_economy(output, expected, steps)
