"""The Hugging Face integration gives the values of a Cockpit in a hand-written loop.

The first test trains with a user's ``Trainer`` subclass (it overrides ``compute_loss``)
composed with ``CockpitMixin``, ``CockpitCallback(quantities=...)`` and gradient
accumulation, and reads the values back from what the Trainer reported. The others check
clipping, the GradScaler, the deprecated ``CockpitTrainer`` and the errors.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
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
    data,
    fires_registry,
    import_framework,
    make_model,
    plain_model,
    reference,
    severity_counts,
    stock_reference,
)

transformers = import_framework("transformers")

from cockpit_core import Cockpit, CockpitWarning, MisuseError, extend  # noqa: E402
from cockpit_core.integrations.huggingface import (  # noqa: E402
    LOGGER_NAME,
    CockpitCallback,
    CockpitMixin,
    CockpitTrainer,
)
from cockpit_core.integrations.reporting import finding_text  # noqa: E402


class Data(torch.utils.data.Dataset):
    def __init__(self, key: str = "x"):
        self.x, self.y = data()
        self.key = key

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {self.key: self.x[i], "labels": self.y[i]}


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
    assert_logged_match(history)
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    board: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        if tag.startswith("train/cockpit/"):  # the Trainer's TensorBoard writer adds train/
            for event in events.Scalars(tag):
                board.setdefault(event.step, {})[tag.removeprefix("train/")] = event.value
    assert_logged_match(board, rtol=1e-6)  # TensorBoard keeps float32


def test_the_callback_without_the_mixin_and_the_mixin_without_the_callback_are_errors(
    tmp_path,
):
    plain = transformers.Trainer(
        model=Features(),
        args=_args(tmp_path, remove_unused_columns=False),
        train_dataset=Data("features"),
        callbacks=[CockpitCallback(quantities=["loss"])],
    )
    with pytest.raises(MisuseError, match=r"class MyTrainer\(CockpitMixin, Trainer\)"):
        plain.train()
    with pytest.raises(MisuseError, match=r"needs exactly one .*CockpitCallback.*found 0"):
        Tracked(model=Features(), args=_args(tmp_path), train_dataset=Data("features"))


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
    counts = {s: {k: history[s][f"cockpit/findings/{k}"] for k in FIRES_EXPECTED} for s in (0, 1)}
    assert counts == {0: {"info": 1, "warning": 1, "error": 0}, 1: FIRES_EXPECTED}


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

    def __init__(self):
        super().__init__()
        self.net = make_model()
        self.loss_fn = extend(torch.nn.CrossEntropyLoss())

    def forward(self, x, labels):
        logits = self.net(x)
        return {"loss": self.loss_fn(logits, labels), "logits": logits}


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
    assert_outputs_equal(cp.get_output(), expected)  # so the values are from before it
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
    assert_outputs_equal(cp.get_output(), expected)
    assert_params_equal(model.net.parameters(), params)


def test_two_step_values_are_reported_at_their_own_step(tmp_path, monkeypatch):
    """``update_size`` of step t arrives at step t + 1 and is still logged at step t.

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
    expected = {
        t: torch.cat([(b - a).double().flatten() for a, b in zip(states[t], after[t])]).norm()
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
