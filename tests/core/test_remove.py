"""Changing a run: ``cp.remove(key)``, and ``cp.add`` of a quantity whose ``info`` is missing.

Neither stops training: a removed quantity stops from the next step on (its pending
two-step start dropped, the providers armed for the rest), and an added quantity whose
needs cannot be met records an error at each step it would run, saying what to pass.
"""

from __future__ import annotations

import pytest
import torch

from cockpit_core import Cockpit, CockpitWarning, MissingInfoError, MisuseError
from cockpit_core.log import read_records, read_run
from cockpit_core.testing import tiny_mlp


def plain_model():
    """The tiny MLP without BackPACK (only cockpit's own hooks on it)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)
    ).double()


def forward_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def run(cp, model, steps, loss_fn=None, between=None):
    """Train ``steps`` with the short form; call ``between(step)`` before each step."""
    problem = tiny_mlp()
    loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in steps:
        if between is not None:
            between(step)
        x, y = problem.batch(step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        with cp(step, loss=loss):
            loss.backward()
        opt.step()


# -- cp.add of a quantity whose info cannot be met ---------------------------------------


@pytest.mark.parametrize("on_error, errors", [("warn", [2, 3, 4]), ("disable", [2])])
def test_an_added_quantity_without_its_info_records_errors_and_training_continues(
    tmp_path, on_error, errors
):
    # the measured case: alpha added mid-run to a Cockpit that knows no loss function
    log = tmp_path / "log.jsonl"
    model = plain_model()
    cp = Cockpit(model, ["loss", "grad_norm"], on_error=on_error, log=log)
    add = lambda step: cp.add("alpha") if step == 2 else None  # noqa: E731
    with pytest.warns(CockpitWarning, match="'alpha' failed at step 2"):
        run(cp, model, range(5), between=add)
    cp.close()
    assert [(e["step"], e["quantity"], e["phase"]) for e in cp.errors] == [
        (s, "alpha", "info") for s in errors
    ]
    assert cp.errors[0]["error"].startswith(
        "MissingInfoError: 'alpha' (added with cp.add) needs info['individual_losses'] "
        "(cockpit knows no loss function): give cockpit the loss, Cockpit(model, ..., "
        "loss_fn=...) or cp.attach(model, loss_fn): "
    )
    assert "or pass info={'individual_losses': losses}" in cp.errors[0]["error"]
    out = cp.get_output()
    assert all(set(out[s]) == {"loss", "grad_norm"} for s in range(5))
    assert [r["step"] for r in read_run(log).errors] == errors


def test_an_added_quantity_raises_only_with_on_error_raise():
    model = plain_model()
    cp = Cockpit(model, ["loss"], on_error="raise")
    cp.add("alpha")
    with pytest.raises(MissingInfoError, match="'alpha' .added with cp.add. needs"):
        run(cp, model, range(1))


def test_with_info_alone_added_quantities_record_and_constructor_ones_raise():
    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model, ["loss"])
    loss_fn = problem.loss_module()
    for step in range(3):
        if step == 1:
            cp.add("alpha")
        x, y = problem.batch(step)
        loss = loss_fn(model(x), y)
        with pytest.warns(CockpitWarning) if step == 1 else _nothing():
            with cp(step, info={"loss": loss}):
                loss.backward()
    assert [(e["step"], e["quantity"]) for e in cp.errors] == [(1, "alpha"), (2, "alpha")]
    assert "needs info['batch_size'] and info['individual_losses']" in cp.errors[0]["error"]
    fresh = Cockpit(model, ["alpha"])  # given to the constructor: the existing contract
    loss = loss_fn(model(x), y)
    with pytest.raises(MissingInfoError, match="'alpha' needs info"):
        with fresh(0, info={"loss": loss}):
            loss.backward()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


# -- cp.remove ---------------------------------------------------------------------------


def test_a_removed_quantity_stops_from_the_next_step_and_the_log_says_when(tmp_path):
    log = tmp_path / "log.jsonl"
    model = plain_model()
    cp = Cockpit(model, ["loss", "grad_norm", "update_size"], log=log)

    def change(step):
        if step == 3:
            assert cp.remove("update_size").key == "update_size"  # pending since step 2
            cp.add({"name": "grad_norm", "label": "gn"})
        if step == 4:
            cp.remove("gn")

    run(cp, model, range(6), between=change)
    cp.close()
    out = cp.get_output()
    assert [s for s in out if "update_size" in out[s]] == [0, 1]  # the start at 2 dropped
    assert [s for s in out if "gn" in out[s]] == [3]
    assert all({"loss", "grad_norm"} <= set(out[s]) for s in range(6))
    assert [q.key for q in cp.quantities] == ["loss", "grad_norm"]
    assert cp.errors == [] and cp.skipped == []
    removed = [r for r in read_records(log) if r["kind"] == "quantity_removed"]
    assert removed == [
        {
            "kind": "quantity_removed",
            "step": 3,
            "quantity": {"name": "update_size", "key": "update_size"},
        },
        {
            "kind": "quantity_removed",
            "step": 4,
            "quantity": {"name": "grad_norm", "key": "gn", "label": "gn"},
        },
    ]
    data = read_run(log)
    listed = [
        {"name": "loss", "key": "loss"},
        {"name": "grad_norm", "key": "grad_norm"},
        {"name": "update_size", "key": "update_size", "removed_at": 3},
        {"name": "grad_norm", "key": "gn", "label": "gn", "added_at": 3, "removed_at": 4},
    ]
    assert data.header["quantities"] == listed
    assert cp.header()["quantities"] == listed
    assert data.removed == [{"step": r["step"], "quantity": r["quantity"]} for r in removed]
    written = read_run(cp.write(tmp_path / "out.json"))
    assert written.header["quantities"] == listed and written.removed == data.removed


def test_removing_and_adding_again_starts_afresh():
    model = plain_model()
    cp = Cockpit(model, ["loss", "distance"])

    def change(step):
        if step == 3:
            cp.remove("distance")
        if step == 4:
            cp.add("distance")

    run(cp, model, range(6), between=change)
    out = cp.get_output()
    assert [s for s in out if "distance" in out[s]] == [0, 1, 2, 4, 5]
    assert out[2]["distance"]["total"] > 0
    assert out[4]["distance"]["total"] == 0.0  # its origin: step 4
    assert cp.header()["quantities"][1:] == [
        {"name": "distance", "key": "distance", "removed_at": 3},
        {"name": "distance", "key": "distance", "added_at": 4},
    ]


def test_the_providers_are_armed_for_the_remaining_quantities():
    model = plain_model()
    cp = Cockpit(model, ["loss", "norm_test", "hess_max_ev"], loss_fn=torch.nn.CrossEntropyLoss())
    run(cp, model, range(2))
    assert forward_hooks(model) > 0 and cp.retain_graph(2)
    cp.remove("norm_test")
    cp.remove("hess_max_ev")
    assert not cp.retain_graph(2)
    assert forward_hooks(model) == 0  # nothing observes the next forward pass
    with pytestwarns_none():
        run(cp, model, range(2, 4))
    assert all(set(v) == {"loss"} for s, v in cp.get_output().items() if s >= 2)


def pytestwarns_none():
    import warnings

    catcher = warnings.catch_warnings()
    catcher.__enter__()
    warnings.simplefilter("error", CockpitWarning)
    return _Exit(catcher)


class _Exit:
    def __init__(self, catcher):
        self.catcher = catcher

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.catcher.__exit__(*args)
        return False


def test_remove_is_refused_inside_a_block_and_for_unknown_keys():
    model = plain_model()
    cp = Cockpit(model, ["loss", {"name": "grad_norm", "label": "gn"}])
    with pytest.raises(MisuseError) as err:
        cp.remove("grad_norm")
    assert str(err.value) == (
        "cp.remove('grad_norm'): no tracked quantity has that key; tracked: loss, gn."
    )
    x, y = tiny_mlp().batch(0)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    with cp(0, loss=loss):
        loss.backward()
        with pytest.raises(MisuseError, match=r"inside the `with cp\(0, ...\)` block"):
            cp.remove("gn")
    assert [q.key for q in cp.quantities] == ["loss", "gn"]
