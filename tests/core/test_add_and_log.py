"""``cp.add(quantity)`` mid-run and ``cp.log(step, **metrics)``: values, errors, the log."""

import json
import warnings

import numpy as np
import pytest
import torch

from cockpit_core import (
    Cockpit,
    CockpitWarning,
    ConfigError,
    MissingInfoError,
    MisuseError,
    read_log,
)
from cockpit_core.log import LogFormatError, read_records, read_run
from cockpit_core.testing import tiny_mlp

ADDED = ["grad_norm", "update_size", "norm_test", "alpha"]


def train(quantities, steps=6, add_at=None, to_add=(), info_keys=None, **kwargs):
    """Train the tiny MLP; add ``to_add`` between step ``add_at - 1`` and ``add_at``."""
    problem = tiny_mlp()
    model = problem.make_model()
    loss_fn = problem.loss_module()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, quantities, **kwargs)
    grads, added = {}, []
    for step in range(steps):
        if step == add_at:
            added = [cp.add(q) for q in to_add]
        x, y = problem.batch(step)
        opt.zero_grad()
        outputs = model(x)
        loss = loss_fn(outputs, y)
        losses = problem.individual_losses(outputs, y).detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": len(x), "optimizer": opt}
        if info_keys is not None:
            info = {k: v for k, v in info.items() if k in info_keys}
        with cp(step, info=info):
            loss.backward(retain_graph=cp.retain_graph(step))
        grads[step] = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
    return cp, grads, added


def assert_same(a, b, path="value"):
    """Nested dicts/lists/arrays/numbers equal to float64 round-off."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)) and not np.isscalar(a):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif a is None or isinstance(a, str):
        assert a == b, path
    else:
        np.testing.assert_allclose(
            np.asarray(a, float), np.asarray(b, float), rtol=1e-9, err_msg=path
        )


# -- cp.add ------------------------------------------------------------------------------


def test_added_quantities_from_the_next_step_on_equal_tracking_them_from_the_start():
    reference, _, _ = train(["loss", *ADDED])
    with warnings.catch_warnings():  # the providers observe the new quantities' forward pass
        warnings.simplefilter("error", CockpitWarning)
        cp, grads, added = train(["loss"], add_at=3, to_add=ADDED)
    assert [q.key for q in added] == ADDED
    assert [q.key for q in cp.quantities] == ["loss", *ADDED]
    out, ref = cp.get_output(), reference.get_output()
    for step in range(3):
        assert set(out[step]) == {"loss"}
    assert [s for s in out if "update_size" in out[s]] == [3, 4]  # two-step: ends a step later
    for step in range(3, 6):
        assert out[step].keys() == ref[step].keys()
        # alpha learns the optimizer at its first step (which predicts that step's update
        # generically, from the start too): equal from its second step on
        same = {k: v for k, v in out[step].items() if k != "alpha" or step > 3}
        assert_same(same, {k: ref[step][k] for k in same}, f"step {step}")
    assert out[3]["alpha"]["predictor"] == ref[0]["alpha"]["predictor"] == "generic"
    for step in range(3, 6):  # brute force: ||g|| of the mini-batch gradient, per parameter
        per_param = [float(g.pow(2).sum().sqrt()) for g in grads[step]]
        total = float(torch.cat([g.flatten() for g in grads[step]]).norm())
        np.testing.assert_allclose(out[step]["grad_norm"]["per_param"], per_param, rtol=1e-12)
        assert out[step]["grad_norm"]["total"] == pytest.approx(total, rel=1e-12)


def test_add_before_the_first_step_is_as_if_given_to_the_constructor():
    cp, _, _ = train(["loss"], steps=2, add_at=0, to_add=["grad_norm"])
    reference, _, _ = train(["loss", "grad_norm"], steps=2)
    assert_same(cp.get_output(), reference.get_output())
    assert cp.header()["quantities"][1] == {"name": "grad_norm", "key": "grad_norm", "added_at": 0}


def test_add_accepts_names_option_dicts_classes_and_instances():
    from cockpit_basic import GradNorm, Time

    cp, _, added = train(
        ["loss"],
        steps=4,
        add_at=2,
        to_add=[{"name": "grad_norm", "label": "gn", "every": 2}, Time, GradNorm()],
    )
    assert [(q.name, q.key) for q in added] == [
        ("grad_norm", "gn"),
        ("time", "time"),
        ("grad_norm", "grad_norm"),
    ]
    out = cp.get_output()
    assert [s for s in out if "gn" in out[s]] == [2]  # every 2 from step 2 on: 2 (and 4)
    assert [s for s in out if "grad_norm" in out[s]] == [2, 3]
    assert cp.header()["quantities"][1] == {
        "name": "grad_norm",
        "key": "gn",
        "every": 2,
        "label": "gn",
        "added_at": 2,
    }


def test_the_log_records_which_quantity_was_added_at_which_step(tmp_path):
    log = tmp_path / "log.jsonl"
    cp, _, _ = train(
        ["loss"], steps=4, add_at=2, to_add=[{"name": "grad_norm", "label": "gn"}], log=log
    )
    cp.close()
    added = [r for r in read_records(log) if r["kind"] == "quantity_added"]
    assert added == [
        {
            "kind": "quantity_added",
            "step": 2,
            "quantity": {"name": "grad_norm", "key": "gn", "label": "gn"},
        }
    ]
    data = read_run(log)
    entry = {"name": "grad_norm", "key": "gn", "label": "gn"}
    assert data.added == [{"step": 2, "quantity": entry}]
    assert data.header["quantities"] == [{"name": "loss", "key": "loss"}, {**entry, "added_at": 2}]
    written = read_run(cp.write(tmp_path / "output.json"))
    assert written.added == data.added
    assert written.header["quantities"] == data.header["quantities"]
    assert_same(written.output, data.output)
    # the dashboard finds the label of the added quantity through the header
    from cockpit_dashboard import plan

    titles = [p.title for p in plan(data).panels]
    assert "Gradient norm [gn]" in titles


def test_add_refuses_unknown_names_with_the_closest_one():
    cp = Cockpit(tiny_mlp().make_model(), ["loss"])
    with pytest.raises(ConfigError) as err:
        cp.add("grad_nrom")
    text = str(err.value)
    assert text.startswith("Invalid cockpit configuration in cp.add(...):\n  quantity: ")
    assert "Unknown quantity 'grad_nrom'. Did you mean 'grad_norm'? Installed: " in text
    with pytest.raises(ConfigError, match=r"quantity\.name: Unknown quantity 'nope'"):
        cp.add({"name": "nope"})
    assert [q.key for q in cp.quantities] == ["loss"]


def test_add_refuses_bad_options_like_the_constructor():
    cp = Cockpit(tiny_mlp().make_model(), ["loss"])
    with pytest.raises(ConfigError) as added:
        cp.add({"name": "grad_norm", "evry": 2})
    with pytest.raises(ConfigError) as built:
        Cockpit(tiny_mlp().make_model(), [{"name": "grad_norm", "evry": 2}])
    assert added.value.errors[0][0] == "quantity.evry"
    assert built.value.errors[0][0] == "quantities.0.evry"
    assert added.value.errors[0][1] == built.value.errors[0][1]
    with pytest.raises(ConfigError, match="quantity.every: Input should be"):
        cp.add({"name": "grad_norm", "every": "often"})


def test_add_refuses_a_key_that_is_already_tracked():
    cp = Cockpit(tiny_mlp().make_model(), ["loss", {"name": "grad_norm", "label": "gn"}])
    with pytest.raises(ConfigError) as err:
        cp.add({"name": "time", "label": "gn"})
    assert err.value.errors == [
        (
            "quantity",
            "'gn' is already tracked; give the added one a distinct 'label', e.g. "
            "cp.add({'name': 'time', 'label': 'gn_2'})",
        )
    ]
    with pytest.raises(ConfigError, match="'loss' is already tracked"):
        cp.add(cp.quantities[0])  # the same instance twice
    assert cp.add("grad_norm").key == "grad_norm"  # the name is free: only the label is taken


def test_add_refuses_presets_and_the_reserved_key_metrics():
    cp = Cockpit(tiny_mlp().make_model(), ["loss"])
    with pytest.raises(ConfigError, match=r"'basic' is a preset of 6 quantities; cp.add takes"):
        cp.add("basic")
    reserved = (
        "the output key 'metrics' is reserved for the metrics of cp.log(step, ...); give this "
        "quantity another 'label'"
    )
    with pytest.raises(ConfigError) as err:
        cp.add({"name": "grad_norm", "label": "metrics"})
    assert err.value.errors == [("quantity", reserved)]
    with pytest.raises(ConfigError) as err:
        Cockpit(tiny_mlp().make_model(), [{"name": "grad_norm", "label": "metrics"}])
    assert err.value.errors == [("quantities.0", reserved)]


def test_add_is_refused_inside_a_step_block():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model, ["grad_norm"])
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y)
    with cp(7, info={"loss": loss, "batch_size": len(x)}):
        loss.backward()
        with pytest.raises(MisuseError) as err:
            cp.add("loss")
    assert str(err.value) == (
        "cp.add(...) called inside the `with cp(7, ...)` block: add quantities between "
        "steps (after the block, before the next forward pass); they are tracked from the "
        "next step on."
    )
    assert [q.key for q in cp.quantities] == ["grad_norm"]
    assert cp.add("loss").key == "loss"  # after the block


def test_the_info_an_added_quantity_needs_is_checked_at_the_next_step():
    # norm_test needs info['batch_size'] (per-sample, no individual_losses); first
    # scheduled at step 100, it is still checked when the next step begins. An added
    # quantity never stops training: the error is recorded (tests/core/test_remove.py)
    with pytest.warns(CockpitWarning, match="'norm_test' failed at step 2"):
        cp, _, _ = train(
            ["grad_norm"],
            steps=4,
            add_at=2,
            to_add=[{"name": "norm_test", "every": 100, "offset": 0}],
            info_keys=("loss",),
        )
    assert [(e["step"], e["quantity"], e["phase"]) for e in cp.errors] == [(2, "norm_test", "info")]
    assert cp.errors[0]["error"] == (
        "MissingInfoError: 'norm_test' (added with cp.add) needs info['batch_size']: pass "
        "info={'batch_size': B}."
    )
    assert sorted(cp.get_output()) == [0, 1, 2, 3]
    with pytest.raises(MissingInfoError, match="'norm_test' .added with cp.add. needs"):
        train(
            ["grad_norm"],
            steps=4,
            add_at=2,
            to_add=[{"name": "norm_test", "every": 100, "offset": 0}],
            info_keys=("loss",),
            on_error="raise",  # chosen explicitly: raises
        )


def test_an_added_quantity_without_a_provider_warns_like_the_constructor():
    from cockpit_core import Quantity, Requirements, Statistic
    from cockpit_core.statistics.kinds import StatisticKind

    kind = StatisticKind("nobody_computes_this", per_sample=False, combine="sum")

    class Needy(Quantity):
        name = "needy"

        def requirements(self):
            return Requirements(statistics=(Statistic(kind),))

        def compute(self, ctx):
            return 0.0

    cp = Cockpit(tiny_mlp().make_model(), ["loss"])
    with pytest.warns(CockpitWarning, match="which 'needy' needs; it will record an error"):
        cp.add(Needy())


# -- cp.log ------------------------------------------------------------------------------


def test_logged_metrics_round_trip_through_output_log_and_write(tmp_path):
    log = tmp_path / "log.jsonl"
    seen = []
    cp, _, _ = train(["loss"], steps=3, log=log, sinks=[seen.append])
    cp.log(2, epoch_count=1, train_loss=torch.tensor(0.25), valid_loss=np.float32(0.5))
    cp.log(2, valid_accuracy=0.75, train_loss=0.125, test_loss=None)  # merges; replaces
    cp.log(10, learning_rate=np.float64(0.1), my_metric=np.int64(7), test_accuracy=None)
    cp.log(11, test_loss=None)  # nothing measured: nothing recorded
    cp.close()
    expected = {
        2: {"epoch_count": 1, "train_loss": 0.125, "valid_loss": 0.5, "valid_accuracy": 0.75},
        10: {"learning_rate": 0.1, "my_metric": 7},
    }
    out = cp.get_output()
    assert {s: v["metrics"] for s, v in out.items() if "metrics" in v} == expected
    assert set(out[2]) == {"loss", "metrics"}  # beside the step's quantity values
    assert out[10] == {"metrics": expected[10]}
    assert type(out[2]["metrics"]["epoch_count"]) is int
    assert type(out[10]["metrics"]["my_metric"]) is int
    assert type(out[2]["metrics"]["valid_loss"]) is float
    records = [r for r in seen if r["kind"] == "metrics"]
    assert records == [
        {
            "kind": "metrics",
            "step": 2,
            "metrics": {"epoch_count": 1, "train_loss": 0.25, "valid_loss": 0.5},
        },
        {"kind": "metrics", "step": 2, "metrics": {"valid_accuracy": 0.75, "train_loss": 0.125}},
        {"kind": "metrics", "step": 10, "metrics": {"learning_rate": 0.1, "my_metric": 7}},
    ]
    assert [r for r in read_records(log) if r["kind"] == "metrics"] == records
    for path in (log, cp.write(tmp_path / "output.json")):
        data = read_run(path)
        assert data.metrics == expected
        assert read_log(path)[2]["metrics"] == expected[2]
        assert read_log(path)[2]["loss"] == out[2]["loss"]
    assert json.loads((tmp_path / "output.json").read_text())["output"]["10"] == out[10]


def test_get_output_copies_do_not_change_with_later_calls():
    cp = Cockpit(tiny_mlp().make_model(), ["loss"])
    cp.log(0, train_loss=1.0)
    before = cp.get_output()
    cp.log(0, train_loss=0.5, valid_loss=0.7)
    assert before[0]["metrics"] == {"train_loss": 1.0}
    assert cp.get_output()[0]["metrics"] == {"train_loss": 0.5, "valid_loss": 0.7}


@pytest.mark.parametrize(
    "value, message",
    [
        (
            True,
            "cp.log: metric 'acc' is the bool True; pass an int, a float, a numpy number, "
            "a 0-d tensor or None (not measured) (write acc=int(flag) to log a flag as 0 or 1).",
        ),
        (np.bool_(False), "cp.log: metric 'acc' is the bool False; "),
        (
            "0.9",
            "cp.log: metric 'acc' is a str ('0.9'); pass an int, a float, a numpy number, "
            "a 0-d tensor or None (not measured).",
        ),
        ([0.9], "cp.log: metric 'acc' is a list ([0.9]); "),
        (1 + 2j, "cp.log: metric 'acc' is a complex ((1+2j)); "),
        (
            torch.ones(2),
            "cp.log: metric 'acc' is a tensor of shape [2]; pass an int, a float, "
            "a numpy number, a 0-d tensor or None (not measured) (e.g. acc=t.mean() or "
            "acc=t.item()).",
        ),
        (torch.tensor(True), "cp.log: metric 'acc' is a 0-d tensor of dtype torch.bool; "),
        (np.zeros(3), "cp.log: metric 'acc' is an array of shape [3]; "),
    ],
)
def test_log_refuses_values_that_are_not_real_numbers(value, message):
    cp = Cockpit(tiny_mlp().make_model(), ["loss"])
    with pytest.raises(TypeError) as err:
        cp.log(3, train_loss=0.5, acc=value)
    assert str(err.value).startswith(message)
    assert cp.get_output() == {}  # nothing of the call is logged


def test_log_accepts_numpy_and_0d_tensors_as_numbers():
    cp = Cockpit(tiny_mlp().make_model(), ["loss"])
    cp.log(
        0,
        a=np.float32(0.1),
        b=np.array(2.5),
        c=torch.tensor(3, dtype=torch.int64),
        d=torch.tensor(0.5, requires_grad=True) * 2,
        e=float("nan"),
    )
    metrics = cp.get_output()[0]["metrics"]
    assert metrics["a"] == float(np.float32(0.1)) and type(metrics["a"]) is float
    assert metrics["b"] == 2.5 and metrics["c"] == 3.0 and type(metrics["c"]) is float
    assert metrics["d"] == 1.0 and np.isnan(metrics["e"])


def test_log_step_and_call_errors():
    cp = Cockpit(tiny_mlp().make_model(), ["loss"])
    with pytest.raises(MisuseError, match=r"step must be an integer .*, got 1\.5\."):
        cp.log(1.5, train_loss=1.0)
    with pytest.raises(MisuseError, match="step must be an integer"):
        cp.log(True, train_loss=1.0)
    with pytest.raises(MisuseError) as err:
        cp.log(4)
    assert str(err.value) == (
        "cp.log(4) got no metrics: pass them by name, e.g. cp.log(step, epoch_count=3, "
        "train_loss=0.31, valid_accuracy=0.87)."
    )
    cp.log(np.int64(4), train_loss=1.0)
    assert list(cp.get_output()) == [4]


def test_log_inside_a_block_only_for_that_step():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model, ["loss"])
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y)
    with cp(5, info={"loss": loss}):
        loss.backward()
        cp.log(5, train_loss=loss.item())
        with pytest.raises(MisuseError) as err:
            cp.log(4, valid_loss=1.0)
    assert str(err.value) == (
        "cp.log(4, ...) called inside the `with cp(5, ...)` block: log metrics of step 4 "
        "outside that block, or pass step 5."
    )
    cp.log(4, valid_loss=1.0)  # after the block: any step
    out = cp.get_output()
    assert out[5] == {"loss": loss.item(), "metrics": {"train_loss": loss.item()}}
    assert out[4] == {"metrics": {"valid_loss": 1.0}}


def test_metrics_only_streamed_without_keep_in_memory(tmp_path):
    cp = Cockpit(tiny_mlp().make_model(), ["loss"], keep_in_memory=False, log=tmp_path / "l.jsonl")
    cp.log(3, train_accuracy=0.5)
    cp.close()
    assert cp.get_output() == {}
    assert read_run(tmp_path / "l.jsonl").metrics == {3: {"train_accuracy": 0.5}}


# -- reading logs with metrics and additions ----------------------------------------------


def _write_lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_later_run_that_logs_only_metrics_keeps_the_earlier_runs_values(tmp_path):
    header = {"kind": "header", "quantities": [{"name": "loss", "key": "loss"}]}
    path = _write_lines(
        tmp_path / "log.jsonl",
        [
            {**header, "run": 1},
            {"kind": "values", "step": 3, "values": {"loss": 1.5}},
            {"kind": "metrics", "step": 3, "metrics": {"valid_loss": 2.0, "epoch_count": 1}},
            {**header, "run": 2},  # resumed: evaluates again at step 3, then trains on
            {"kind": "metrics", "step": 3, "metrics": {"valid_loss": 1.9}},
            {"kind": "values", "step": 4, "values": {"loss": 1.2}},
            {"kind": "quantity_added", "step": 5, "quantity": {"name": "time", "key": "time"}},
        ],
    )
    data = read_run(path)
    assert data.output == {3: {"loss": 1.5, "metrics": {"valid_loss": 1.9}}, 4: {"loss": 1.2}}
    assert data.added == [{"step": 5, "quantity": {"name": "time", "key": "time"}}]
    assert data.header["quantities"][-1] == {"name": "time", "key": "time", "added_at": 5}
    assert data.headers[0]["quantities"] == [{"name": "loss", "key": "loss"}]


@pytest.mark.parametrize(
    "record, message",
    [
        ({"kind": "metrics", "step": "3", "metrics": {}}, "line 2: 'step' must be an integer"),
        ({"kind": "metrics", "step": 3, "metrics": [1]}, "line 2: 'metrics' must be a JSON object"),
        (
            {"kind": "quantity_added", "step": 3, "quantity": {"name": "loss"}},
            "line 2: 'quantity' must be a JSON object with string 'name' and 'key'",
        ),
        ({"kind": "quantity_added", "quantity": {}}, "line 2: 'step' must be an integer"),
    ],
)
def test_malformed_metrics_and_addition_records_are_refused(tmp_path, record, message):
    path = _write_lines(tmp_path / "log.jsonl", [{"kind": "header"}, record])
    with pytest.raises(LogFormatError, match=message):
        read_run(path)
