"""When the hooks are installed, what they keep, and how they coexist with other machinery."""

from __future__ import annotations

import gc
from copy import deepcopy

import pytest
import torch
from torch import nn

import cockpit_core
from cockpit_core import DIAG_HESSIAN, Cockpit
from cockpit_core.errors import UnsupportedModelError

B, T = 3, 4


class Zoo(nn.Module):
    """One module of every rule."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.conv = nn.Conv1d(4, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.norm = nn.LayerNorm(4)
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.lin = nn.Linear(4, 2)

    def forward(self, idx):
        x = self.gn(self.conv(self.embed(idx).transpose(1, 2))).transpose(1, 2)
        x = self.norm(torch.tanh(x))
        x = self.attn(x, x, x, need_weights=False)[0]
        return self.lin(x).mean(1)


def _losses(out, targets=None):
    return (torch.sin(out) ** 2 + 0.3 * out).sum(1)


def _idx(step: int) -> torch.Tensor:
    return torch.randint(0, 7, (B, T), generator=torch.Generator().manual_seed(step))


def _zoo() -> nn.Module:
    torch.manual_seed(0)
    return Zoo().double()


def _hooks(model: nn.Module) -> list[str]:
    """Modules that carry any module hook."""
    return [
        name
        for name, m in model.named_modules()
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
    ]


def _provider(cp: Cockpit):
    return cp._router.providers["hooks"]


def test_untracked_steps_leave_no_hooks_and_tracked_ones_stay_exact(h):
    """Every other step tracked: no module hook during the untracked ones."""
    hooked = []

    def losses(m, s):
        if len(hooked) == s:  # the tracked model comes first, then the reference's copy
            hooked.append(_hooks(m))
        return _losses(m(_idx(s)))

    r = h.run(_zoo(), losses, every=lambda s: s % 2 == 0, steps=5)
    assert hooked[1] == hooked[3] == []
    assert hooked[0] and hooked[2] and hooked[4]
    h.check(r, "lifecycle", steps=[0, 2, 4])
    r.cockpit.close()
    assert _hooks(r.model) == []


def test_no_grad_and_untracked_backward_record_nothing(h):
    model = _zoo()
    quantity = h.recorder([h.BATCH_L2, h.BATCH_PROJECTION])
    cp = Cockpit(model.named_parameters(), [quantity], backend="hooks", on_error="raise")
    cp.attach(model)
    provider = _provider(cp)
    assert _hooks(model)  # armed for step 0
    with torch.no_grad():
        model(_idx(0))
    assert provider._state.sites == []
    _losses(model(_idx(1))).mean().backward()  # outside any cp(step): not tracked
    assert all(ref() is None for ref in provider._state.sites)
    assert provider._state.live == [] and provider._state.done == set()
    model.zero_grad()
    out = model(_idx(0))
    loss = _losses(out).mean()
    with cp(0, info={"loss": loss, "batch_size": B}):
        loss.backward()
    assert quantity.missing[0] == {}
    assert provider._state.sites == [] and provider._state.live == []
    cp.close()


def test_on_error_raise_reports_the_reason_and_training_goes_on(h):
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()

    def boom(grads, param):
        raise RuntimeError("boom")

    failing = cockpit_core.per_sample_transform("failing", boom, reduce="sum")

    class Reads(cockpit_core.Quantity):
        name = "reads"
        REQUIREMENTS = cockpit_core.Requirements(statistics=(h.BATCH_L2, failing))

        def compute(self, ctx):
            ctx.stat(h.BATCH_L2)
            return float(ctx.stat(failing)[0].sum())

    cp = Cockpit(model.named_parameters(), [Reads()], backend="hooks", on_error="raise")
    cp.attach(model)
    x = torch.randn(4, 3, dtype=torch.float64)
    loss = _losses(model(x)).mean()
    with pytest.raises(UnsupportedModelError, match="raised RuntimeError: boom"):
        with cp(0, info={"loss": loss, "batch_size": 4}):
            loss.backward()
    expected = torch.autograd.grad(_losses(model(x)).mean(), model.weight)[0]
    assert torch.equal(model.weight.grad, expected)  # backward itself was not disturbed
    cp.close()


def test_hessian_vector_products_do_not_fire_the_hooks(h, monkeypatch):
    """hess_max_ev's double backward after the step runs with the hooks removed."""
    from cockpit_hooks.provider import HooksProvider

    calls = []
    on_grad, on_param = HooksProvider._on_grad, HooksProvider._on_param_grad

    def spy_grad(self, site, grad):
        calls.append(self._collection is not None)
        on_grad(self, site, grad)

    def spy_param(self, i, grad):
        calls.append(self._collection is not None)
        on_param(self, i, grad)

    monkeypatch.setattr(HooksProvider, "_on_grad", spy_grad)
    monkeypatch.setattr(HooksProvider, "_on_param_grad", spy_param)
    model = _zoo()
    quantity = h.recorder(h.ALL_STATS)
    cp = Cockpit(model.named_parameters(), ["hess_max_ev", quantity], backend="hooks")
    cp.attach(model, _losses)
    copy = deepcopy(model)
    ref = h.per_sample_loop(_losses(copy(_idx(0))), list(copy.parameters()))
    loss = _losses(model(_idx(0))).mean()
    with cp(0, info={"loss": loss, "batch_size": B}):
        loss.backward(retain_graph=cp.retain_graph(0))
    assert calls and all(calls)  # every hook call came during the tracked backward
    assert cp.errors == []
    value = cp.get_output()[0]["hess_max_ev"]
    assert value["converged"] and value["value"] > 0  # its accuracy: cockpit-curvature's tests
    assert quantity.missing[0] == {}
    worst = 0.0
    for stat in h.ALL_STATS:
        for i, p in enumerate(model.parameters()):
            expected = h.reference(stat, ref[i], p.detach())
            worst = max(worst, h.relative_error(quantity.values[0][stat.identity][i], expected))
    assert worst <= h.TOL
    h.note_error("lifecycle", worst)
    cp.close()


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_backpack_extended_model_prefers_hooks(h):
    """On an extended model the router picks the hooks, and BackPACK's hooks step aside."""
    cockpit_backpack = pytest.importorskip("cockpit_backpack")
    gc.collect()  # BackPACK's hook switch is global: unclosed Cockpits of earlier tests
    torch.manual_seed(0)
    model = cockpit_backpack.extend(nn.Sequential(nn.Linear(4, 5), nn.Sigmoid(), nn.Linear(5, 3)))
    model = model.double()
    lossfunc = cockpit_backpack.extend(nn.CrossEntropyLoss())
    x = torch.randn(6, 4, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    counts = []

    def losses(m, s):
        if len(counts) == s:  # the tracked model comes first, then the reference's copy
            counts.append([len(mod._forward_hooks) for mod in m if isinstance(mod, nn.Linear)])
        return nn.functional.cross_entropy(m(x), y, reduction="none")

    r = h.run(model, losses, steps=2, backend="auto")
    assert counts == [[1, 1], [1, 1]]  # only the module-hook provider's forward hook
    assert all(not mod._backward_hooks for mod in model.modules())
    routes = {n: p.served for p in r.cockpit.check(model).params for n in p.names}
    assert set(routes.values()) == {"hooks"}
    h.check(r, "lifecycle")
    r.cockpit.close()

    # a curvature diagonal from BackPACK and per-sample statistics from the hooks, one step
    quantity = h.recorder([h.BATCH_L2, DIAG_HESSIAN])
    cp = Cockpit(model.named_parameters(), [quantity], backend="auto", on_error="raise")
    cp.attach(model)
    model.zero_grad()
    loss = lossfunc(model(x), y)
    with cp(0, info={"loss": loss, "batch_size": len(x)}):
        loss.backward()
    assert quantity.missing[0] == {}
    params = list(model.parameters())
    ref = h.per_sample_loop(nn.functional.cross_entropy(model(x), y, reduction="none"), params)
    for i, p in enumerate(params):
        err = h.relative_error(
            quantity.values[0][h.BATCH_L2.identity][i], ref[i].flatten(1).pow(2).sum(1)
        )
        assert err <= h.TOL
        flat_hessian = torch.autograd.functional.hessian(
            lambda w, i=i: _loss_with(model, i, w, x, y), p.detach()
        ).reshape(p.numel(), p.numel())
        diag = quantity.values[0][DIAG_HESSIAN.identity][i].flatten()
        assert h.relative_error(diag, flat_hessian.diagonal()) <= h.TOL
    cp.close()


def _loss_with(model: nn.Module, index: int, value: torch.Tensor, x, y) -> torch.Tensor:
    names = [n for n, _ in model.named_parameters()]
    params = {n: p.detach() for n, p in model.named_parameters()}
    params[names[index]] = value
    out = torch.func.functional_call(model, params, (x,))
    return nn.functional.cross_entropy(out, y)


def test_gradient_accumulation(h):
    """Two micro-batches of one step: the statistics of the six samples together.

    (``batch_dot`` does not combine across micro-batches: the core refuses it.)
    """
    stats = [s for s in h.ALL_STATS if s is not h.BATCH_DOT]
    model = _zoo()
    copy = deepcopy(model)
    quantity = h.recorder(stats)
    cp = Cockpit(model.named_parameters(), [quantity], backend="hooks", on_error="raise")
    cp.attach(model)
    idx = torch.randint(0, 7, (2 * B, T), generator=torch.Generator().manual_seed(3))
    with cp(0, info={"batch_size": 2 * B}, accumulate=True) as run:
        for part in idx.split(B):
            losses = _losses(model(part))
            loss = losses.mean() / 2
            with run.micro_batch({"loss": loss, "individual_losses": losses.detach()}):
                loss.backward()
    assert quantity.missing[0] == {}
    ref = h.per_sample_loop(_losses(copy(idx)), list(copy.parameters()))
    worst = 0.0
    for stat in stats:
        for i, p in enumerate(model.parameters()):
            expected = h.reference(stat, ref[i], p.detach())
            worst = max(worst, h.relative_error(quantity.values[0][stat.identity][i], expected))
    assert worst <= h.TOL
    h.note_error("lifecycle", worst)
    cp.close()


@pytest.mark.parametrize("broken", ["attention", "layernorm"])
def test_a_failing_rule_never_breaks_training(h, monkeypatch, broken):
    """A rule that raises in the forward pass: PyTorch's own computation runs, stats missing."""
    from cockpit_hooks.rules import attention, norm

    def boom(*args, **kwargs):
        raise RuntimeError("rule broke")

    if broken == "attention":
        monkeypatch.setattr(attention, "_forward", boom)
        names = ["attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight"]
        module = "MultiheadAttention"
    else:
        monkeypatch.setattr(norm.LayerNormRule, "uses", boom)
        names, module = ["norm.weight", "norm.bias"], "LayerNorm"
    r = h.run(_zoo(), lambda m, s: _losses(m(_idx(s))), [h.BATCH_L2], on_error="warn")
    text = r.missing(0)[h.BATCH_L2.identity]
    assert text.count(": the rule failed in the forward pass: RuntimeError: rule broke") == 1
    assert all(f"'{name}' ({module})" in text for name in names)
    assert "'lin.weight'" not in text
    r.cockpit.close()
