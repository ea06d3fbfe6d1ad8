"""The Hugging Face integration gives the values of a Cockpit in a hand-written loop.

The first test trains with a user's ``Trainer`` subclass (it overrides ``compute_loss``)
composed with ``CockpitMixin``, ``CockpitCallback(quantities=...)`` and gradient
accumulation, and reads the values back from what the Trainer reported. The others check
the callback alone in a stock Trainer, clipping, the GradScaler, the deprecated
``CockpitTrainer``, the errors, and what reaches the console. Cockpit's step numbers are
the Trainer's ``global_step`` of each update (from 1): the hand-written loop's step ``s``
is the Trainer's ``s + 1`` (:func:`shifted`). ``tests/integrations/test_docs_examples.py``
runs the example of ``docs/integrations.md`` on a stock GPT-2.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import pytest
import torch

# the helpers shared with the core's tests (tests/integrations/_common.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "integrations"))
from _common import (  # noqa: E402
    CLIP,
    FIRES_EXPECTED,
    LR,
    QUANTITIES,
    STEPS,
    STOCK_LR,
    STOCK_QUANTITIES,
    assert_logged_match,
    assert_outputs_equal,
    assert_params_equal,
    compare,
    data,
    fires_registry,
    import_framework,
    loop_registry,
    make_model,
    plain_model,
    reference,
    severity_counts,
    stock_reference,
)

transformers = import_framework("transformers")

from cockpit_backpack import extend  # noqa: E402
from cockpit_huggingface import (  # noqa: E402
    LOGGER_NAME,
    CockpitCallback,
    CockpitMixin,
    CockpitTrainer,
)

from cockpit_core import BATCH_L2, Cockpit, CockpitWarning, MisuseError  # noqa: E402
from cockpit_core.hosts.reporting import finding_text  # noqa: E402


class Data(torch.utils.data.Dataset):
    def __init__(self, key: str = "x"):
        self.x, self.y = data()
        self.key = key

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {self.key: self.x[i], "labels": self.y[i]}


def shifted(output: dict) -> dict:
    """The Trainer's steps (from 1) as the hand-written loop's (from 0)."""
    return {step - 1: values for step, values in output.items()}


def _args(tmp_path, **kwargs):
    options = {
        "output_dir": str(tmp_path),
        "max_steps": STEPS,
        "per_device_train_batch_size": 16,  # the whole data set: one batch per step
        "learning_rate": LR,
        "lr_scheduler_type": "constant",
        "optim": "sgd",
        "weight_decay": 0.0,
        "max_grad_norm": 0.0,
        "report_to": [],
        "use_cpu": True,
        "save_strategy": "no",
        "logging_strategy": "no",
        "disable_tqdm": True,
    }
    return transformers.TrainingArguments(**{**options, **kwargs})


# -- a user's Trainer subclass, a stock model, gradient accumulation ----------------------


class Features(torch.nn.Module):
    """A model as users write it: no extend; the loss is computed by the Trainer."""

    def __init__(self):
        super().__init__()
        self.net = plain_model()

    def forward(self, features):
        return self.net(features)


class MyTrainer(transformers.Trainer):
    """The user's own Trainer subclass, with its own loss."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(inputs["features"])
        loss = torch.nn.functional.cross_entropy(logits, inputs["labels"])
        return (loss, logits) if return_outputs else loss


class Tracked(CockpitMixin, MyTrainer):
    """What the user adds: one line."""


class Closes:
    """A sink that counts how often the Cockpit closed it."""

    def __init__(self):
        self.closed = 0

    def __call__(self, record):
        pass

    def close(self):
        self.closed += 1


def test_mixin_with_accumulation_reports_the_values_of_a_hand_written_loop(tmp_path, monkeypatch):
    """2 micro-batches of 8 (shuffled) per step give the statistics of the batch of 16.

    The values reach ``report_to`` (TensorBoard here) and the Trainer's log history at the
    Cockpit's step; the callback closes the Cockpit when training ends.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    sink = Closes()
    callback = CockpitCallback(quantities=STOCK_QUANTITIES, on_error="raise", sinks=[sink])
    args = _args(
        tmp_path,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        learning_rate=STOCK_LR,
        report_to=["tensorboard"],
        remove_unused_columns=False,  # the labels are for compute_loss, not the model
    )
    trainer = Tracked(
        model=Features(), args=args, train_dataset=Data("features"), callbacks=[callback]
    )
    trainer.train()

    assert trainer.cockpit is callback.cockpit and callback.cockpit.errors == []
    assert sink.closed == 1
    history = {
        entry["step"]: {k: v for k, v in entry.items() if k.startswith("cockpit/")}
        for entry in trainer.state.log_history
        if "cockpit/loss" in entry
    }
    assert_logged_match(history, first=1)
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    board: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        if tag.startswith("train/cockpit/"):  # the Trainer's TensorBoard writer adds train/
            for event in events.Scalars(tag):
                board.setdefault(event.step, {})[tag.removeprefix("train/")] = event.value
    assert_logged_match(board, rtol=1e-6, first=1)  # TensorBoard keeps float32


def test_the_callback_alone_serves_a_stock_trainer_and_the_mixin_needs_one_callback(tmp_path):
    """No mixin: the callback finds its Trainer, also when added after the Trainer is built."""
    for late in (False, True):
        callback = CockpitCallback(quantities=STOCK_QUANTITIES, on_error="raise")
        trainer = transformers.Trainer(
            model=Wrapped(extended=False),
            args=_args(tmp_path / str(late), learning_rate=STOCK_LR),
            train_dataset=Data(),
            callbacks=None if late else [callback],
        )
        if late:
            trainer.add_callback(callback)
        trainer.train()
        assert callback.host is trainer and callback.closed
        assert_logged_match(
            {
                e["step"]: {k: v for k, v in e.items() if k.startswith("cockpit/")}
                for e in trainer.state.log_history
                if "cockpit/loss" in e
            },
            first=1,
        )
    with pytest.raises(MisuseError, match=r"needs exactly one .*CockpitCallback.*found 0"):
        Tracked(model=Features(), args=_args(tmp_path), train_dataset=Data("features"))
    with pytest.raises(MisuseError, match="a Trainer takes one CockpitCallback"):
        transformers.Trainer(
            model=Wrapped(extended=False),
            args=_args(tmp_path),
            train_dataset=Data(),
            callbacks=[CockpitCallback(), CockpitCallback()],
        )


# -- findings of diagnoses=[...] ---------------------------------------------------------


class Records(logging.Handler):
    """Keeps every record it handles."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def finding_records():
    """What the findings logger emits, on its own handler (transformers' root logger
    propagates to the root logger only with ``CI`` set)."""
    handler = Records()
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(handler)
    level = transformers.utils.logging.get_verbosity()
    yield lambda: list(handler.records)
    logger.removeHandler(handler)
    transformers.utils.logging.set_verbosity(level)  # the Trainer set log_level globally


def _train_diagnosed(tmp_path, **options):
    """Train ``STEPS`` steps with the test diagnosis ``fires``; also the CockpitWarnings."""
    callback = CockpitCallback(
        quantities=["loss", "grad_norm"],
        diagnoses=["fires"],
        registry=fires_registry(),
        log=tmp_path / "run.jsonl",
        **options,
    )
    args = _args(tmp_path, remove_unused_columns=False, log_level="info")  # info findings too
    trainer = Tracked(
        model=Features(), args=args, train_dataset=Data("features"), callbacks=[callback]
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    fired = [str(w.message) for w in caught if issubclass(w.category, CockpitWarning)]
    return trainer, callback.cockpit, [m for m in fired if "fires:" in m]


def test_findings_are_logged_by_transformers_once_and_counted_in_the_log_history(
    tmp_path, finding_records
):
    """``report_to`` none: the counts still reach the Trainer's log history."""
    trainer, cp, warned = _train_diagnosed(tmp_path)

    assert severity_counts(cp.findings) == FIRES_EXPECTED
    assert warned == []  # the Cockpit's own warning is off: no second report
    levels = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
    got = [(r.levelno, r.getMessage()) for r in finding_records()]
    assert got == [(levels[f.severity], finding_text(f)) for f in cp.findings]  # each once
    assert (logging.WARNING, "cockpit: WARNING fires: the test rule fired (step 1). A test.") in got
    history = {}
    for entry in trainer.state.log_history:
        history.setdefault(entry["step"], {}).update(entry)
    counts = {s: {k: history[s][f"cockpit/findings/{k}"] for k in FIRES_EXPECTED} for s in (1, 2)}
    assert counts == {1: {"info": 1, "warning": 1, "error": 1}, 2: FIRES_EXPECTED}


def test_findings_without_reporting_are_still_logged_and_false_leaves_the_core_warning(
    tmp_path, finding_records
):
    trainer, cp, warned = _train_diagnosed(tmp_path / "a", report=False)
    assert [r.getMessage() for r in finding_records()] == [finding_text(f) for f in cp.findings]
    assert warned == [] and len(cp.findings) == 4
    assert not any("cockpit/findings/warning" in e for e in trainer.state.log_history)

    count = len(finding_records())
    trainer, cp, warned = _train_diagnosed(tmp_path / "b", findings=False)
    assert len(finding_records()) == count  # nothing more through transformers
    assert warned == [f"cockpit: {f.line()}. {f.suggestion}" for f in cp.findings]  # the core's
    assert not any("cockpit/findings/warning" in e for e in trainer.state.log_history)


# -- ready Cockpits, BackPACK-extended HF-style models --------------------------------------


class Wrapped(torch.nn.Module):
    """An HF-style model: takes named inputs, returns a dict with the mean loss."""

    def __init__(self, extended: bool = True):
        super().__init__()
        self.net = make_model() if extended else plain_model()
        self.loss_fn = extend(torch.nn.CrossEntropyLoss()) if extended else None

    def loss(self, logits, labels):
        if self.loss_fn is None:
            return torch.nn.functional.cross_entropy(logits, labels)
        return self.loss_fn(logits, labels)

    def forward(self, x, labels):
        logits = self.net(x)
        return {"loss": self.loss(logits, labels), "logits": logits}


class TrackedDefault(CockpitMixin, transformers.Trainer):
    """The stock Trainer with the mixin."""


def test_deprecated_trainer_matches_a_hand_written_loop_and_sees_unclipped_gradients(tmp_path):
    model = Wrapped()
    cp = Cockpit(model.net.named_parameters(), QUANTITIES, on_error="raise")
    with pytest.warns(FutureWarning, match="CockpitTrainer is deprecated"):
        trainer = CockpitTrainer(
            model=model, args=_args(tmp_path, max_grad_norm=CLIP), train_dataset=Data(), cockpit=cp
        )
    trainer.train()

    expected, params = reference(clip=CLIP)
    assert all(expected[s]["grad_norm"]["total"] > CLIP for s in expected)  # clipping acts
    assert_outputs_equal(shifted(cp.get_output()), expected)  # so the values are from before it
    assert_params_equal(model.net.parameters(), params)  # and the updates were clipped


def test_mixin_passes_the_accelerators_grad_scaler(tmp_path):
    """``fp16`` needs a GPU, so the Accelerator gets a GradScaler by hand (as fp16 would).

    Without clipping (the Accelerator unscales before clipping only in real fp16), the
    run must give the statistics and parameters of the unscaled reference.
    """
    model = Wrapped()
    cp = Cockpit(model.net.named_parameters(), QUANTITIES, on_error="raise")
    trainer = TrackedDefault(
        model=model, args=_args(tmp_path), train_dataset=Data(), callbacks=[CockpitCallback(cp)]
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    trainer.accelerator.scaler = scaler  # prepare() hands it to the optimizer wrapper
    scaled = []
    scale = scaler.scale
    scaler.scale = lambda loss: scaled.append(1) or scale(loss)  # count the scaled losses
    with warnings.catch_warnings():  # unannounced scaling would warn
        warnings.simplefilter("error", CockpitWarning)
        trainer.train()

    assert len(scaled) == STEPS  # the loss was scaled by 1024 at every step

    expected, params = reference()
    assert_outputs_equal(shifted(cp.get_output()), expected)
    assert_params_equal(model.net.parameters(), params)


def test_two_step_values_are_reported_at_their_own_step(tmp_path, monkeypatch):
    """``update_size`` of step t arrives with step t + 1 and is still logged at step t.

    Reference: the float64 norm of the change of the parameters of a hand-written loop
    (SGD, all 16 samples per step).
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    callback = CockpitCallback(quantities=["loss", "update_size"], on_error="raise")
    args = _args(
        tmp_path,
        learning_rate=STOCK_LR,
        report_to=["tensorboard"],
        remove_unused_columns=False,
    )
    trainer = Tracked(
        model=Features(), args=args, train_dataset=Data("features"), callbacks=[callback]
    )
    trainer.train()

    _, states = stock_reference(STEPS)
    final = [p.detach().clone() for p in trainer.model.parameters()]
    after = states[1:] + [final]
    expected = {  # the Trainer's step t + 1 is the loop's step t
        t + 1: torch.cat([(b - a).double().flatten() for a, b in zip(states[t], after[t])]).norm()
        for t in range(STEPS)
    }
    history = {
        entry["step"]: entry["cockpit/update_size/total"]
        for entry in trainer.state.log_history
        if "cockpit/update_size/total" in entry
    }
    output = callback.cockpit.get_output()
    assert len(history) >= STEPS - 1
    assert history == {s: output[s]["update_size"]["total"] for s in history}
    for step, value in history.items():
        assert value == pytest.approx(float(expected[step]), rel=1e-5)
    assert trainer.state.global_step == STEPS  # restored after each report
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    board = {e.step: e.value for e in events.Scalars("train/cockpit/update_size/total")}
    assert board == pytest.approx(history, rel=1e-6)


# -- per-sample losses, cockpit_info under accumulation, the console, errors ---------------


def _sequence_classifier():
    """A stock ``GPT2ForSequenceClassification`` (3 classes), tiny, float64, seeded."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=40,
        n_positions=16,
        n_embd=24,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        num_labels=3,
        pad_token_id=0,
    )
    return transformers.GPT2ForSequenceClassification(config).double()


def test_sequence_classification_under_accumulation_matches_the_per_sample_loop(tmp_path):
    """``GPT2ForSequenceClassification`` takes ``num_items_in_batch`` (``**kwargs``) but averages
    over its micro-batch, so the Trainer does not divide by ``K`` and backpropagates the sum
    of the ``K`` micro-batch means: cockpit's ``l_n = K ce_n``, whose mean over the step is
    that sum. Reference: a loop (SGD) over the same micro-batches with those per-sample
    losses and one autograd call per sequence; its ``loss`` is also the Trainer's.
    """
    gen = torch.Generator().manual_seed(5)
    ids, labels = (
        torch.randint(1, 40, (8, 6), generator=gen),
        torch.randint(0, 3, (8,), generator=gen),
    )
    rows = [{"input_ids": ids[i], "labels": labels[i]} for i in range(8)]
    model = _sequence_classifier()
    calls = []
    model.register_forward_pre_hook(
        lambda m, a, k: calls.append((k["input_ids"], k["labels"])), with_kwargs=True
    )
    quantities = ["loss", "grad_norm", "norm_test", "alpha", "early_stopping"]
    callback = CockpitCallback(quantities=quantities, on_error="raise", console=False)
    args = _args(
        tmp_path,
        max_steps=-1,
        num_train_epochs=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=0.5,
        logging_steps=1,
        logging_strategy="steps",
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, callbacks=[callback])
    trainer.train()

    reference = _sequence_classifier()
    opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    cp = Cockpit(reference, quantities, backend="autograd_loop", registry=loop_registry())
    for step in (1, 2):
        opt.zero_grad()
        with cp(step, info={"batch_size": 8, "optimizer": opt}, accumulate=True) as run:
            for x, y in calls[2 * step - 2 : 2 * step]:
                out = reference(input_ids=x, labels=y)
                losses = 2 * torch.nn.functional.cross_entropy(out.logits, y, reduction="none")
                info = {"loss": out.loss, "individual_losses": losses, "batch_size": len(x)}
                with run.micro_batch(info):
                    out.loss.backward(retain_graph=True)
        opt.step()
    output = callback.cockpit.get_output()
    compare(output, cp.get_output())
    logged = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    assert logged == pytest.approx({s: output[s]["loss"] for s in (1, 2)}, rel=1e-6)


def test_every_key_of_cockpit_info_reaches_each_micro_batch(tmp_path):
    """``torch.func`` needs ``inputs`` and ``targets`` per micro-batch (``cockpit_info``).

    Before, only ``loss``, ``individual_losses`` and ``batch_size`` went to a micro-batch,
    so every per-sample statistic was missing under accumulation.
    """

    def batch_info(inputs, outputs):
        return {"inputs": inputs["features"], "targets": inputs["labels"]}

    quantities = ["loss", "grad_norm", "norm_test", "mean_gsnr"]
    callback = CockpitCallback(
        quantities=quantities,
        backend="func",
        loss_fn="cross_entropy",
        cockpit_info=batch_info,
        on_error="raise",
        console=False,
    )
    args = _args(
        tmp_path,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        learning_rate=STOCK_LR,
        remove_unused_columns=False,
    )
    trainer = Tracked(
        model=Features(), args=args, train_dataset=Data("features"), callbacks=[callback]
    )
    trainer.train()

    assert {r.provider for r in callback.cockpit._router.routes(BATCH_L2)} == {"func"}
    expected, _ = stock_reference(first=1)
    output = callback.cockpit.get_output()
    assert sorted(output) == sorted(expected)
    for step, values in expected.items():
        for key in quantities:
            compare(output[step][key], values[key], f"{step}.{key}", rtol=1e-5)


def test_the_console_gets_one_short_line_per_logging_step(tmp_path, capsys):
    """Not the scalars of ``Trainer.log``: those go to the log history only (no report_to)."""
    callback = CockpitCallback(quantities="economy", per_param=True)
    args = _args(
        tmp_path,
        max_steps=3,
        per_device_train_batch_size=8,
        learning_rate=STOCK_LR,
        logging_steps=1,
        logging_strategy="steps",
    )
    trainer = transformers.Trainer(
        model=Wrapped(extended=False), args=args, train_dataset=Data(), callbacks=[callback]
    )
    trainer.train()

    printed = capsys.readouterr().out.splitlines()
    lines = [line for line in printed if line.startswith("cockpit step")]
    assert [line.split(":")[0] for line in lines] == [f"cockpit step {s}" for s in (1, 2, 3)]
    assert lines[1].startswith("cockpit step 2: grad_norm ")
    assert "alpha " in lines[1] and "(step 1)" in lines[1]
    assert all(line.count("|") <= 4 for line in lines)  # at most five values
    assert not any("cockpit/" in line for line in printed)
    history = [e for e in trainer.state.log_history if "cockpit/grad_norm/total" in e]
    assert [e["step"] for e in history] == [1, 2, 3]
    assert "cockpit/grad_norm/net.0.weight" in history[0]  # per_param=True: log history only


def test_a_loss_cockpit_cannot_reproduce_stops_training_with_the_reason(tmp_path):
    """Label smoothing: no per-sample loss has the Trainer's mean. The error says so, and
    the Cockpit's log is closed."""
    gen = torch.Generator().manual_seed(5)
    ids, labels = (
        torch.randint(1, 40, (8, 6), generator=gen),
        torch.randint(0, 3, (8,), generator=gen),
    )
    rows = [{"input_ids": ids[i], "labels": labels[i]} for i in range(8)]
    callback = CockpitCallback(quantities="economy", log=tmp_path / "run.jsonl", console=False)
    args = _args(tmp_path, per_device_train_batch_size=8, label_smoothing_factor=0.1)
    trainer = transformers.Trainer(
        model=_sequence_classifier(), args=args, train_dataset=rows, callbacks=[callback]
    )
    with pytest.raises(MisuseError, match=r"'alpha' needs per-sample losses .* 'cross_entropy'"):
        trainer.train()
    assert callback.closed and callback.cockpit._log.closed
