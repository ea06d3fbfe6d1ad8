"""torch.func on stochastic models: the masks of the user's forward pass, or a refusal.

The reference is the definition on the *same* masks: one batched float64 forward pass of
a hook-free copy of the model from the generator state the user's pass started from (so it
draws the same masks, which also checks that cockpit leaves the random stream alone), then
one ``torch.autograd.grad`` per sample (``per_sample_gradients_from_losses``).

Tolerance: rtol 1e-6 as asked of the provider; both sides compute float64 sums in other
orders, and the values measured agree to ~1e-15.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections import OrderedDict
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cockpit_core import (
    BATCH_L2,
    SUM_GRAD_SQUARED,
    Cockpit,
    CockpitWarning,
    Quantity,
    Requirements,
)
from cockpit_core.statistics.replay import ForwardRecorder
from cockpit_core.testing.reference import per_sample_gradients_from_losses

from ._helpers import loop_registry

# refused steps warn once per quantity; the tests read cp.errors instead
pytestmark = pytest.mark.filterwarnings("ignore:cockpit. quantity:UserWarning")

RTOL, ATOL = 1e-6, 1e-12
QUANTITIES = ["norm_test", "inner_test", "mean_gsnr"]
STATS = (BATCH_L2, SUM_GRAD_SQUARED)
BATCH = 12


class Stats(Quantity):
    """Keeps batch_l2 and sum_grad_squared of every parameter (``None`` where missing)."""

    name = "stats"
    REQUIREMENTS = Requirements(statistics=STATS)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: dict[int, dict[str, list]] = {}

    def compute(self, ctx):
        self.seen[ctx.step] = {s.kind: [t.detach().clone() for t in ctx.stat(s)] for s in STATS}
        return 0.0


# -- models ---------------------------------------------------------------------------------


class DropoutMLP(nn.Module):
    """Two hidden layers, each followed by ``nn.Dropout(0.3)``."""

    def __init__(self, p: float = 0.3):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(6, 16), nn.Tanh(), nn.Dropout(p), nn.Linear(16, 16), nn.Tanh(),
            nn.Dropout(p), nn.Linear(16, 3),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)


class DropoutTransformer(nn.Module):
    """Embedding + learned positions, an encoder layer with dropout (attention too), dropout."""

    def __init__(self, vocab: int = 11, seq_len: int = 5, d: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.1 * torch.randn(seq_len, d))
        self.encoder = nn.TransformerEncoderLayer(
            d, 2, 16, dropout=0.2, activation="gelu", batch_first=True
        )
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(d, 3)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens) + self.pos)
        return self.head(self.drop(h).mean(dim=1))


class Mix(nn.Module):
    """A custom layer no module-hook rule knows: its weight goes to torch.func."""

    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, d) / d**0.5)

    def forward(self, h):
        return torch.einsum("...d,de->...e", h, self.weight)


class WeightsAttention(nn.Module):
    """``nn.MultiheadAttention`` with ``need_weights=True``: dropout on ``[B * heads, T, S]``."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.embed = nn.Embedding(11, d)
        self.attn = nn.MultiheadAttention(d, 2, dropout=0.25, batch_first=True)
        self.mix = Mix(d)
        self.head = nn.Linear(d, 3)

    def forward(self, tokens):
        h = self.embed(tokens)
        h, _ = self.attn(h, h, h, need_weights=True, average_attn_weights=False)
        return self.head(self.mix(h).mean(dim=1))


class Attention(nn.Module):
    """``F.scaled_dot_product_attention`` with dropout, called as Hugging Face models do.

    ``mode``: ``"causal"`` (``is_causal=True``) or ``"gqa"`` (a boolean padding mask, two
    query heads per key/value head, an explicit scale).
    """

    def __init__(self, mode: str, d: int = 8):
        super().__init__()
        self.mode = mode
        self.embed = nn.Embedding(11, d)
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, d if mode == "gqa" else 2 * d)
        self.head = nn.Linear(d, 3)

    def forward(self, tokens):
        h = self.embed(tokens)
        B, T, d = h.shape
        q = self.q(h).view(B, T, 4, d // 4).transpose(1, 2)
        heads = 2 if self.mode == "gqa" else 4
        k, v = self.kv(h).view(B, T, 2, heads, d // 4).permute(2, 0, 3, 1, 4)
        p = 0.3 if self.training else 0.0
        if self.mode == "causal":
            a = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            keep = (tokens != 0)[:, None, None, :] | torch.eye(T, dtype=torch.bool)
            a = F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, dropout_p=p, scale=0.3, enable_gqa=True
            )
        return self.head(a.transpose(1, 2).reshape(B, T, d).mean(dim=1))


class Functional(nn.Module):
    """Dropout called functionally (``F.dropout``, ``F.dropout1d``) inside ``forward``."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.mix = Mix(16)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        h = F.dropout(torch.tanh(self.inp(x)), 0.25, self.training)
        h = F.dropout1d(self.mix(h).unsqueeze(-1), 0.2, self.training).squeeze(-1)
        return self.out(torch.tanh(h))


class Noisy(DropoutMLP):
    """Adds ``torch.randn`` noise in ``forward``: randomness cockpit cannot replay."""

    def forward(self, x):
        return self.net(x + 0.1 * torch.randn_like(x))


class SequenceFirst(DropoutMLP):
    """Dropout on a ``[T, B, D]`` tensor: its mask cannot be split into samples."""

    def forward(self, x):
        h = torch.tanh(self.net[0](x))  # [B, 16]
        seq = self.net[2](h.unsqueeze(0).expand(5, -1, -1))  # dropout on [T, B, 16]
        return self.net[6](torch.tanh(self.net[3](seq.mean(0))))


class Counter(nn.Module):
    """A forward pass that reads a Python counter advanced by every call: no two are equal."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.net(x) + 0.5 * self.calls * torch.linspace(-1.0, 1.0, 3, dtype=x.dtype)


# -- running and the reference ------------------------------------------------------------


def _data(kind: str, step: int):
    gen = torch.Generator().manual_seed(100 + step)
    y = torch.randint(0, 3, (BATCH,), generator=gen)
    if kind == "tokens":
        return torch.randint(0, 11, (BATCH, 5), generator=gen), y
    return torch.randn(BATCH, 6, generator=gen, dtype=torch.float64), y


def train(
    make: Callable[[], nn.Module], kind: str, steps: int = 2, backend="func", **kwargs
) -> tuple[Cockpit, Stats, list[dict]]:
    """Train with cockpit; per step the same-mask reference.

    Returns:
        The Cockpit, the statistics recorder, and per step the reference per-sample
        gradients and the quantities computed from them.

    """
    torch.manual_seed(0)
    model = make().double()
    stats = Stats()
    cp = Cockpit(model.named_parameters(), [*QUANTITIES, stats], backend=backend, **kwargs)
    cp.attach(model, nn.CrossEntropyLoss(reduction="none"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    references = []
    torch.manual_seed(1234)
    for step in range(steps):
        x, y = _data(kind, step)
        copy_ = _strip(model)
        rng = torch.get_rng_state()
        opt.zero_grad()
        losses = F.cross_entropy(model(x), y, reduction="none")
        info = {
            "loss": losses.mean(),
            "individual_losses": losses.detach(),
            "batch_size": BATCH,
            "inputs": x,
            "targets": y,
        }
        with cp(step, info=info):
            losses.mean().backward()
        after = torch.get_rng_state()
        torch.set_rng_state(rng)  # the user's pass's generator state: the same masks
        references.append(reference(copy_, x, y))
        assert torch.equal(torch.get_rng_state(), after), "cockpit changed the random stream"
        opt.step()
    return cp, stats, references


def _strip(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` without hooks (cockpit's): it draws what the model draws."""
    saved = {}
    for m in model.modules():
        saved[m] = (m._forward_pre_hooks, m._forward_hooks)
        m._forward_pre_hooks, m._forward_hooks = OrderedDict(), OrderedDict()
    try:
        return copy.deepcopy(model)
    finally:
        for m, (pre, post) in saved.items():
            m._forward_pre_hooks, m._forward_hooks = pre, post


def reference(model: nn.Module, x, y) -> dict:
    """Per-sample gradients of one batched forward pass, and the quantities' definitions."""
    losses = F.cross_entropy(model(x), y, reduction="none")
    grads = per_sample_gradients_from_losses(losses, list(model.parameters()))
    return {"grads": grads, **quantities(grads)}


def quantities(grads: list[torch.Tensor]) -> dict[str, float]:
    """norm_test, inner_test, mean_gsnr (totals) from per-sample gradients ``[B, ...]``."""
    G = torch.cat([g.flatten(1) for g in grads], dim=1)
    B = G.shape[0]
    g = G.mean(0)
    gg = float(g @ g)
    variance = float(((G - g) ** 2).sum()) / (B - 1)
    projections = G @ g
    return {
        "norm_test": math.sqrt(variance / B / gg),
        "inner_test": math.sqrt(float(torch.var(projections, correction=1)) / B / gg**2),
        "mean_gsnr": float((g**2 / (torch.var(G, dim=0, correction=0) + 1e-5)).mean()),
    }


def assert_matches(cp: Cockpit, stats: Stats, references: list[dict], steps=None) -> None:
    """Every quantity and statistic of ``steps`` equals the same-mask reference."""
    output = cp.get_output()
    for step, ref in enumerate(references):
        if steps is not None and step not in steps:
            continue
        for key in QUANTITIES:
            value = output[step][key]
            total = value["total"] if isinstance(value, dict) else value
            assert total == pytest.approx(ref[key], rel=RTOL), (step, key)
        seen = stats.seen[step]
        for i, g in enumerate(ref["grads"]):
            torch.testing.assert_close(
                seen["batch_l2"][i], (g.flatten(1) ** 2).sum(1), rtol=RTOL, atol=ATOL
            )
            torch.testing.assert_close(
                seen["sum_grad_squared"][i], (g**2).sum(0), rtol=RTOL, atol=ATOL
            )


def refusals(cp: Cockpit, step: int) -> list[str]:
    """The error messages of the quantities that failed at ``step``."""
    return [str(e["error"]) for e in cp.errors if e["step"] == step]


# -- exact replay ---------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [None, 5])
def test_mlp_with_dropout_modules_equals_the_same_mask_reference(chunk_size):
    cp, stats, refs = train(DropoutMLP, "dense", chunk_size=chunk_size)
    assert not cp.errors
    assert_matches(cp, stats, refs)


def test_transformer_with_dropout_and_attention_dropout_equals_the_reference():
    cp, stats, refs = train(DropoutTransformer, "tokens")
    assert not cp.errors
    assert_matches(cp, stats, refs)


def test_attention_weights_dropout_on_batch_times_heads_rows_is_replayed():
    cp, stats, refs = train(WeightsAttention, "tokens")
    assert not cp.errors
    assert_matches(cp, stats, refs)


@pytest.mark.parametrize("mode", ["causal", "gqa"])
def test_scaled_dot_product_attention_dropout_is_replayed(mode):
    cp, stats, refs = train(lambda: Attention(mode), "tokens")
    assert not cp.errors
    assert_matches(cp, stats, refs)


def test_functional_dropout_inside_forward_is_replayed():
    cp, stats, refs = train(Functional, "dense")
    assert not cp.errors
    assert_matches(cp, stats, refs)


class Gate(nn.Module):
    """A custom layer with dropout inside: module hooks re-run it per sample, which they
    refuse for a random module, so torch.func serves its parameters (a fallback)."""

    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, d) / d**0.5)
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, h):
        return h * torch.sigmoid(F.dropout(h @ self.weight, 0.2, self.training) + self.bias)


class AutoModel(nn.Module):
    """Learned positions (``x + self.pos``), attention with dropout, a random custom layer."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.embed = nn.Embedding(11, d)
        self.pos = nn.Parameter(0.1 * torch.randn(5, d))
        self.attn = nn.MultiheadAttention(d, 2, dropout=0.25, batch_first=True)
        self.gate = Gate(d)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(d, 3)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos
        h, _ = self.attn(h, h, h, need_weights=True, average_attn_weights=False)
        return self.head(self.drop(self.gate(h)).mean(dim=1))


def test_auto_backend_with_parameters_served_by_func_is_exact():
    """``backend="auto"``: torch.func computes what the cheaper providers cannot.

    Where func serves parameters only as a fallback at run time, it did not observe the
    first step's forward pass: that step is refused (or exact, should another provider
    serve them after all); from then on it observes the forward passes of tracked steps.
    """
    cp, stats, refs = train(AutoModel, "tokens", steps=3, backend="auto")
    for message in refusals(cp, 0):
        assert "did not observe this step's forward pass" in message
    assert not refusals(cp, 1) and not refusals(cp, 2)
    assert_matches(cp, stats, refs, steps={1, 2} if refusals(cp, 0) else None)


class Einsum(nn.Module):
    """A parameter the model uses directly in ``torch.einsum``, with dropout around it."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.w = nn.Parameter(torch.randn(8, 8) / 3)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.drop(torch.tanh(self.inp(x)))
        return self.head(self.drop(torch.einsum("bd,de->be", h, self.w)))


def test_a_fallback_to_func_records_the_masks_from_the_next_step_on():
    """A parameter func serves because another provider left it empty at a step.

    func was not armed for that step's forward pass, so on a model with dropout it refuses
    the step (or the other provider served it after all); it then observes the forward
    passes that provider observes, and the next steps are exact.
    """
    cp, stats, refs = train(Einsum, "dense", steps=3, backend="auto")
    for message in refusals(cp, 0):
        assert "did not observe this step's forward pass" in message
    assert not refusals(cp, 1) and not refusals(cp, 2)
    assert_matches(cp, stats, refs, steps={1, 2})


def test_micro_batches_with_dropout_replay_each_forward_pass():
    torch.manual_seed(0)
    model = DropoutMLP().double()
    plain = _strip(model)
    cp = Cockpit(model.named_parameters(), QUANTITIES, backend="func")
    cp.attach(model, nn.CrossEntropyLoss(reduction="none"))
    x, y = _data("dense", 0)
    rng = torch.get_rng_state()
    with cp(0, info={"batch_size": BATCH}, accumulate=True) as run:
        for lo, hi in ((0, 5), (5, BATCH)):
            losses = F.cross_entropy(model(x[lo:hi]), y[lo:hi], reduction="none")
            loss = losses.mean() * (hi - lo) / BATCH
            micro = {"loss": loss, "individual_losses": losses.detach(), "batch_size": hi - lo}
            with run.micro_batch({**micro, "inputs": x[lo:hi], "targets": y[lo:hi]}):
                loss.backward()
    torch.set_rng_state(rng)
    losses = torch.cat(
        [
            F.cross_entropy(plain(x[lo:hi]), y[lo:hi], reduction="none")
            for lo, hi in ((0, 5), (5, 12))
        ]
    )
    expected = quantities(per_sample_gradients_from_losses(losses, list(plain.parameters())))
    assert not cp.errors
    for key in QUANTITIES:
        assert cp.get_output()[0][key]["total"] == pytest.approx(expected[key], rel=RTOL), key


# -- deterministic models -------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["eval", "p=0"])
def test_deterministic_dropout_just_works(variant):
    def make():
        model = DropoutMLP(p=0.0 if variant == "p=0" else 0.3)
        return model.eval() if variant == "eval" else model

    cp, stats, refs = train(make, "dense")
    assert not cp.errors
    assert_matches(cp, stats, refs)
    records = cp._router.providers["func"].recorder.records
    assert all(not r.draws and not r.random for r in records)


def test_a_model_without_randomness_is_recorded_without_interception():
    """After one observed pass in training mode, no mode is entered: nothing to pay."""
    cp, stats, refs = train(lambda: Counter().net, "dense", steps=3)
    assert not cp.errors
    assert_matches(cp, stats, refs)
    recorder = cp._router.providers["func"].recorder
    assert recorder.random is False
    assert [r.captured for r in recorder.records][-1] is False


def test_training_with_cockpit_keeps_the_random_stream_of_training_without():
    """Recording and replaying change no mask of training: the parameters stay equal."""

    def run(with_cockpit: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = DropoutTransformer().double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cp = None
        if with_cockpit:
            cp = Cockpit(model.named_parameters(), QUANTITIES, backend="func")
            cp.attach(model, nn.CrossEntropyLoss(reduction="none"))
        torch.manual_seed(5)
        for step in range(3):
            x, y = _data("tokens", step)
            opt.zero_grad()
            losses = F.cross_entropy(model(x), y, reduction="none")
            info = {"loss": losses.mean(), "batch_size": BATCH, "inputs": x, "targets": y}
            with cp(step, info=info) if cp else contextlib.nullcontext():
                losses.mean().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(True), run(False)):
        assert torch.equal(a, b)


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (Noisy, "cannot replay per sample (torch.randn_like)"),
        (SequenceFirst, "is not a multiple of the batch size"),
    ],
    ids=["randn-in-forward", "sequence-first-dropout"],
)
def test_randomness_that_cannot_be_replayed_is_refused_and_training_goes_on(make, reason):
    cp, stats, _ = train(make, "dense")
    for step in (0, 1):
        messages = refusals(cp, step)
        assert len(messages) == len(QUANTITIES) + 1  # every quantity, the recorder too
        assert all(reason in m and "missing at this step" in m for m in messages)
    assert stats.seen == {}


def test_alpha_dropout_is_refused():
    class Alpha(DropoutMLP):
        def forward(self, x):
            return self.net[6](F.alpha_dropout(torch.tanh(self.net[0](x)), 0.2, self.training))

    cp, _, _ = train(lambda: Alpha(), "dense", steps=1)
    messages = refusals(cp, 0)
    assert messages and all("(F.alpha_dropout)" in m for m in messages)


def test_a_recomputed_pass_that_differs_is_missing_not_delivered():
    """A forward pass that changes between calls: the per-sample mean misses p.grad."""
    cp, stats, _ = train(Counter, "dense")
    for step in (0, 1):
        messages = refusals(cp, step)
        assert messages and all("whose mean does not match p.grad" in m for m in messages)
    assert stats.seen == {}


def test_a_recomputing_third_party_provider_that_differs_loses_its_statistics():
    """The core compares every recomputing provider's per-sample mean with p.grad."""
    cp, stats, _ = train(Counter, "dense", steps=1, backend="loop", registry=loop_registry())
    messages = refusals(cp, 0)
    assert messages and all("The 'loop' provider recomputed" in m for m in messages)


def test_a_loss_that_is_not_a_mean_is_warned_about_not_refused():
    """A pure scale between p.grad and the per-sample mean goes to the loop check's warning.

    torch.func is the only provider here, so the warning also shows that its per-sample mean
    reaches the loop check.
    """
    torch.manual_seed(0)
    model = DropoutMLP().double()
    cp = Cockpit(model.named_parameters(), QUANTITIES, backend="func")
    cp.attach(model, nn.CrossEntropyLoss(reduction="none"))
    x, y = _data("dense", 0)
    losses = F.cross_entropy(model(x), y, reduction="none")
    info = {"loss": losses.sum(), "batch_size": BATCH, "inputs": x, "targets": y}
    with pytest.warns(CockpitWarning, match="(?i)per-sample statistics are scaled wrongly"):
        with cp(0, info=info):
            losses.sum().backward()
    assert not cp.errors and set(QUANTITIES) <= set(cp.get_output()[0])


def test_the_recorder_keeps_one_record_per_outer_forward_pass_and_matches_inputs():
    """A model that calls itself records one pass; records are found by their inputs."""

    class Twice(DropoutMLP):
        def forward(self, x, again: bool = True):
            h = self.net(x)
            return h + self(x, again=False) if again else h

    torch.manual_seed(0)
    model = Twice().double()
    recorder = ForwardRecorder()
    recorder.attach(model)
    recorder.arm(True)
    first, second = _data("dense", 0)[0], _data("dense", 1)[0]
    model(first)
    model(second)
    assert len(recorder.records) == 2
    assert [len(r.draws) for r in recorder.records] == [4, 4]  # 2 dropouts, called twice
    assert recorder.take(first, BATCH) is recorder.records[0]
    assert recorder.take(second, BATCH) is recorder.records[0]  # older ones dropped
    assert len(recorder.records) == 1
    recorder.arm(False)
    model(first)
    assert recorder.records == [] and not recorder.registered
