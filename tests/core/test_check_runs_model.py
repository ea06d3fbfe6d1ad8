"""`cp.check(model, sample=...)` and `cockpit check` with a batch run one real tracked step.

Without a sample the report comes from the providers' `supports()` answers; with one,
cockpit runs the Cockpit's quantities for one step on a copy of the model and reports
what each quantity and provider actually did.
"""

from __future__ import annotations

import copy
import textwrap
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cockpit_core import Cockpit, MisuseError, Registry, hookimpl
from cockpit_core.cli.main import main
from cockpit_core.statistics.func import FuncProvider


class BatchOnDim1(nn.Module):
    """Feeds its first layer ``[T, B, d]``: supports() cannot see it, the step fails."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):  # x: [B, T, 4]
        return self.head(self.lin(x.transpose(0, 1)).mean(0))


def _batch_on_dim1():
    torch.manual_seed(0)
    return BatchOnDim1(), torch.randn(6, 5, 4), torch.randint(3, (6,))


def _mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    return model, torch.randn(7, 5), torch.randint(3, (7,))


def _group_of(report, name):
    (group,) = [p for p in report.params if name in p.names]
    return group


def _quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call(*args, **kwargs)


# -- (a) a model that passes supports() and fails at the step --------------------------------


def test_a_model_that_fails_at_the_step_is_ok_without_a_sample_and_not_with_one():
    model, x, y = _batch_on_dim1()
    cp = _quiet(Cockpit, model, ["grad_norm", "norm_test"])
    before = cp.check(model)
    assert before.ok and before.sample is None  # no forward pass: the modules look fine

    report = cp.check(model, sample=(x, y), loss="cross_entropy")
    assert not report.ok and report.sample is not None and report.sample.ran
    outcomes = {q.quantity: q for q in report.sample.quantities}
    assert outcomes["grad_norm"].state == "value"
    assert outcomes["norm_test"].state == "error"
    group = _group_of(report, "lin.weight")
    assert group.providers == (("batch_l2", None),)  # delivered by none
    assert _group_of(report, "head.weight").providers == (("batch_l2", "hooks"),)

    # the note is the message a real training step records, which names the fix
    twin, tx, ty = _batch_on_dim1()
    cp_twin = _quiet(Cockpit, twin, ["norm_test"])
    loss = F.cross_entropy(twin(tx), ty)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cp_twin(0, info={"loss": loss, "batch_size": len(tx)}):
            loss.backward()
    (error,) = cp_twin.errors
    (note,) = group.notes
    provider, message = note.split(": ", 1)
    assert provider == "hooks" and "'lin.weight'" in message and message in error["error"]
    text = str(report)
    assert message in text and "result: NOT OK" in text and "'lin.weight'" in text


def _write_models(tmp_path):
    (tmp_path / "check_models.py").write_text(
        textwrap.dedent(
            """
            import torch
            import torch.nn.functional as F
            from torch import nn


            class BatchOnDim1(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lin = nn.Linear(4, 4)
                    self.head = nn.Linear(4, 3)

                def forward(self, x):
                    return self.head(self.lin(x.transpose(0, 1)).mean(0))


            def failing_sample():
                torch.manual_seed(0)
                x, y = torch.randn(6, 5, 4), torch.randint(3, (6,))
                return BatchOnDim1(), lambda m: F.cross_entropy(m(x), y, reduction="none")


            def failing_batch():
                torch.manual_seed(0)
                return BatchOnDim1(), (torch.randn(6, 5, 4), torch.randint(3, (6,)))


            def mlp_batch():
                torch.manual_seed(0)
                model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
                return model, (torch.randn(7, 5), torch.randint(3, (7,)))


            def mlp():
                return nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 3))


            class Tokens(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.emb = nn.Embedding(20, 8)
                    self.out = nn.Linear(8, 20)

                def forward(self, ids):
                    return self.out(self.emb(ids))


            def tokens():
                return Tokens()
            """
        )
    )
    return tmp_path / "check_models.py"


def test_cli_exits_1_naming_the_parameter_and_the_fix(tmp_path, capsys):
    path = _write_models(tmp_path)
    assert _quiet(main, ["check", f"{path}:failing_sample", "--quantities", "norm_test"]) == 1
    out = capsys.readouterr().out
    assert "norm_test  ERROR" in out and "none: parameter(s) 'lin.weight', 'lin.bias'" in out
    assert "module hooks need the batch on dimension 0" in out
    assert out.rstrip().splitlines()[-1].startswith("result: NOT OK")
    # without the sample: no forward pass, as before
    assert _quiet(main, ["check", f"{path}:BatchOnDim1", "--quantities", "norm_test"]) == 0


def test_cli_with_loss_lets_torch_func_recompute_what_hooks_left_empty(tmp_path, capsys):
    path = _write_models(tmp_path)
    argv = ["check", f"{path}:failing_batch", "--quantities", "norm_test"]
    assert _quiet(main, [*argv, "--loss", "cross_entropy"]) == 0  # as cp.attach(model, loss)
    out = capsys.readouterr().out
    assert "func: parameter(s) 'lin.weight', 'lin.bias'" in out
    assert "hooks left it empty at the step" in out and "func recomputed it" in out
    assert _quiet(main, [*argv, "--loss", "cross_entropy", "--backend", "hooks"]) == 1
    assert "module hooks need the batch on dimension 0" in capsys.readouterr().out


# -- (b) a model that works: ok, and nothing of the user's changes ----------------------------


def test_an_mlp_is_ok_and_the_model_optimizer_and_rng_are_untouched():
    model, x, y = _mlp()
    twin = copy.deepcopy(model)
    cp = _quiet(Cockpit, model, "economy")
    cp_twin = _quiet(Cockpit, twin, "economy")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)

    def step(cockpit, net, optimizer, number):
        optimizer.zero_grad()
        losses = F.cross_entropy(net(x), y, reduction="none")
        loss = losses.mean()
        info = {"loss": loss, "individual_losses": losses.detach(), "batch_size": len(x)}
        with cockpit(number, info={**info, "optimizer": optimizer}):
            loss.backward(retain_graph=cockpit.retain_graph(number))
        optimizer.step()

    step(cp, model, opt, 0)
    step(cp_twin, twin, opt_twin, 0)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    state = copy.deepcopy(opt.state_dict())
    rng = torch.random.get_rng_state()

    report = cp.check(model, sample=(x, y), loss="cross_entropy", optimizer=opt)
    assert report.ok, str(report)
    states = {q.quantity: q.state for q in report.sample.quantities}
    assert states["loss"] == states["norm_test"] == states["optimizer_hparams"] == "value"
    assert states["alpha"] == states["update_size"] == "started"
    assert report.sample.batch_size == 7 and report.sample.forward_passes == 1
    assert all(p.notes == () for p in report.params)
    assert str(report).endswith("result: ok (the sample step computed every quantity)")

    for n, p in model.named_parameters():
        assert torch.equal(p, params[n]) and torch.equal(p.grad, grads[n])
    assert str(opt.state_dict()) == str(state)
    assert torch.equal(torch.random.get_rng_state(), rng)
    # the user's Cockpit goes on as if check had not run (nothing logged, same values)
    step(cp, model, opt, 1)
    step(cp_twin, twin, opt_twin, 1)
    assert str(cp.get_output()) == str(cp_twin.get_output())
    assert cp.errors == cp_twin.errors == []


def test_backpack_curvature_runs_from_the_named_or_the_training_loss_module():
    pytest.importorskip("cockpit_backpack")
    from cockpit_backpack import extend

    model, x, y = _mlp()
    model = extend(model)
    cp = _quiet(Cockpit, model, ["tic_diag", "hess_trace", "alpha"])
    for loss in ("cross_entropy", extend(nn.CrossEntropyLoss())):
        report = _quiet(cp.check, model, sample=(x, y), loss=loss)
        assert report.ok, str(report)
        assert dict(_group_of(report, "0.weight").providers)["diag_hessian"] == "backpack"
        states = {q.quantity: q.state for q in report.sample.quantities}
        assert states == {"tic_diag": "value", "hess_trace": "value", "alpha": "started"}


def test_cli_with_a_batch_or_a_random_batch_exits_0(tmp_path, capsys):
    path = _write_models(tmp_path)
    assert _quiet(main, ["check", f"{path}:mlp_batch", "--loss", "cross_entropy"]) == 0
    assert "result: ok" in capsys.readouterr().out
    argv = ["check", f"{path}:mlp", "--input-shape", "3,4", "--loss", "cross_entropy"]
    assert _quiet(main, argv) == 0
    assert "(1 forward pass, batch of 4)" in capsys.readouterr().out
    argv = ["check", f"{path}:tokens", "--vocab", "20", "--seq-len", "6", "--batch", "3"]
    assert _quiet(main, [*argv, "--loss", "cross_entropy", "--quantities", "norm_test"]) == 0
    out = capsys.readouterr().out
    assert "batch of 3" in out and "parameter(s) 'emb.weight'" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--input-shape", "3,4"], "a batch needs --loss"),
        (["--vocab", "20", "--loss", "mse"], "token ids need both --vocab V and --seq-len T"),
        (["--input-shape", "0,4"], "expected sizes of at least 1"),
    ],
)
def test_cli_batch_options_are_checked(tmp_path, capsys, extra, message):
    path = _write_models(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["check", f"{path}:mlp", *extra])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_samples_as_callables_and_inputs_alone():
    model, x, y = _mlp()
    cp = _quiet(Cockpit, model, ["loss", "alpha", "norm_test"])
    per_sample = cp.check(model, sample=lambda m: F.cross_entropy(m(x), y, reduction="none"))
    assert per_sample.ok and per_sample.sample.batch_size == 7
    mean = cp.check(model, sample=lambda m: F.cross_entropy(m(x), y))
    assert mean.ok and mean.sample.batch_size == 7  # from the forward pass's input
    (alpha,) = [q for q in mean.sample.quantities if q.quantity == "alpha"]
    assert alpha.state == "not run" and "per-sample losses [B]" in alpha.message
    assert cp.check(model, sample=x, loss="mse").ok  # random targets for the named loss
    with pytest.raises(MisuseError, match="needs the loss of the batch"):
        cp.check(model, sample=(x, y))
    with pytest.raises(MisuseError, match="loss= is for a batch"):
        cp.check(model, sample=lambda m: m(x).sum(), loss="mse")


def test_a_failing_sample_is_reported_not_raised():
    model, x, y = _mlp()
    cp = _quiet(Cockpit, model, ["loss"])
    report = cp.check(model, sample=(torch.randn(7, 6), y), loss="cross_entropy")
    assert not report.ok and not report.sample.ran
    assert "RuntimeError" in report.sample.error and "sample step: FAILED" in str(report)


# -- (c) a transformers GPT-2 ---------------------------------------------------------------


def test_gpt2_report_lists_every_parameter_after_a_real_forward_pass():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=24, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    calls = []
    model.register_forward_hook(lambda *args: calls.append(1))  # deep-copied with the model
    ids = torch.randint(40, (3, 8))

    def per_sequence(m):
        logits = m(input_ids=ids).logits[:, :-1]
        return F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").mean(1)

    cp = _quiet(Cockpit, model, "economy")
    report = _quiet(cp.check, model, sample=per_sequence)
    assert calls == [1] and report.sample.ran and report.sample.forward_passes == 1
    assert report.sample.batch_size == 3
    names = [n for p in report.params for n in p.names]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert sorted(names) == sorted(trainable)  # every parameter once, tied weights once
    for group in report.params:  # a provider for every statistic, or the reason why not
        assert all(provider is not None for _, provider in group.providers) or group.notes
    assert {q.quantity for q in report.sample.quantities} == {q.key for q in cp.quantities}
    text = str(report)
    assert all(group.label in text for group in report.params)

    calls.clear()
    mean = _quiet(cp.check, model, sample=lambda m: m(input_ids=ids, labels=ids).loss)
    assert calls == [1] and mean.sample.ran  # the Hugging Face loss of the batch
    (alpha,) = [q for q in mean.sample.quantities if q.quantity == "alpha"]
    assert alpha.state == "not run"


# -- (d) a provider's describe() ------------------------------------------------------------


class DescribedFunc(FuncProvider):
    """``torch.func``, preferred to every other provider, that says how it serves."""

    name = "described_func"
    cost = 0.001

    def describe(self, slot):
        return f"test rule of {slot.attribute}" if slot.attribute == "weight" else ""


@hookimpl
def _register_described(register):
    register(DescribedFunc)


def test_describe_answers_follow_the_provider_name(monkeypatch):
    registry = Registry.from_entry_points()
    plugin = types.SimpleNamespace(register_statistic_providers=_register_described)
    assert registry.add_plugin(plugin, name="described").ok
    model, x, y = _mlp()
    cp = _quiet(Cockpit, model, ["norm_test"], registry=registry)
    cp.attach(model, nn.CrossEntropyLoss(reduction="none"))
    for report in (cp.check(model), cp.check(model, sample=(x, y))):
        (group,) = report.params
        assert group.label == "described_func"  # the biases' answer is ""
        assert group.how == (
            ("0.weight", "described_func", "test rule of weight"),
            ("2.weight", "described_func", "test rule of weight"),
        )
        assert (
            "  described_func: all 4 parameters\n"
            "      described_func (test rule of weight): parameter(s) '0.weight', '2.weight'"
        ) in str(report)
    assert report.ok and report.sample is not None

    monkeypatch.setattr(DescribedFunc, "describe", lambda self, slot: "one rule\nmore")
    for report in (cp.check(model), cp.check(model, sample=(x, y))):
        (group,) = report.params
        assert group.label == "described_func (one rule)"  # the same for all: inline
        assert group.served == "described_func"
        assert "  described_func (one rule): all 4 parameters" in str(report)
