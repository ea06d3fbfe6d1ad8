"""The Cockpit object: scheduling, requirement merging, statistics, failure isolation."""

import warnings

import pytest
import torch
from cockpit_backpack import extend

from cockpit_core import (
    BATCH_DOT,
    BATCH_L2,
    DIAG_HESSIAN,
    SUM_GRAD_SQUARED,
    Cockpit,
    CockpitWarning,
    MissingInfoError,
    MisuseError,
    Quantity,
    RequirementConflictError,
    Requirements,
    TwoStepQuantity,
    diag_ggn_mc,
    per_sample_transform,
)
from cockpit_core.testing import run_cockpit, tiny_cnn, tiny_mlp
from cockpit_core.testing.reference import explicit_hessian, flat, per_sample_gradients


class Stats(Quantity):
    """Returns every per-sample statistic, for checking the backend."""

    name = "stats"
    REQUIREMENTS = Requirements(statistics=(BATCH_L2, SUM_GRAD_SQUARED, BATCH_DOT, DIAG_HESSIAN))

    def compute(self, ctx):
        return {s.kind: [t.clone() for t in ctx.stat(s)] for s in self.REQUIREMENTS.statistics}


@pytest.mark.parametrize("make_problem", [tiny_mlp, tiny_cnn])
def test_statistics_equal_brute_force_per_sample_gradients(make_problem):
    result = run_cockpit(make_problem(), [Stats()], steps=2)
    for snap in result.snapshots:
        model = result.model_at(snap.step)
        g = per_sample_gradients(model, result.problem, snap.x, snap.y)
        out = result.output[snap.step]["stats"]
        for i, gi in enumerate(g):
            flat_i = gi.flatten(1)
            torch.testing.assert_close(torch.as_tensor(out["batch_l2"][i]), (flat_i**2).sum(1))
            torch.testing.assert_close(torch.as_tensor(out["sum_grad_squared"][i]), (gi**2).sum(0))
            torch.testing.assert_close(torch.as_tensor(out["batch_dot"][i]), flat_i @ flat_i.T)
        # diagonal of the explicit Hessian of the mean loss
        hess = explicit_hessian(model, result.problem, snap.x, snap.y)
        diag = flat([torch.as_tensor(d) for d in out["diag_hessian"]])
        torch.testing.assert_close(diag, torch.diagonal(hess))


class CountingTransform(Quantity):
    name = "counting"
    calls = 0

    def requirements(self):
        def fn(g, p):
            CountingTransform.calls += 1
            return g.abs().sum(0)

        return Requirements(statistics=(per_sample_transform("abs_sum", fn),))

    def compute(self, ctx):
        return float(sum(t.sum() for t in ctx.stat(self.requirements().statistics[0])))


def test_shared_statistics_are_computed_once_per_parameter_and_step():
    CountingTransform.calls = 0
    result = run_cockpit(
        tiny_mlp(), [CountingTransform(), CountingTransform(label="counting_2")], steps=2
    )
    n_params = len(list(result.model.parameters()))
    assert CountingTransform.calls == 2 * n_params
    assert result.output[0]["counting"] == result.output[0]["counting_2"]


def test_shared_values_are_computed_once_per_step_for_every_quantity():
    """``ctx.shared``: one ``compute`` per step and key; a raising compute is not kept."""
    calls: list[int] = []

    class Sharing(Quantity):
        name = "sharing"

        def compute(self, ctx):
            def grad_sum() -> float:
                calls.append(ctx.step)
                return float(sum(g.sum() for g in ctx.grads))

            def broken() -> float:
                raise ValueError("no")

            for _ in range(2):  # a raising compute runs again for the next caller
                with pytest.raises(ValueError):
                    ctx.shared("test.broken", broken)
            return ctx.shared("test.grad_sum", grad_sum)

    result = run_cockpit(tiny_mlp(), [Sharing(), Sharing(label="sharing_2")], steps=3)
    assert calls == [0, 1, 2]  # once per step, for both quantities
    for step, snapshot in enumerate(result.snapshots):
        expected = float(sum(g.sum() for g in snapshot.grads))
        assert result.output[step]["sharing"] == result.output[step]["sharing_2"]
        assert result.output[step]["sharing"] == pytest.approx(expected, rel=1e-6)


def test_per_sample_buffers_are_freed_during_backprop():
    seen = []

    class Spy(Quantity):
        name = "spy"
        REQUIREMENTS = Requirements(statistics=(BATCH_L2,))

        def compute(self, ctx):
            seen.extend(hasattr(p, "grad_batch") for p in ctx.params)
            return 0

    run_cockpit(tiny_mlp(), [Spy()], steps=1)
    assert seen and not any(seen)


def test_conflicting_hyperparameters_raise_when_the_step_begins():
    class A(Quantity):
        name = "a"
        REQUIREMENTS = Requirements(statistics=(diag_ggn_mc(1),))

        def compute(self, ctx):
            return 0

    class B(A):
        name = "b"
        REQUIREMENTS = Requirements(statistics=(diag_ggn_mc(2),))

    with pytest.raises(RequirementConflictError, match="'a' and 'b'"):
        run_cockpit(tiny_mlp(), [A(), B()], steps=1)


def test_missing_info_key_is_reported_at_the_first_step_even_if_not_scheduled_yet():
    class NeedsLosses(Quantity):
        name = "needs_losses"
        REQUIREMENTS = Requirements(info={"individual_losses"})

        def compute(self, ctx):
            return 0

    model = torch.nn.Linear(2, 1)
    cp = Cockpit(model.parameters(), [NeedsLosses(every=100, offset=50)])
    with pytest.raises(MissingInfoError) as err:
        with cp(0, info={"loss": torch.tensor(0.0)}):
            pass
    assert "'needs_losses' needs info['individual_losses']" in str(err.value)
    assert "with cp(step, info={...})" in str(err.value)


def test_a_failing_quantity_is_recorded_and_others_keep_working():
    class Broken(Quantity):
        name = "broken"

        def compute(self, ctx):
            raise ValueError("shape mismatch (3, 4)")

    with pytest.warns(
        CockpitWarning, match="quantity 'broken' failed at step 0.*training continues"
    ):
        result = run_cockpit(tiny_mlp(), [Broken(), "loss", "grad_norm"], steps=3)
    assert all({"loss", "grad_norm"} <= set(result.output[s]) for s in range(3))
    assert [e["step"] for e in result.cockpit.errors] == [0, 1, 2]
    assert result.cockpit.errors[0]["error"] == "ValueError: shape mismatch (3, 4)"
    assert result.cockpit.errors[0]["traceback"]


def test_on_error_disable_and_raise():
    class Broken(Quantity):
        name = "broken"

        def compute(self, ctx):
            raise ValueError("bad")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CockpitWarning)
        result = run_cockpit(tiny_mlp(), [Broken(), "loss"], steps=3, on_error="disable")
    assert len(result.cockpit.errors) == 1 and "loss" in result.output[2]
    with pytest.raises(ValueError, match="bad"):
        run_cockpit(tiny_mlp(), [Broken()], steps=1, on_error="raise")


class Marker(TwoStepQuantity):
    name = "marker"

    def compute_start(self, ctx):
        return ctx.step

    def compute_end(self, ctx, state):
        return {"start": state, "end": ctx.step}


def test_two_step_values_are_stored_under_the_start_step_and_state_is_dropped():
    result = run_cockpit(tiny_mlp(), [Marker(every=2)], steps=5)
    assert result.output == {
        0: {"marker": {"start": 0, "end": 1}},
        2: {"marker": {"start": 2, "end": 3}},
    }
    planner = result.cockpit._tracker.planner
    assert planner.pending_keys() == ["marker"]  # step 4 pending, its start state kept
    assert result.cockpit._tracker.cache.keys() == []


def test_nothing_runs_on_unscheduled_steps():
    result = run_cockpit(tiny_mlp(), [Stats(every=3, offset=1)], steps=5)
    assert sorted(result.output) == [1, 4]


def test_two_cockpits_coexist():
    problem = tiny_mlp()
    model = problem.make_model()
    loss_fn = problem.loss_module()
    cp1 = Cockpit(model.named_parameters(), ["loss"])
    cp2 = Cockpit(model.named_parameters(), [Stats()])
    x, y = problem.batch(0)
    loss = loss_fn(model(x), y)
    info = {"loss": loss, "batch_size": len(x)}
    with cp1(0, info=info), cp2(0, info=info):
        loss.backward()
    assert set(cp1.get_output()[0]) == {"loss"} and set(cp2.get_output()[0]) == {"stats"}


def test_hvp_matches_the_explicit_hessian_without_create_graph():
    vectors = {}

    class Hv(Quantity):
        name = "hv"
        REQUIREMENTS = Requirements(info={"loss"}, loss_graph=True)

        def compute(self, ctx):
            torch.manual_seed(ctx.step)
            v = [torch.randn_like(p) for p in ctx.params]
            vectors[ctx.step] = v
            return [h.clone() for h in ctx.hvp(v)]

    with warnings.catch_warnings():
        # no "create_graph=True will create a reference cycle" warning from PyTorch
        warnings.filterwarnings("error", message=".*reference cycle")
        result = run_cockpit(tiny_mlp(), [Hv()], steps=2)
    for snap in result.snapshots:
        hess = explicit_hessian(result.model_at(snap.step), result.problem, snap.x, snap.y)
        expected = hess @ flat(vectors[snap.step])
        got = flat([torch.as_tensor(h) for h in result.output[snap.step]["hv"]])
        torch.testing.assert_close(got, expected)


def test_hvp_without_retained_graph_explains_the_fix():
    class Hv(Quantity):
        name = "hv"
        REQUIREMENTS = Requirements(info={"loss"}, loss_graph=True)

        def compute(self, ctx):
            return float(ctx.hvp([torch.ones_like(p) for p in ctx.params])[0].sum())

    problem = tiny_mlp()
    model = problem.make_model()
    cp = Cockpit(model.parameters(), [Hv()], on_error="raise")
    x, y = problem.batch(0)
    loss = problem.loss_module()(model(x), y)
    with cp(0, info={"loss": loss}):  # cockpit keeps the graph of loss.backward() itself
        loss.backward()
    assert isinstance(cp.get_output()[0]["hv"], float)
    # a backward that does not go through torch.autograd.backward at call time frees it
    free = torch.autograd.backward
    loss = problem.loss_module()(model(x), y)
    with pytest.raises(MisuseError, match=r"retain_graph=cp.retain_graph\(step\)"):
        with cp(1, info={"loss": loss}):
            free(loss)


def test_unextended_model_gives_a_clear_error_for_per_sample_statistics():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    cp = Cockpit(model.named_parameters(), [Stats()])
    x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    with pytest.warns(CockpitWarning, match="cockpit_backpack.extend\\(model\\)"):
        with cp(0, info={"loss": loss, "batch_size": 4}):
            loss.backward()
    assert "stats" not in cp.get_output().get(0, {})


def test_unsupported_module_is_named():
    torch.manual_seed(0)
    model = extend(
        torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    )
    loss_fn = extend(torch.nn.CrossEntropyLoss())

    class L2(Quantity):
        name = "l2"
        REQUIREMENTS = Requirements(statistics=(BATCH_L2,))

        def compute(self, ctx):
            return [t.sum() for t in ctx.stat(BATCH_L2)]

    cp = Cockpit(model.named_parameters(), [L2(), "loss"])
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    loss = loss_fn(model(x), y)
    with pytest.warns(CockpitWarning, match=r"'1.weight' \(LayerNorm\), '1.bias' \(LayerNorm\)"):
        with cp(0, info={"loss": loss, "batch_size": 5}):
            loss.backward()
    assert set(cp.get_output()[0]) == {"loss"}


def test_misuse_steps_backwards_nested_and_frozen_params():
    model = torch.nn.Linear(2, 1)
    cp = Cockpit(model.parameters(), ["loss"])
    info = {"loss": torch.tensor(1.0)}
    with cp(3, info=info):
        pass
    with pytest.raises(MisuseError, match="steps must increase"):
        with cp(3, info=info):
            pass
    with pytest.raises(MisuseError, match="another cockpit step is active"):
        with cp(4, info=info):
            with cp(5, info=info):
                pass
    model.bias.requires_grad_(False)
    with pytest.raises(MisuseError, match="do not require gradients"):
        Cockpit(model.named_parameters(), ["loss"])


def test_debug_mode_prints_what_is_computed(capsys):
    run_cockpit(tiny_mlp(), [Stats(), "loss"], steps=1, debug=True)
    out = capsys.readouterr().out
    assert "step 0: tracking stats(single), loss(single)" in out
    assert "batch_l2" in out and "diag_hessian" in out


def test_retain_graph_only_on_steps_with_hvp_quantities():
    class Hv(Quantity):
        name = "hv"
        REQUIREMENTS = Requirements(info={"loss"}, loss_graph=True)

        def compute(self, ctx):
            return 0

    cp = Cockpit(torch.nn.Linear(2, 1).parameters(), [Hv(every=10), "loss"])
    assert cp.retain_graph(0) and not cp.retain_graph(1) and cp.create_graph(10)


def test_a_failing_transform_does_not_break_backward_and_is_reported():
    def bad(g, p):
        raise IndexError("bin index out of range")

    class Bad(Quantity):
        name = "bad"
        REQUIREMENTS = Requirements(statistics=(per_sample_transform("bad", bad),))

        def compute(self, ctx):
            return ctx.stat(self.REQUIREMENTS.statistics[0])

    with pytest.warns(
        CockpitWarning, match=r"Computing transform\[bad\] raised IndexError: bin index"
    ):
        result = run_cockpit(tiny_mlp(), [Bad(), "grad_norm"], steps=2)
    assert all("grad_norm" in result.output[s] for s in range(2))


def test_requirements_are_read_at_every_step():
    class Changing(Quantity):
        name = "changing"

        def requirements(self):
            key = f"scale={self.scale}"
            return Requirements(
                statistics=(per_sample_transform(key, lambda g, p: g.sum() * 0 + self.scale),)
            )

        scale = 1.0

        def compute(self, ctx):
            value = float(ctx.stat(self.requirements().statistics[0])[0])
            self.scale += 1
            return value

    result = run_cockpit(tiny_mlp(), [Changing()], steps=3)
    assert [result.output[s]["changing"] for s in range(3)] == [1.0, 2.0, 3.0]


def test_extend_hides_the_full_backward_hook_note_and_nothing_else():
    problem = tiny_mlp()
    model = problem.make_model()  # extended with cockpit_backpack.extend
    cp = Cockpit(model.named_parameters(), ["hess_max_ev"], on_error="raise")
    x, y = problem.batch(0)
    with warnings.catch_warnings(record=True) as caught:
        loss = problem.loss_module()(model(x), y)
        with cp(0, info={"loss": loss, "batch_size": len(x)}):
            loss.backward(retain_graph=cp.retain_graph(0))
        warnings.warn("an unrelated user warning", UserWarning, stacklevel=1)
    messages = [str(w.message) for w in caught]
    assert not any("Full backward hook is firing" in m for m in messages), messages
    assert "an unrelated user warning" in messages
