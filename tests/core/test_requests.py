"""Requests: objects passed to ``cp(step, *requests)`` go to the provider that accepts them."""

from __future__ import annotations

import contextlib
import types
import warnings

import pytest
import torch

from cockpit_core import Cockpit, CockpitWarning, MisuseError, Registry, StatisticProvider, hookimpl


class Marker:
    """A request only :class:`Recording` accepts."""

    def __init__(self, label: str):
        self.label = label

    def __repr__(self) -> str:
        return f"Marker({self.label!r})"


class Recording(StatisticProvider):
    """Records the collections it gets; observes the forward pass like module hooks do."""

    name = "recording"
    cost = 50.0
    description = "records the requests it is handed"
    kinds = frozenset({"recorded"})  # a kind no quantity requests
    observes_forward = True

    def __init__(self, params, names, options=None):
        super().__init__(params, names, options)
        self.collections: list = []
        self.armed_for: frozenset[int] = frozenset()
        self.arms: list[frozenset[int]] = []

    def accepts(self, request):
        return isinstance(request, Marker)

    def arm(self, indices):
        self.armed_for = frozenset(indices)
        self.arms.append(self.armed_for)

    def armed(self, indices):
        return indices <= self.armed_for

    @contextlib.contextmanager
    def collect(self, collection):
        self.collections.append(collection)
        yield


class Raising(StatisticProvider):
    """A provider whose ``accepts`` raises: it accepts nothing."""

    name = "raising"
    cost = 0.5
    description = "raises in accepts"
    kinds = frozenset({"raised"})

    def accepts(self, request):
        raise RuntimeError("broken accepts")


def _registry(*providers: type) -> Registry:
    registry = Registry.from_entry_points()
    plugin = types.SimpleNamespace()

    @hookimpl
    def register_statistic_providers(register):
        for cls in providers:
            register(cls)

    plugin.register_statistic_providers = register_statistic_providers
    registry.add_plugin(plugin, name="test-providers")
    return registry


def _setup(providers=(Recording,), quantities=("loss", "grad_norm")):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2)).double()
    cp = Cockpit(model, list(quantities), registry=_registry(*providers))
    return model, cp


def _recording(cp: Cockpit) -> Recording:
    return cp._router.providers["recording"]


def _step(cp, model, step, *requests, **kwargs):
    x = torch.randn(4, 3, dtype=torch.float64)
    loss = model(x).square().mean()
    with cp(step, *requests, info={"loss": loss, "batch_size": 4}, **kwargs):
        loss.backward()
    model.zero_grad()


def test_requests_reach_the_provider_that_accepts_them_without_statistics():
    model, cp = _setup()
    provider = _recording(cp)
    a, b = Marker("a"), Marker("b")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CockpitWarning)  # not armed at step 0: tested below
        _step(cp, model, 0, a, b)
    assert len(provider.collections) == 1
    col = provider.collections[0]
    assert col.requests == (a, b)
    assert col.statistics == () and col.targets == {}
    _step(cp, model, 1)  # no requests, no statistics: the provider is not entered
    assert len(provider.collections) == 1
    _step(cp, model, 2, b)
    assert provider.collections[-1].requests == (b,)
    assert set(cp.get_output()) == {0, 1, 2} and cp.errors == []


def test_a_request_no_provider_accepts_is_refused_naming_it():
    model, cp = _setup()
    x = torch.randn(4, 3, dtype=torch.float64)
    loss = model(x).square().mean()
    with pytest.raises(MisuseError) as err:
        with cp(0, 42, info={"loss": loss, "batch_size": 4}):
            loss.backward()
    autodiff = "'autodiff', " if "autodiff" in cp.registry.providers else ""
    assert str(err.value) == (
        "cp(0, ...): no installed statistics provider accepts the argument 42 (type int; "
        f"installed providers: 'hooks', 'backpack', 'func', {autodiff}'recording'). Arguments after the "
        "step number are requests for a provider, e.g. BackPACK extensions such as "
        "DiagGGNExact(), which need the BackPACK provider: pip install cockpit-backpack "
        "(`cockpit plugins` lists what is installed)."
    )
    assert cp.get_output() == {} and not cp._tracker.in_step
    with pytest.raises(MisuseError, match=r"It is a class: pass an instance, e.g. Marker\(\)\."):
        cp(0, Marker, info={}).__enter__()
    with pytest.raises(
        MisuseError,
        match=r"A dict after the step: pass the step's info as a keyword, cp\(step, info=\{\.\.\.\}\)\.",
    ):
        cp(0, {"loss": loss}).__enter__()
    with pytest.raises(MisuseError, match=r"^cp\.prepare\(3, \.\.\.\): no installed statistics"):
        cp.prepare(3, object())


def test_a_provider_whose_accepts_raises_accepts_nothing():
    model, cp = _setup(providers=(Raising, Recording))
    assert list(cp._router.providers)[0] == "raising"  # asked first (lowest cost)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CockpitWarning)
        _step(cp, model, 0, Marker("a"))
    assert [r.label for r in _recording(cp).collections[0].requests] == ["a"]
    _, alone = _setup(providers=(Raising,))
    with pytest.raises(MisuseError, match=r"accepts the argument Marker\('a'\) \(type Marker;"):
        alone.prepare(0, Marker("a"))


def test_first_request_to_an_unarmed_provider_warns_and_arms_it_for_good():
    model, cp = _setup()
    provider = _recording(cp)
    assert provider.armed_for == frozenset()  # no statistic needs it
    with pytest.warns(CockpitWarning) as caught:
        _step(cp, model, 0, Marker("a"))
    messages = [str(w.message) for w in caught]
    assert messages == [
        "cockpit: the forward pass of step 0 ran while the statistics provider(s) "
        "'recording' did not observe it, so the requests passed to cp(0, ...) that they "
        "serve (Marker) are not computed at this step, nor are their statistics. They "
        "observe every forward pass from now on; to have the requests from the first step "
        "that passes them, call cp.prepare(step, *requests) with them before its forward "
        "pass."
    ]
    everything = frozenset({0, 1})
    assert provider.armed_for == everything
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)
        for step in (1, 2, 5, 6):  # uneven steps, with and without requests: stays armed
            _step(cp, model, step, *(() if step % 2 else (Marker("b"),)))
            assert provider.armed_for == everything
    cp.close()
    assert provider.armed_for == frozenset()


def test_prepare_with_the_requests_arms_before_the_first_forward_pass():
    model, cp = _setup()
    provider = _recording(cp)
    cp.prepare(0, Marker("a"))
    assert provider.armed_for == frozenset({0, 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)
        _step(cp, model, 0, Marker("a"))
    assert provider.collections[0].requests[0].label == "a"


def test_gradient_accumulation_hands_the_requests_to_every_micro_batch():
    model, cp = _setup()
    provider = _recording(cp)
    marker = Marker("a")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CockpitWarning)  # forward passes inside: no warning
        with cp(0, marker, info={"batch_size": 4}, accumulate=True) as run:
            assert provider.armed_for == frozenset({0, 1})
            total = 0.0
            for _ in range(2):
                x = torch.randn(2, 3, dtype=torch.float64)
                loss = model(x).square().mean() / 2
                total += float(loss.detach())
                with run.micro_batch({"loss": loss, "batch_size": 2}):
                    loss.backward()
    assert [(c.requests, c.samples) for c in provider.collections] == [
        ((marker,), 2),
        ((marker,), 2),
    ]
    assert cp.get_output()[0]["loss"] == pytest.approx(total, rel=1e-12)
