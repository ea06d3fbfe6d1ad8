"""The Lightning callback gives the values of a Cockpit in a hand-written loop, before clipping."""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

import pytest
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

pl = import_framework("lightning.pytorch")

from lightning.pytorch.plugins import MixedPrecision  # noqa: E402

from cockpit_core import Cockpit, CockpitWarning, MisuseError, extend  # noqa: E402
from cockpit_core.integrations.lightning import CockpitCallback  # noqa: E402


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_model()
        self.loss_fn = extend(torch.nn.CrossEntropyLoss())

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.cockpit_info = {"batch_size": len(x)}
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def test_callback_matches_a_hand_written_loop_and_sees_unclipped_gradients(tmp_path):
    module = Module()
    cp = Cockpit(module.net.named_parameters(), QUANTITIES, on_error="raise")
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        gradient_clip_val=CLIP,
        gradient_clip_algorithm="norm",
        callbacks=[CockpitCallback(cp)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, loader)

    expected, params = reference(clip=CLIP)
    assert all(expected[s]["grad_norm"]["total"] > CLIP for s in expected)  # clipping acts
    assert_outputs_equal(cp.get_output(), expected)  # so the values are from before it
    assert_params_equal(module.net.parameters(), params)  # and the updates were clipped


def _trainer(tmp_path, callbacks, **kwargs):
    return pl.Trainer(
        accelerator="cpu",
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **kwargs,
    )


class ScalerOnly(MixedPrecision):
    """Lightning's "16-mixed" plugin with its GradScaler, autocast off: float32 values.

    fp16 autocast is not available on CPU (Lightning switches "16-mixed" to bf16 there),
    so this keeps Lightning's real scaling path (scale before backward, unscale before
    clipping, scaler.step and update) on a float32 model, whose statistics must then
    equal those of the unscaled reference exactly up to rounding.
    """

    def forward_context(self):
        return contextlib.nullcontext()


def test_callback_passes_lightnings_grad_scaler_and_the_unscaled_loss(tmp_path):
    module = Module()
    cp = Cockpit(module.net.named_parameters(), QUANTITIES, on_error="raise")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    trainer = _trainer(
        tmp_path,
        [CockpitCallback(cp)],
        max_steps=STEPS,
        gradient_clip_val=CLIP,
        gradient_clip_algorithm="norm",
        plugins=[ScalerOnly("16-mixed", "cpu", scaler=scaler)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)  # no "looks scaled" warning either
        trainer.fit(module, loader)

    assert trainer.precision_plugin.scaler is scaler and scaler.get_scale() == 1024.0
    expected, params = reference(clip=CLIP)
    assert_outputs_equal(cp.get_output(), expected)  # unscaled, before clipping
    assert_params_equal(module.net.parameters(), params)


class TwoOptimizers(pl.LightningModule):
    """Manual optimization: two networks, each with its own loss, backward and optimizer."""

    def __init__(self):
        super().__init__()
        self.a = make_model()
        self.b = make_model(seed=1)
        self.loss_fn = extend(torch.nn.CrossEntropyLoss())
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt_a, opt_b = self.optimizers()
        self.cockpit_info = {"batch_size": len(x)}
        for net, opt in ((self.a, opt_a), (self.b, opt_b)):
            opt.zero_grad()
            self.manual_backward(self.loss_fn(net(x), y))
            opt.step()

    def configure_optimizers(self):
        return [
            torch.optim.SGD(self.a.parameters(), lr=LR),
            torch.optim.SGD(self.b.parameters(), lr=LR / 2),
        ]


def _two_optimizer_reference(x, y):
    """The same manual optimization by hand: one Cockpit per optimizer, one step per batch."""
    module = TwoOptimizers()
    opts = module.configure_optimizers()
    cps = [
        Cockpit(net.named_parameters(), QUANTITIES, on_error="raise")
        for net in (module.a, module.b)
    ]
    for step in range(len(x) // 16):
        xb, yb = x[16 * step : 16 * step + 16], y[16 * step : 16 * step + 16]
        for net, opt, cp in zip((module.a, module.b), opts, cps):
            opt.zero_grad()
            loss = module.loss_fn(net(xb), yb)
            with cp(step, info={"loss": loss, "batch_size": 16, "optimizer": opt}):
                loss.backward()
            opt.step()
    return [cp.get_output() for cp in cps]


def _three_batches():
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(48, 6, generator=gen), torch.randint(0, 3, (48,), generator=gen)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    return x, y, loader


def test_manual_optimization_tracks_each_optimizer_with_its_own_cockpit_and_steps(tmp_path):
    x, y, loader = _three_batches()
    module = TwoOptimizers()
    cps = {
        i: Cockpit(net.named_parameters(), QUANTITIES, on_error="raise")
        for i, net in enumerate((module.a, module.b))
    }
    _trainer(tmp_path, [CockpitCallback(cps)], max_epochs=1).fit(module, loader)

    expected = _two_optimizer_reference(x, y)
    for i in (0, 1):
        out = cps[i].get_output()
        assert sorted(out) == [0, 1, 2]  # one record per batch, each step once
        assert_outputs_equal(out, expected[i])  # its own loss and gradient, none stale


def test_one_cockpit_over_two_optimizers_is_a_clear_error(tmp_path):
    _, _, loader = _three_batches()
    module = TwoOptimizers()
    cp = Cockpit(module.named_parameters(), ["loss", "grad_norm"])
    trainer = _trainer(tmp_path, [CockpitCallback(cp)], max_epochs=1)
    with pytest.raises(
        MisuseError,
        match=r"the Cockpit would see a second backward pass at its step 0 \(training batch 0\) "
        r"before its optimizer stepped; a Cockpit tracks one backward pass per step\. Its "
        r"parameters belong to several optimizers",
    ):
        trainer.fit(module, loader)
