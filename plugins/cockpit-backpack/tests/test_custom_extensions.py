"""The user's BackPACK extensions, ``cp(step, *extensions)``, next to the quantities' needs."""

from __future__ import annotations

import gc
import warnings
from collections import Counter

import backpack
import pytest
import torch
from backpack.extensions import KFAC, KFLR, BatchGrad, DiagGGNExact, DiagGGNMC
from backpack.extensions.backprop_extension import BackpropExtension
from cockpit_backpack import extend as cockpit_extend

from cockpit_core import Cockpit, CockpitWarning, MisuseError, Registry, RequirementConflictError

B = 8
GEN = torch.Generator().manual_seed(1)
X = torch.randn(32, 6, generator=GEN, dtype=torch.float64)
Y = torch.randint(0, 3, (32,), generator=GEN)
FIELDS = ("grad_batch", "diag_ggn_exact", "diag_ggn_mc", "diag_h", "kfac", "kflr")


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 5),
        torch.nn.Tanh(),
        torch.nn.Linear(5, 4),
        torch.nn.ReLU(),
        torch.nn.Linear(4, 3),
    ).double()


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return X[step * B : (step + 1) * B], Y[step * B : (step + 1) * B]


def _fields(model: torch.nn.Module) -> dict[str, dict[str, object]]:
    """What BackPACK left on the parameters: ``{field: {parameter name: value}}``."""
    out: dict[str, dict[str, object]] = {}
    for name, p in model.named_parameters():
        for f in FIELDS:
            if hasattr(p, f):
                out.setdefault(f, {})[name] = getattr(p, f)
    return out


def _plain(make_extensions, steps=3) -> list[dict]:
    """A plain BackPACK run on a fresh identical model: ``with backpack(*extensions)``."""
    model, loss_fn = backpack.extend(_mlp()), backpack.extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(steps):
        x, y = _batch(step)
        opt.zero_grad()
        torch.manual_seed(100 + step)  # Monte-Carlo extensions draw the same samples
        loss = loss_fn(model(x), y)
        with backpack.backpack(*make_extensions()):
            loss.backward()
        out.append(_fields(model))
        opt.step()
    return out


def _cockpit_run(
    quantities,
    make_extensions,
    steps=3,
    *,
    extend=backpack.extend,
    with_model=False,
    prepare=False,
    registry=None,
):
    """Train the same model with a Cockpit; the extensions passed at every step."""
    gc.collect()  # unclosed Cockpits of earlier tests that still want BackPACK's hooks
    model = extend(_mlp())
    loss_fn = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model if with_model else model.named_parameters(), quantities, registry=registry)
    fields = []
    for step in range(steps):
        x, y = _batch(step)
        exts = make_extensions()
        if prepare:
            cp.prepare(step, *exts)
        opt.zero_grad()
        torch.manual_seed(100 + step)
        out = model(x)
        loss = loss_fn(out, y)
        losses = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
        info = {"loss": loss, "individual_losses": losses, "batch_size": B, "optimizer": opt}
        with cp(step, *exts, info=info):
            loss.backward()
        fields.append(_fields(model))
        opt.step()
    cp.close()
    return cp, fields


def _assert_equal(ours, reference, rtol=1e-12):
    assert ours.keys() == reference.keys()
    for name, value in reference.items():
        if isinstance(value, list):  # KFAC / KFLR: a list of Kronecker factors
            assert len(ours[name]) == len(value)
            for a, b in zip(ours[name], value):
                torch.testing.assert_close(a, b, rtol=rtol, atol=0)
        else:
            torch.testing.assert_close(ours[name], value, rtol=rtol, atol=0)


@pytest.fixture
def calls(monkeypatch):
    """``Counter[(save field, module class)]`` of BackPACK extension runs."""
    counter: Counter = Counter()
    original = BackpropExtension.__call__

    def counting(self, module, g_inp, g_out):
        counter[(self.savefield, type(module).__name__)] += 1
        return original(self, module, g_inp, g_out)

    monkeypatch.setattr(BackpropExtension, "__call__", counting)
    return counter


PER_SAMPLE_AND_GGN = ["norm_test", {"name": "tic_diag", "curvature": "diag_ggn_exact"}]
MODULES = {"Linear": 3, "Tanh": 1, "ReLU": 1, "CrossEntropyLoss": 1}  # per backward


def test_equal_extensions_run_once_and_equal_a_plain_backpack_run(calls):
    def exts():
        return DiagGGNExact(), BatchGrad(), KFAC()

    cp, ours = _cockpit_run(PER_SAMPLE_AND_GGN, exts)
    backpack_calls = dict(calls)
    reference = _plain(exts)
    assert cp.errors == [] and set(cp.get_output()) == {0, 1, 2}
    # one backward per step, each extension once per module: cockpit's own DiagGGNExact
    # and BatchGrad did not run besides the user's
    assert backpack_calls == {
        (field, module): 3 * count
        for field in ("diag_ggn_exact", "grad_batch", "kfac")
        for module, count in MODULES.items()
    }
    for step in range(3):
        assert ours[step].keys() == {"diag_ggn_exact", "grad_batch", "kfac"}
        for field, values in reference[step].items():
            _assert_equal(ours[step][field], values)


def test_the_users_results_stay_and_cockpits_own_fields_are_removed():
    quantities = ["norm_test", "tic_diag"]  # per-sample gradients, the Hessian diagonal
    cp, ours = _cockpit_run(quantities, lambda: (DiagGGNExact(),))
    reference = _plain(lambda: (DiagGGNExact(),))
    assert cp.errors == [] and set(cp.get_output()) == {0, 1, 2}
    for step in range(3):
        assert ours[step].keys() == {"diag_ggn_exact"}  # no grad_batch, no diag_h
        _assert_equal(ours[step]["diag_ggn_exact"], reference[step]["diag_ggn_exact"])


def test_quantities_are_unchanged_by_the_users_extensions():
    quantities = [
        "norm_test",
        {"name": "tic_diag", "curvature": "diag_ggn_exact"},
        {"name": "hess_trace", "method": "diag_ggn_mc"},
        {"name": "tic_trace", "curvature": "diag_hessian"},
    ]
    alone, _ = _cockpit_run(quantities, lambda: ())
    extra, _ = _cockpit_run(
        quantities, lambda: (DiagGGNExact(), BatchGrad(), KFAC(), DiagGGNMC(), KFLR())
    )
    assert alone.errors == [] and extra.errors == []
    without, with_ = alone.get_output(), extra.get_output()
    assert without.keys() == with_.keys() == {0, 1, 2}
    for step, values in without.items():
        assert with_[step].keys() == values.keys()
        for key, value in values.items():
            # norm_test reads the dense BatchGrad instead of cockpit's factored one: rounding
            assert with_[step][key]["total"] == pytest.approx(value["total"], rel=1e-10), key


def test_an_extension_conflicting_with_a_quantitys_is_refused_naming_both():
    quantities = [{"name": "hess_trace", "method": "diag_ggn_mc"}]
    with pytest.raises(RequirementConflictError) as err:
        _cockpit_run(quantities, lambda: (DiagGGNMC(mc_samples=2),))
    assert str(err.value) == (
        "The BackPACK extension DiagGGNMC(mc_samples=2) passed to cp(step, ...) conflicts "
        "with DiagGGNMC(mc_samples=1), which cockpit computes in the same backward pass for "
        "the statistic diag_ggn_mc(mc_samples=1) of quantity 'hess_trace': both save to "
        "p.diag_ggn_mc, with different hyperparameters (mc_samples=2 vs 1). One backward "
        "pass computes only one of them: pass DiagGGNMC(mc_samples=1) instead (it is "
        "computed once, for both), give the quantity the same options, or track the "
        "quantity at other steps."
    )


def test_a_batch_grad_with_subsampling_conflicts_with_per_sample_statistics():
    with pytest.raises(RequirementConflictError) as err:
        _cockpit_run(["norm_test", "grad_hist_1d"], lambda: (BatchGrad(subsampling=[0, 1]),))
    message = str(err.value)
    assert message.startswith(
        "The BackPACK extension BatchGrad(subsampling=[0, 1]) passed to cp(step, ...) "
        "conflicts with BatchGrad(), which cockpit computes in the same backward pass for the "
        "per-sample statistics "
    )
    assert "of quantities 'norm_test', 'grad_hist_1d': both save to p.grad_batch" in message
    assert "(subsampling=[0, 1] vs None)" in message


def test_two_conflicting_extensions_of_the_user_are_refused():
    with pytest.raises(RequirementConflictError) as err:
        _cockpit_run(["grad_norm"], lambda: (DiagGGNMC(), DiagGGNMC(mc_samples=3)))
    assert str(err.value) == (
        "cp(step, ...) got two BackPACK extensions that save to p.diag_ggn_mc with "
        "different hyperparameters: DiagGGNMC(mc_samples=1) and DiagGGNMC(mc_samples=3) "
        "(mc_samples=1 vs 3). One backward pass computes only one of them: pass one, or "
        "run the other in a backward pass of its own."
    )


def test_a_refused_step_can_be_run_again_with_matching_extensions():
    gc.collect()
    model = backpack.extend(_mlp())
    loss_fn = backpack.extend(torch.nn.CrossEntropyLoss())
    cp = Cockpit(model.named_parameters(), [{"name": "hess_trace", "method": "diag_ggn_mc"}])
    x, y = _batch(0)
    loss = loss_fn(model(x), y)
    with pytest.raises(RequirementConflictError):
        with cp(0, DiagGGNMC(mc_samples=2), info={"loss": loss}):
            pytest.fail("the block must not run")  # pragma: no cover
    assert model[0].weight.grad is None
    with cp(0, DiagGGNMC(mc_samples=1), DiagGGNMC(), info={"loss": loss}):
        loss.backward()
    assert cp.errors == [] and set(cp.get_output()[0]) == {"hess_trace"}
    assert model[0].weight.diag_ggn_mc.shape == (5, 6)
    cp.close()


def test_an_extension_is_refused_without_the_backpack_provider():
    registry = Registry.from_entry_points()
    del registry.providers["backpack"]  # as if cockpit-backpack were not installed
    registry.providers.pop("autodiff", None)  # (cockpit-autodiff accepts no requests either)
    with pytest.raises(MisuseError) as err:
        _cockpit_run(["grad_norm"], lambda: (DiagGGNExact(),), registry=registry)
    message = str(err.value)
    assert message.startswith(
        "cp(0, ...): no installed statistics provider accepts the argument "
        "<backpack.extensions.secondorder.diag_ggn.DiagGGNExact object at "
    )
    assert message.endswith(
        "(type DiagGGNExact; installed providers: 'hooks', 'func'). Arguments after the step "
        "number are requests for a provider, e.g. BackPACK extensions such as DiagGGNExact(), "
        "which need the BackPACK provider: pip install cockpit-backpack (`cockpit plugins` "
        "lists what is installed)."
    )


def test_module_hooks_serve_the_quantities_while_backpack_runs_only_the_users(calls):
    quantities = ["norm_test", "grad_hist_1d"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)
        cp, ours = _cockpit_run(
            quantities,
            lambda: (DiagGGNExact(),),
            extend=cockpit_extend,
            with_model=True,
            prepare=True,  # BackPACK's hooks are off: no quantity needs them
        )
    backpack_calls = dict(calls)
    alone, _ = _cockpit_run(quantities, lambda: (), extend=cockpit_extend, with_model=True)
    reference = _plain(lambda: (DiagGGNExact(),))
    assert {
        cp._router.routes(s.kind)[0].provider for s in cp._tracker.planner.plan(0)[1].statistics
    } == {"hooks"}
    assert backpack_calls == {("diag_ggn_exact", m): 3 * n for m, n in MODULES.items()}
    assert cp.errors == [] and alone.errors == []
    for step in range(3):
        assert ours[step].keys() == {"diag_ggn_exact"}
        _assert_equal(ours[step]["diag_ggn_exact"], reference[step]["diag_ggn_exact"])
        assert cp.get_output()[step]["norm_test"]["total"] == pytest.approx(
            alone.get_output()[step]["norm_test"]["total"], rel=1e-12
        )


def test_the_first_step_warns_when_backpack_did_not_observe_its_forward_pass():
    with pytest.warns(CockpitWarning) as caught:
        cp, ours = _cockpit_run(
            ["norm_test"], lambda: (DiagGGNExact(),), extend=cockpit_extend, with_model=True
        )
    assert [str(w.message) for w in caught] == [
        "cockpit: the forward pass of step 0 ran while the statistics provider(s) 'backpack' "
        "did not observe it, so the requests passed to cp(0, ...) that they serve "
        "(DiagGGNExact) are not computed at this step, nor are their statistics. They observe "
        "every forward pass from now on; to have the requests from the first step that passes "
        "them, call cp.prepare(step, *requests) with them before its forward pass."
    ]
    reference = _plain(lambda: (DiagGGNExact(),))
    assert ours[0] == {}  # BackPACK's hooks were off during the forward pass of step 0
    for step in (1, 2):
        _assert_equal(ours[step]["diag_ggn_exact"], reference[step]["diag_ggn_exact"])
    assert cp.errors == [] and set(cp.get_output()) == {0, 1, 2}


def test_models_extended_with_backpack_extend_work_from_the_first_step():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)
        cp, ours = _cockpit_run(
            ["norm_test"], lambda: (DiagGGNExact(),), extend=backpack.extend, with_model=True
        )
    reference = _plain(lambda: (DiagGGNExact(),))
    for step in range(3):
        _assert_equal(ours[step]["diag_ggn_exact"], reference[step]["diag_ggn_exact"])


def test_parameters_the_users_extension_missed_are_warned_about_once():
    with pytest.warns(CockpitWarning) as caught:
        cp, ours = _cockpit_run(
            ["grad_norm"], lambda: (DiagGGNExact(),), extend=lambda m: m, with_model=True
        )
    assert [str(w.message) for w in caught] == [
        "cockpit: BackPACK left p.diag_ggn_exact unset for parameter(s) '0.weight', "
        "'0.bias', '2.weight', '2.bias', '4.weight' and 1 more although DiagGGNExact() was "
        "passed to cp(step, ...): BackPACK computes nothing for modules that are not "
        "extended. Extend the model and the loss function (cockpit_backpack.extend or "
        "backpack.extend) before the forward pass. Warned once."
    ]
    assert ours == [{}, {}, {}]
    assert cp.errors == [] and set(cp.get_output()) == {0, 1, 2}


@pytest.mark.filterwarnings("ignore:The output of CrossEntropyLoss:UserWarning")  # scaled loss
def test_gradient_accumulation_leaves_the_last_micro_batchs_results():
    gc.collect()
    model = backpack.extend(_mlp())
    loss_fn = backpack.extend(torch.nn.CrossEntropyLoss())
    cp = Cockpit(model.named_parameters(), ["norm_test"])
    x, y = _batch(0)
    with cp(0, DiagGGNExact(), BatchGrad(), info={"batch_size": B}, accumulate=True) as run:
        for part in (slice(0, 5), slice(5, B)):
            out = model(x[part])
            loss = loss_fn(out, y[part]) * len(x[part]) / B
            losses = torch.nn.functional.cross_entropy(out, y[part], reduction="none")
            with run.micro_batch({"loss": loss, "individual_losses": losses.detach()}):
                loss.backward()
    assert cp.errors == [] and set(cp.get_output()[0]) == {"norm_test"}
    ours = _fields(model)
    cp.close()
    reference = backpack.extend(_mlp())
    loss = loss_fn(reference(x[5:]), y[5:]) * 3 / B
    with backpack.backpack(DiagGGNExact(), BatchGrad()):
        loss.backward()
    expected = _fields(reference)
    assert ours.keys() == expected.keys() == {"diag_ggn_exact", "grad_batch"}
    for field, values in expected.items():
        _assert_equal(ours[field], values)
