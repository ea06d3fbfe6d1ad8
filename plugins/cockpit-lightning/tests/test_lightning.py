"""The Lightning callback gives the values of a Cockpit in a hand-written loop, before clipping.

The first tests train a stock LightningModule (nothing for cockpit in it) with
``CockpitCallback(quantities=...)`` and read the values back from the Trainer's logger; the
others pass ready Cockpits (the earlier API, still supported) to modules that set
``cockpit_info``.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

import pytest
import torch

# the helpers shared with the core's tests (tests/integrations/_common.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "integrations"))
from _common import (  # noqa: E402
    CLIP,
    LR,
    QUANTITIES,
    STEPS,
    STOCK_LR,
    STOCK_QUANTITIES,
    assert_logged_match,
    assert_matches_brute_force,
    assert_outputs_equal,
    assert_params_equal,
    brute_force,
    chain_losses,
    data,
    import_framework,
    make_model,
    plain_model,
    read_csv,
    reference,
)

pl = import_framework("lightning.pytorch")

from cockpit_backpack import extend  # noqa: E402
from cockpit_lightning import CockpitCallback  # noqa: E402
from lightning.pytorch.plugins import MixedPrecision  # noqa: E402

from cockpit_core import (  # noqa: E402
    Cockpit,
    CockpitWarning,
    MissingInfoError,
    MisuseError,
    Quantity,
    Requirements,
)


class Stock(pl.LightningModule):
    """A LightningModule as users write it: no extend, no cockpit_info, no backward."""

    def __init__(self, manual: bool = False):
        super().__init__()
        self.net = plain_model()
        self.automatic_optimization = not manual

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=STOCK_LR)


def _fit_stock(tmp_path, logger, accumulate=1, manual=False, samples=16, **callback_options):
    """Fit ``Stock`` on the 16 samples (shuffled), ``16 / accumulate`` per batch."""
    x, y = data()
    if samples > len(x):  # more batches than one epoch of whole accumulated steps
        x, y = torch.cat([x, x])[:samples], torch.cat([y, y])[:samples]
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16 // accumulate, shuffle=True)
    callback = CockpitCallback(quantities=STOCK_QUANTITIES, on_error="raise", **callback_options)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        accumulate_grad_batches=accumulate,
        callbacks=[callback],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Stock(manual=manual), loader)
    return trainer, callback


@pytest.mark.parametrize(("accumulate", "manual"), [(2, False), (1, True)])
def test_stock_module_logs_the_values_of_a_hand_written_loop_to_csv(tmp_path, accumulate, manual):
    """Accumulating 2 micro-batches of 8 gives the statistics of the batch of 16.

    Manual optimization (``manual_backward``) goes through the same hooks.
    """
    logger = pl.loggers.CSVLogger(tmp_path, name="csv")
    trainer, callback = _fit_stock(tmp_path, logger, accumulate, manual, dashboard=False)
    assert callback.cockpit.errors == [] and callback.cockpit.skipped == []
    assert_logged_match(read_csv(Path(logger.log_dir) / "metrics.csv"))


def test_stock_module_logs_scalars_and_the_dashboard_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = pl.loggers.TensorBoardLogger(tmp_path, name="tb")
    _fit_stock(tmp_path, logger)
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    logged: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            logged.setdefault(event.step, {})[tag] = event.value
    assert_logged_match(logged, rtol=1e-6)  # TensorBoard keeps float32
    (image,) = events.Images("cockpit/dashboard")
    assert image.step == STEPS and image.width > 100 and image.height > 100


def test_an_uneven_accumulated_step_is_announced(tmp_path):
    """24 samples in batches of 8, 2 per step: the epoch's last step has one micro-batch."""
    with pytest.warns(CockpitWarning, match=r"micro-batches of sizes \[8\] instead of 2 of size 8"):
        _fit_stock(tmp_path, False, accumulate=2, samples=24, dashboard=False)


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


def test_built_cockpits_one_per_optimizer_log_under_their_index(tmp_path):
    """``quantities=`` with two optimizers: a Cockpit each, attached, own keys and log."""
    x, y, loader = _three_batches()
    logger = pl.loggers.CSVLogger(tmp_path, name="csv")
    callback = CockpitCallback(
        quantities=QUANTITIES, on_error="raise", log=tmp_path / "run.jsonl", dashboard=False
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        callbacks=[callback],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TwoOptimizers(), loader)

    expected = _two_optimizer_reference(x, y)
    logged = read_csv(Path(logger.log_dir) / "metrics.csv")
    for i in (0, 1):
        assert_outputs_equal(callback.cockpits[i].get_output(), expected[i])
        assert (tmp_path / f"run.optimizer_{i}.jsonl").exists()
        for step, values in expected[i].items():
            got = logged[step][f"cockpit/optimizer_{i}/grad_norm/total"]
            assert got == pytest.approx(values["grad_norm"]["total"], rel=1e-6)


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


class Chain(pl.LightningModule):
    """Manual optimization: optimizer 0 trains the first layer, 1 the second (float64).

    Each optimizer has its own backward pass of the loss of the whole network, which
    reaches the parameters of both unless ``toggle_optimizer`` freezes the other's.
    ``route`` says how the callback learns the optimizer: ``"index"``
    (``cockpit_info["optimizer_index"]``), ``"toggle"`` or ``None`` (neither);
    ``"shared"``: one backward pass for both optimizers. The second optimizer's gradient
    is clipped (norm ``CLIP``) between backward and step.
    """

    def __init__(self, route: str | None):
        super().__init__()
        torch.manual_seed(0)
        self.a = extend(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh()).double())
        self.b = extend(torch.nn.Sequential(torch.nn.Linear(5, 3)).double())
        self.loss_fn = extend(torch.nn.CrossEntropyLoss())
        self.route = route
        self.automatic_optimization = False
        self.states: dict[int, list] = {0: [], 1: []}  # every parameter before each backward
        self.batches: list = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.batches.append((x, y))
        if self.route == "shared":
            return self._shared_step(x, y)
        for i, opt in enumerate(self.optimizers()):
            if self.route == "toggle":
                self.toggle_optimizer(opt)
            self.states[i].append([p.detach().clone() for p in self.parameters()])
            out = self.b(self.a(x))
            losses = torch.nn.functional.cross_entropy(out, y, reduction="none")
            self.cockpit_info = {"batch_size": len(x), "individual_losses": losses.detach()}
            if self.route == "index":
                self.cockpit_info["optimizer_index"] = i
            opt.zero_grad()
            self.manual_backward(self.loss_fn(out, y))
            if i == 1:
                self.clip_gradients(opt, gradient_clip_val=CLIP, gradient_clip_algorithm="norm")
            opt.step()
            if self.route == "toggle":
                self.untoggle_optimizer(opt)

    def _shared_step(self, x, y):
        opts = self.optimizers()
        self.states[0].append([p.detach().clone() for p in self.parameters()])
        self.cockpit_info = {"batch_size": len(x)}
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(self.loss_fn(self.b(self.a(x)), y))
        self.clip_gradients(opts[1], gradient_clip_val=CLIP, gradient_clip_algorithm="norm")
        for opt in opts:
            opt.step()

    def configure_optimizers(self):
        return [
            torch.optim.SGD(self.a.parameters(), lr=0.5, momentum=0.9),
            torch.optim.SGD(self.b.parameters(), lr=0.8),
        ]


CHAIN_QUANTITIES = ["loss", "grad_norm", "update_size", "distance", "alpha"]


def _fit_chain(tmp_path, route, indices=(0, 1)):
    """Three batches of 16 (float64); a Cockpit per optimizer index in ``indices``."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(48, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (48,), generator=gen)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    module = Chain(route)
    nets = (module.a, module.b)
    cps = {
        i: Cockpit(nets[i].named_parameters(), CHAIN_QUANTITIES, on_error="raise") for i in indices
    }
    if not indices:  # one Cockpit over both optimizers' parameters
        cps = Cockpit(module.named_parameters(), ["loss", "grad_norm", "update_size", "distance"])
    _trainer(tmp_path, [CockpitCallback(cps)], max_epochs=1).fit(module, loader)
    return module, cps


def _chain_brute_force(module, i):
    """What the Cockpit of optimizer ``i`` must record: its parameters at its backward passes."""
    states = [*module.states[i], list(module.parameters())]  # + after the last step
    return brute_force(chain_losses, states, [2 * i, 2 * i + 1], module.batches)


@pytest.mark.parametrize("route", ["index", "toggle"])
def test_each_cockpit_sees_its_optimizers_parameters_update_and_clipping(tmp_path, route):
    """Update-based values are over exactly the parameters each optimizer updates."""
    module, cps = _fit_chain(tmp_path, route)
    for i in (0, 1):
        expected = _chain_brute_force(module, i)
        assert sorted(expected) == [0, 1, 2]  # one record per batch
        assert_matches_brute_force(cps[i].get_output(), expected, rel=1e-7)
    clipped = _chain_brute_force(module, 1)
    assert all(v["grad_norm"] > CLIP for v in clipped.values())  # clipping acted on 1 ...
    for s in (0, 1):  # ... after the Cockpit step: lr * CLIP (clip_grad_norm_: eps 1e-6)
        assert clipped[s]["update_size"] == pytest.approx(0.8 * CLIP, rel=1e-5)


def test_an_optimizer_without_a_cockpit_is_not_tracked(tmp_path):
    """Only optimizer 1 has a Cockpit: optimizer 0's backward passes are not recorded."""
    module, cps = _fit_chain(tmp_path, "toggle", indices=(1,))
    assert_matches_brute_force(cps[1].get_output(), _chain_brute_force(module, 1), rel=1e-7)


def test_a_backward_pass_reaching_two_cockpits_is_a_clear_error(tmp_path):
    with pytest.raises(
        MisuseError,
        match=r"^CockpitCallback: this backward pass reaches the parameters of the Cockpits "
        r"of optimizers \[0, 1\]; say which optimizer it belongs to: self\.cockpit_info = "
        r"\{'optimizer_index': i, \.\.\.\} before manual_backward\(\), or use "
        r"self\.toggle_optimizer\(opt\)\. If one backward pass serves several optimizers, "
        r"track their parameters with one Cockpit instead\.$",
    ):
        _fit_chain(tmp_path, None)


def test_one_backward_pass_for_two_optimizers_is_tracked_by_one_cockpit(tmp_path):
    """One record per batch over all parameters; the optimizer mismatch is warned about."""
    with pytest.warns(CockpitWarning, match=r"does not update 2 tracked parameter\(s\)"):
        module, cp = _fit_chain(tmp_path, "shared", indices=())
    states = [*module.states[0], list(module.parameters())]
    expected = brute_force(chain_losses, states, [0, 1, 2, 3], module.batches)
    assert_matches_brute_force(cp.get_output(), expected, rel=1e-7, skip=("alpha",))


# -- per-sample losses from the module's output, and errors that show their cause -------------


class EncoderHead(pl.LightningModule):
    """``self.head(self.encoder(x))`` and a child called afterwards for a scalar (a metric)."""

    def __init__(self, smoothing: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh())
        self.head = torch.nn.Linear(5, 3)
        self.agreement = Agreement()
        self.smoothing = smoothing
        self.states: list = []  # every parameter before each backward
        self.batches: list = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.states.append([p.detach().clone() for p in self.parameters()])
        self.batches.append((x, y))
        logits = self.head(self.encoder(x))
        self.log("agreement", self.agreement(logits, y))
        return torch.nn.functional.cross_entropy(logits, y, label_smoothing=self.smoothing)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=STOCK_LR)


class Agreement(torch.nn.Module):
    """A metric module: a 0-d tensor, not an output of the batch."""

    def forward(self, logits, y):
        return (logits.argmax(1) == y).double().mean()


def _fit_module(tmp_path, module, **callback_options):
    x, y = data()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x.double(), y), batch_size=8
    )
    callback = CockpitCallback(**callback_options)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module.double(), loader)
    return trainer, callback


@pytest.mark.parametrize("loss_fn", ["auto", "cross_entropy"])
def test_per_sample_losses_from_the_modules_output_give_alpha_by_brute_force(tmp_path, loss_fn):
    """The head's output (the last outermost call with the batch's first dimension, not the
    metric's scalar) and the batch's targets: ``alpha`` of every step equals its float64
    brute force over the per-sample losses and gradients."""
    module = EncoderHead()
    quantities = ["loss", "grad_norm", "distance", "update_size", "alpha"]
    _, callback = _fit_module(tmp_path, module, quantities=quantities, loss_fn=loss_fn)
    states = [*module.states, list(module.parameters())]
    expected = brute_force(chain_losses, states, [0, 1, 2, 3], module.batches)
    assert_matches_brute_force(callback.cockpit.get_output(), expected, rel=1e-7)


class NeedsWeather(Quantity):
    """A quantity whose ``info`` key no host provides."""

    name = "needs_weather"
    REQUIREMENTS = Requirements(info={"weather"})

    def compute(self, ctx):
        return 0.0


@pytest.mark.parametrize(
    ("module", "quantities", "error", "match"),
    [
        (
            lambda: EncoderHead(smoothing=0.1),
            "economy",
            MisuseError,
            r"'alpha' needs per-sample losses .* 'cross_entropy' has mean",
        ),
        (EncoderHead, ["loss", NeedsWeather()], MissingInfoError, r"info\['weather'\]"),
    ],
)
def test_an_error_in_a_step_is_what_fit_raises_and_the_log_is_closed(
    tmp_path, module, quantities, error, match
):
    """Before, ``on_exception`` left a step that never began (``AttributeError: 'StepRun'
    object has no attribute 'unobserved'``), hid the cause and left the log open."""
    callback = CockpitCallback(quantities=quantities, log=tmp_path / "run.jsonl")
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    with pytest.raises(error, match=match) as caught:
        trainer.fit(module(), loader)
    assert caught.value.__context__ is None  # nothing raised while handling it
    assert callback.cockpit._log.closed
    assert "backward" not in trainer.strategy.precision_plugin.__dict__  # restored
