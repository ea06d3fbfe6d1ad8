"""One line in a plain loop: ``with cp(step, loss=loss): loss.backward()``.

Cockpit, given the model, the loss and the optimizer, observes the batch size, the targets
and the per-sample losses of each step and keeps the graph for Hessian-vector products
itself; every run here equals the same run with the explicit ``info`` dict and
``retain_graph=cp.retain_graph(step)``.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cockpit_core import Cockpit, MissingInfoError, MisuseError, Quantity, Requirements
from cockpit_core.observe import ForwardObserver
from cockpit_core.testing import tiny_mlp
from cockpit_core.testing.models import NanoGPT

QUANTITIES = ["economy", "hess_max_ev"]


def assert_same(a, b, path="output"):
    """Nested values equal in float64 to ``rtol=1e-6``; histogram counts within 4."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (path, sorted(a), sorted(b))
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif a is None or isinstance(a, (str, bool)):
        assert a == b, path
    else:
        x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if "hist" in path and "edges" not in path:
            assert x.shape == y.shape and np.abs(x - y).max(initial=0.0) <= 4, path
        else:
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-12, err_msg=path)


def batches(steps, batch=8, width=6, classes=3):
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(batch, width, generator=gen, dtype=torch.float64)
        yield x, torch.randint(classes, (batch,), generator=gen)


def token_batches(steps, batch=6, length=16, vocab=40):
    gen = torch.Generator().manual_seed(2)
    for _ in range(steps):
        yield (
            torch.randint(vocab, (batch, length), generator=gen),
            torch.randint(vocab, (batch, length), generator=gen),
        )


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()


# -- (a) an MLP classifier with nn.CrossEntropyLoss() -----------------------------------------


def mlp_run(one_line, steps=4):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    if one_line:
        cp = Cockpit(model, QUANTITIES, loss_fn=loss_fn, optimizer=opt)
    else:
        cp = Cockpit(model, QUANTITIES)
    for step, (x, y) in enumerate(batches(steps)):
        opt.zero_grad()
        outputs = model(x)
        loss = loss_fn(outputs, y)
        if one_line:
            with cp(step, loss=loss):
                loss.backward()
        else:
            losses = F.cross_entropy(outputs, y, reduction="none").detach()
            info = {
                "loss": loss,
                "individual_losses": losses,
                "batch_size": len(x),
                "optimizer": opt,
            }
            with cp(step, info=info):
                loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return cp


def test_mlp_with_its_loss_module_equals_the_explicit_info():
    explicit, one_line = mlp_run(False), mlp_run(True)
    assert explicit.errors == [] and one_line.errors == []
    assert_same(explicit.get_output(), one_line.get_output())
    keys = set(one_line.get_output()[1])
    assert {"alpha", "hess_max_ev", "norm_test", "grad_hist_1d", "optimizer_hparams"} <= keys


# -- (b) nanoGPT: model(idx, targets) -> (logits, loss) ----------------------------------------


def nanogpt_run(one_line, steps=3):
    torch.manual_seed(0)
    model = NanoGPT().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if one_line:
        cp = Cockpit(model, QUANTITIES, loss_fn="cross_entropy", optimizer=opt)
    else:
        cp = Cockpit(model, QUANTITIES)
    for step, (idx, targets) in enumerate(token_batches(steps)):
        opt.zero_grad()
        logits, loss = model(idx, targets)
        if one_line:
            with cp(step, loss=loss):
                loss.backward()
        else:  # every sequence keeps all its tokens: the token mean per sequence
            ce = F.cross_entropy(logits.movedim(-1, 1), targets, reduction="none")
            losses = ce.mean(1).detach()
            info = {
                "loss": loss,
                "individual_losses": losses,
                "batch_size": len(idx),
                "optimizer": opt,
            }
            with cp(step, info=info):
                loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return cp


def test_nanogpt_with_a_named_loss_equals_the_explicit_info():
    explicit, one_line = nanogpt_run(False), nanogpt_run(True)
    assert explicit.errors == [] and one_line.errors == []
    assert_same(explicit.get_output(), one_line.get_output())
    assert "alpha" in one_line.get_output()[1] and "hess_max_ev" in one_line.get_output()[0]


# -- (c) a transformers GPT-2 with labels= and its own .loss ------------------------------------


def gpt2_run(one_line, steps=3):
    from cockpit_core.testing.models import tiny_gpt2

    model = tiny_gpt2().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if one_line:
        cp = Cockpit(model, QUANTITIES, loss_fn="causal_lm", optimizer=opt)
    else:
        cp = Cockpit(model, QUANTITIES)
    for step, (ids, _) in enumerate(token_batches(steps)):
        opt.zero_grad()
        out = model(input_ids=ids, labels=ids)
        loss = out.loss
        if one_line:
            with cp(step, loss=loss):
                loss.backward()
        else:  # next-token prediction, no label ignored: the token mean per sequence
            ce = F.cross_entropy(out.logits[:, :-1].movedim(-1, 1), ids[:, 1:], reduction="none")
            losses = ce.mean(1).detach()
            info = {
                "loss": loss,
                "individual_losses": losses,
                "batch_size": len(ids),
                "optimizer": opt,
            }
            with cp(step, info=info):
                loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return cp


def test_gpt2_with_labels_and_its_own_loss_equals_the_explicit_info():
    pytest.importorskip("transformers")
    explicit, one_line = gpt2_run(False), gpt2_run(True)
    assert explicit.errors == [] and one_line.errors == []
    assert_same(explicit.get_output(), one_line.get_output())
    assert "alpha" in one_line.get_output()[1]


# -- what a step receives ----------------------------------------------------------------------


class Seen(Quantity):
    """Records what ``info`` held at each step."""

    name = "seen"
    REQUIREMENTS = Requirements(
        info={"loss", "individual_losses", "batch_size", "optimizer", "targets"}
    )

    def compute(self, ctx):
        info = ctx.info
        return {
            "loss": float(info["loss"].detach()),
            "losses": info["individual_losses"].detach().double().numpy(),
            "requires_grad": bool(info["individual_losses"].requires_grad),
            "batch_size": int(info["batch_size"]),
            "optimizer": info["optimizer"] is self.opt,
            "targets": info["targets"],
        }


def seen(opt):
    q = Seen()
    q.opt = opt
    return q


def test_explicit_info_wins_key_by_key():
    model = mlp()
    opt, other = (torch.optim.SGD(model.parameters(), lr=0.1) for _ in range(2))
    loss_fn = nn.CrossEntropyLoss()
    cp = Cockpit(model, [seen(opt)], loss_fn=loss_fn, optimizer=other, on_error="raise")
    x, y = next(batches(1))
    loss = loss_fn(model(x), y)
    mine = torch.arange(8, dtype=torch.float64)
    with pytest.warns(Warning, match="is not the mean of info\\['individual_losses'\\]"):
        with cp(0, loss=loss, info={"individual_losses": mine, "optimizer": opt}):
            loss.backward()
    value = cp.get_output()[0]["seen"]
    np.testing.assert_array_equal(value["losses"], mine.numpy())  # given: it wins
    assert value["optimizer"] and value["batch_size"] == 8  # observed where not given
    assert value["loss"] == loss.item()


def test_observed_per_sample_losses_are_detached_and_average_to_the_loss():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    cp = Cockpit(model, [seen(opt)], loss_fn=loss_fn, optimizer=opt, on_error="raise")
    x, y = next(batches(1))
    outputs = model(x)
    loss = loss_fn(outputs, y)
    with torch.no_grad():
        model(torch.randn(3, 6, dtype=torch.float64))  # an evaluation: not the step's pass
    with cp(0, loss=loss):
        loss.backward()
    value = cp.get_output()[0]["seen"]
    expected = F.cross_entropy(outputs, y, reduction="none").detach().numpy()
    np.testing.assert_allclose(value["losses"], expected, rtol=1e-12)
    assert not value["requires_grad"] and value["batch_size"] == 8 and value["optimizer"]
    np.testing.assert_allclose(value["losses"].mean(), loss.item(), rtol=1e-12)
    np.testing.assert_array_equal(value["targets"], y.numpy())


def lm_losses(logits, targets, **options):
    """The explicit definition: ``l_n = (B / D) sum_t ce_nt`` (``D``: what the mean divides by)."""
    flat_logits, flat_targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    ce = F.cross_entropy(flat_logits, flat_targets, reduction="none", **options)
    ignore = options.get("ignore_index", -100)
    kept = flat_targets != ignore
    weight = options.get("weight")
    count = kept.sum() if weight is None else weight[flat_targets[kept]].sum()
    return ce.reshape(len(logits), -1).sum(1) * (len(logits) / count.double())


@pytest.mark.parametrize(
    "options",
    [{}, {"ignore_index": -1}, {"label_smoothing": 0.1, "ignore_index": -1}, {"weight": True}],
    ids=["plain", "ignore", "smoothing", "weight"],
)
def test_a_loss_module_on_flattened_tokens_honours_its_options(options):
    torch.manual_seed(0)
    model = NanoGPT().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if options.get("weight"):
        options = {"weight": torch.rand(40, dtype=torch.float64) + 0.5}
    loss_fn = nn.CrossEntropyLoss(**options)
    cp = Cockpit(model, [seen(opt)], loss_fn=loss_fn, optimizer=opt, on_error="raise")
    idx, targets = next(token_batches(1))
    if "ignore_index" in options:
        targets[0, :5] = -1  # sequences keep different numbers of tokens
    logits, _ = model(idx)
    loss = loss_fn(logits.view(-1, logits.shape[-1]), targets.view(-1))
    with cp(0, loss=loss):
        loss.backward()
    value = cp.get_output()[0]["seen"]
    expected = lm_losses(logits.detach(), targets, **options).numpy()
    np.testing.assert_allclose(value["losses"], expected, rtol=1e-10)
    np.testing.assert_allclose(value["losses"].mean(), loss.item(), rtol=1e-10)
    np.testing.assert_array_equal(value["targets"], targets.numpy())  # shaped [B, T] again


def test_a_functional_loss_on_a_view_of_the_outputs_gives_the_targets():
    torch.manual_seed(0)
    model = NanoGPT().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [seen(opt)], loss_fn="cross_entropy", optimizer=opt, on_error="raise")
    idx, targets = next(token_batches(1))
    targets[1, 3:] = -1  # sequences keep different numbers of tokens
    logits, _ = model(idx)
    vocab = logits.size(-1)
    loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1), ignore_index=-1)
    with cp(0, loss=loss):
        loss.backward()
    value = cp.get_output()[0]["seen"]
    expected = lm_losses(logits.detach(), targets, ignore_index=-1).numpy()
    np.testing.assert_allclose(value["losses"], expected, rtol=1e-10)
    np.testing.assert_allclose(value["losses"].mean(), loss.item(), rtol=1e-10)


def test_a_callable_loss_gets_the_outputs_and_the_targets_of_the_call():
    torch.manual_seed(0)
    model = NanoGPT().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def per_sequence(outputs, targets):
        logits = outputs[0]
        return F.cross_entropy(logits.movedim(-1, 1), targets, reduction="none").mean(1)

    cp = Cockpit(model, [seen(opt)], loss_fn=per_sequence, optimizer=opt, on_error="raise")
    idx, targets = next(token_batches(1))
    logits, loss = model(idx, targets)
    with cp(0, loss=loss):
        loss.backward()
    expected = per_sequence((logits.detach(),), targets).numpy()
    np.testing.assert_allclose(cp.get_output()[0]["seen"]["losses"], expected, rtol=1e-12)


def test_torch_func_gets_the_observed_inputs_and_targets():
    quantities = ["norm_test", "inner_test", "alpha", "grad_hist_1d"]

    def run(one_line):
        problem = tiny_mlp()
        model = problem.make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_fn = nn.CrossEntropyLoss()
        if one_line:
            cp = Cockpit(model, quantities, loss_fn=loss_fn, optimizer=opt, backend="func")
        else:
            cp = Cockpit(model, quantities, backend="func").attach(model, loss_fn)
        for step in range(3):
            x, y = problem.batch(step)
            opt.zero_grad()
            outputs = model(x)
            loss = loss_fn(outputs, y)
            if one_line:
                with cp(step, loss=loss):
                    loss.backward()
            else:
                losses = F.cross_entropy(outputs, y, reduction="none").detach()
                info = {"loss": loss, "individual_losses": losses, "batch_size": len(x)}
                info.update(optimizer=opt, inputs=x, targets=y)
                with cp(step, info=info):
                    loss.backward()
            opt.step()
        return cp

    explicit, one_line = run(False), run(True)
    assert explicit.errors == [] and one_line.errors == []
    assert_same(explicit.get_output(), one_line.get_output())


# -- gradient accumulation -----------------------------------------------------------------------


def accumulation_run(form, steps=3, micro=3, scale=True):
    """``form``: "explicit" (every key in info), "one_line" (``cp(step, accumulate=True)``)
    or "micro" (the step's batch size and optimizer given, ``run.micro_batch(loss=loss)``)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    if form == "explicit":
        cp = Cockpit(model, QUANTITIES)
    else:
        cp = Cockpit(model, QUANTITIES, loss_fn=loss_fn, optimizer=opt)
    for step, (x, y) in enumerate(batches(steps, batch=12)):
        opt.zero_grad()
        if form == "one_line":
            block = cp(step, accumulate=True)
        else:
            block = cp(step, info={"batch_size": len(x), "optimizer": opt}, accumulate=True)
        with block as run:
            for xk, yk in zip(x.chunk(micro), y.chunk(micro)):
                outputs = model(xk)
                loss = loss_fn(outputs, yk) / (micro if scale else 1)
                if form != "explicit":
                    with run.micro_batch(loss=loss):
                        loss.backward()
                else:
                    losses = F.cross_entropy(outputs, yk, reduction="none").detach()
                    info = {"loss": loss, "individual_losses": losses, "batch_size": len(xk)}
                    with run.micro_batch(info):
                        loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
    return cp


@pytest.mark.parametrize("form", ["one_line", "micro"])
def test_gradient_accumulation_equals_the_explicit_info(form):
    explicit, short = accumulation_run("explicit"), accumulation_run(form)
    assert explicit.errors == [] and short.errors == []
    assert_same(explicit.get_output(), short.get_output())
    assert "alpha" in short.get_output()[1] and "norm_test" in short.get_output()[0]


def test_micro_batch_losses_scaled_wrongly_leave_the_statistics_missing():
    with pytest.warns(Warning, match="scaled for 4 samples in all, but the micro-batches held 12"):
        cp = accumulation_run("one_line", steps=1, scale=False)  # each micro-batch's mean
    failed = {e["quantity"] for e in cp.errors}
    assert "norm_test" in failed and "loss" in cp.get_output()[0]
    assert any("B_k / B" in e["error"] for e in cp.errors if e["quantity"] == "norm_test")
    # closed: after this run the Cockpit is not garbage-collected (found, not fixed: see the
    # session note), and its wishes (eager compiled code, BackPACK hooks) would outlive it
    cp.close()


# -- what cockpit cannot observe -------------------------------------------------------------------


def test_per_sample_losses_without_a_loss_fail_at_the_first_step_and_training_goes_on():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    cp = Cockpit(model, ["alpha", "grad_norm", "norm_test"], optimizer=opt)  # on_error="warn"
    with pytest.warns(Warning, match="'alpha' needs info\\['individual_losses'\\]"):
        for step, (x, y) in enumerate(batches(3)):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            with cp(step, loss=loss):
                loss.backward()
            opt.step()
    errors = [e for e in cp.errors if e["quantity"] == "alpha"]
    assert errors and errors[0]["step"] == 0 and errors[0]["phase"] == "info"
    message = errors[0]["error"]
    assert message.startswith("MissingInfoError: 'alpha' needs info['individual_losses']")
    assert "cockpit knows no loss function" in message and "loss_fn=" in message
    assert all("grad_norm" in v and "norm_test" in v for v in cp.get_output().values())
    assert len(cp.get_output()) == 3


def test_missing_info_raises_under_on_error_raise():
    model = mlp()
    cp = Cockpit(model, ["alpha"], on_error="raise")
    x, y = next(batches(1))
    loss = F.cross_entropy(model(x), y)
    with pytest.raises(MissingInfoError, match="loss_fn="):
        with cp(0, loss=loss):
            loss.backward()


def test_targets_that_cannot_be_found_are_named():
    model = mlp()
    cp = Cockpit(model, ["alpha"], loss_fn="cross_entropy", on_error="raise")
    x, y = next(batches(1))
    outputs = model(x)
    loss = -outputs.log_softmax(-1).gather(1, y[:, None]).mean()  # no loss function called
    with pytest.raises(MissingInfoError, match="cockpit found no targets"):
        with cp(0, loss=loss):
            loss.backward()


def test_a_loss_without_the_model_or_an_unknown_loss_name_is_refused():
    model = mlp()
    with pytest.raises(MisuseError, match="needs the model"):
        Cockpit(model.named_parameters(), ["alpha"], loss_fn="cross_entropy")
    with pytest.raises(MisuseError, match="unknown loss 'hinge'"):
        Cockpit(model, ["alpha"], loss_fn="hinge")
    with pytest.raises(MisuseError, match="optimizer="):
        Cockpit(model, ["alpha"], optimizer="sgd")


# -- the graph --------------------------------------------------------------------------------------


def test_the_backward_patch_lives_only_inside_blocks_that_need_the_graph():
    original = torch.autograd.backward
    model = mlp()
    loss_fn = nn.CrossEntropyLoss()
    cp = Cockpit(model, [{"name": "hess_max_ev", "every": 2}, "loss"], loss_fn=loss_fn)
    data = batches(4)
    for step in range(3):
        x, y = next(data)
        loss = loss_fn(model(x), y)
        with cp(step, loss=loss):
            patched = torch.autograd.backward is not original
            loss.backward()
        assert patched == (step % 2 == 0)
        assert torch.autograd.backward is original
    x, y = next(data)
    loss = loss_fn(model(x), y)
    with pytest.raises(RuntimeError, match="boom"):
        with cp(4, loss=loss):
            assert torch.autograd.backward is not original
            raise RuntimeError("boom")
    assert torch.autograd.backward is original
    assert "hess_max_ev" in cp.get_output()[2] and cp.errors == []


def test_no_hook_of_cockpit_stays_on_the_model_of_untracked_steps():
    model = mlp()
    loss_fn = nn.CrossEntropyLoss()
    cp = Cockpit(model, [{"name": "norm_test", "every": 3}], loss_fn=loss_fn, backend="func")

    def observer_hooks():
        hooks = [*model._forward_pre_hooks.values(), *model._forward_hooks.values()]
        hooks += list(loss_fn._forward_hooks.values())
        return [h for h in hooks if isinstance(getattr(h, "__self__", None), ForwardObserver)]

    for step, (x, y) in enumerate(batches(7)):
        assert bool(observer_hooks()) == (step % 3 == 0), step
        model.zero_grad()
        loss = loss_fn(model(x), y)
        with cp(step, loss=loss):
            loss.backward()
    cp.close()
    assert observer_hooks() == [] and cp.errors == []


def test_a_compiled_model_runs_compiled_on_untracked_steps_and_equals_eager():
    dynamo = pytest.importorskip("torch._dynamo")
    gc.collect()  # Cockpits of earlier tests, never closed, withdraw their wish for eager code
    assert dynamo.eval_frame._stance.stance == "default"

    def run(compiled):
        dynamo.reset()
        torch.manual_seed(0)
        model = NanoGPT(d=16, layers=1).double()
        forward = torch.compile(model, backend="aot_eager") if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        quantities = [
            {"name": "norm_test", "every": 2},
            {"name": "hess_max_ev", "every": 2, "tol": 1e-6},
            Seen(schedule=lambda step: step % 2 == 0),
        ]
        quantities[-1].opt = opt
        cp = Cockpit(forward, quantities, loss_fn="cross_entropy", optimizer=opt, on_error="raise")
        start = dynamo.utils.counters["stats"]["unique_graphs"]
        graphs = []
        for step, (idx, targets) in enumerate(token_batches(6, batch=4, length=8)):
            opt.zero_grad()
            _, loss = forward(idx, targets)
            with cp(step, loss=loss):
                loss.backward()
            opt.step()
            graphs.append(dynamo.utils.counters["stats"]["unique_graphs"] - start)
        cp.close()
        return cp.get_output(), graphs

    eager, _ = run(False)
    compiled, graphs = run(True)
    assert sorted(compiled) == [0, 2, 4]
    for step in compiled:
        for key in ("norm_test", "seen"):
            assert_same(compiled[step][key], eager[step][key], f"{step}.{key}")
        hess = compiled[step]["hess_max_ev"]
        np.testing.assert_allclose(hess["value"], eager[step]["hess_max_ev"]["value"], rtol=1e-5)
    # the untracked steps 1, 3, 5 run the graph compiled at step 1; tracked steps add none
    assert graphs[0] == 0 and graphs[1] >= 1 and graphs[-1] == graphs[1], graphs
    assert dynamo.eval_frame._stance.stance == "default"


@pytest.mark.parametrize("prepare", [False, True])
def test_an_unexpected_step_number_is_reported_or_prepared_for(prepare):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    probe = Seen(schedule=lambda step: step in (0, 10))
    probe.opt = opt
    cp = Cockpit(model, [probe], loss_fn=loss_fn, optimizer=opt)
    for step, (x, y) in zip((0, 1, 2, 10), batches(4)):
        if prepare:
            cp.prepare(step)
        loss = loss_fn(model(x), y)
        if step == 10 and not prepare:
            with pytest.warns(Warning, match="cockpit's observer of the batch size"):
                with cp(step, loss=loss):
                    loss.backward()
            continue
        with cp(step, loss=loss):
            loss.backward()
    if prepare:
        assert cp.errors == [] and sorted(cp.get_output()) == [0, 10]
    else:
        assert sorted(cp.get_output()) == [0]
        [error] = cp.errors
        assert error["step"] == 10 and "cockpit did not watch the forward pass" in error["error"]
        assert "cp.prepare(step)" in error["error"]


def test_the_loss_and_optimizer_pass_through_from_config_and_check_leaves_the_observer_alone():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    probe = Seen()
    probe.opt = opt
    cp = Cockpit.from_config(
        {"quantities": ["norm_test"], "on_error": "raise"}, model, loss_fn=loss_fn, optimizer=opt
    )
    cp.add(probe)
    data = batches(3)
    x, y = next(data)
    report = cp.check(model, sample=(x, y), loss="cross_entropy")  # a step on a deep copy
    assert report.ok, report
    outputs = model(x)
    loss = loss_fn(outputs, y)
    cp.check(model, sample=lambda m: loss_fn(m(x[:3]), y[:3]))  # between forward and block
    with cp(0, loss=loss):
        loss.backward()
    value = cp.get_output()[0]["seen"]
    assert value["batch_size"] == 8 and value["optimizer"]
    expected = F.cross_entropy(outputs, y, reduction="none").detach().numpy()
    np.testing.assert_allclose(value["losses"], expected, rtol=1e-12)
