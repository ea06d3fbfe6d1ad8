"""What the hooks cannot serve: reported by ``cp.check`` and routed to ``torch.func``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cockpit_core import CockpitWarning

B, T = 3, 3


class Mixed(nn.Module):
    """Every configuration the module-hook rules refuse, around two layers they serve."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 4, scale_grad_by_freq=True)
        self.pos = nn.Parameter(torch.randn(T, 4))  # used in this module's own forward
        self.conv = nn.Conv1d(4, 4, 1, groups=2)
        self.attn = nn.MultiheadAttention(4, 2, add_bias_kv=True, batch_first=True)
        self.attn2 = nn.MultiheadAttention(4, 2, add_zero_attn=True, batch_first=True)
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 7)
        self.head.weight = self.embed.weight  # tied weights, registered by two modules

    def forward(self, idx):
        x = self.embed(idx) + self.pos
        x = self.conv(x.transpose(1, 2)).transpose(1, 2)
        x = self.attn(x, x, x, need_weights=False)[0]
        x = self.attn2(x, x, x)[0]
        return self.head(torch.tanh(self.lin(x))).mean(1)


def _losses(out: torch.Tensor, targets=None) -> torch.Tensor:
    return (torch.sin(out) ** 2 + 0.3 * out).sum(1)


_IDX = [
    torch.tensor([[1, 1, 4], [0, 6, 2], [3, 3, 3]]),
    torch.tensor([[2, 5, 5], [1, 0, 0], [6, 4, 3]]),
]
# no index in two samples: with scale_grad_by_freq a sample's gradient would depend on the
# others (torch.func scales by the frequency within the sample, autograd within the batch)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return Mixed().double()


def _reasons(report) -> dict[str, tuple[str, str]]:
    return {
        n: (p.served, " ".join(r for _, r in p.reasons)) for p in report.params for n in p.names
    }


def test_check_names_each_unsupported_configuration(h):
    model = _model()
    cp = h.Cockpit(model.named_parameters(), [h.recorder([h.BATCH_L2])], backend="auto")
    cp.attach(model, _losses)
    reasons = _reasons(cp.check(model))
    expected = {
        # tied to the head, but one of its modules refuses it: not served by hooks at all
        "embed.weight": "Embedding: scale_grad_by_freq=True scales each row's gradient",
        "attn.in_proj_weight": "MultiheadAttention: add_bias_kv=True is not supported",
        "attn.bias_k": "MultiheadAttention: add_bias_kv=True is not supported",
        "attn.out_proj.weight": "MultiheadAttention: add_bias_kv=True is not supported",
        "attn2.in_proj_bias": "MultiheadAttention: add_zero_attn=True is not supported",
    }
    for name, text in expected.items():
        served, why = reasons[name]
        assert served == "func", (name, served)
        assert text in why, (name, why)
    # the model's own 'pos' is captured where it is added to the batch; the grouped
    # convolution, which the convolution rule refuses, goes to the generic rule
    for name in ("pos", "conv.weight", "conv.bias", "lin.weight", "head.bias"):
        assert reasons[name][0] == "hooks", name
    cp.close()


def test_embedding_reasons(h):
    for options, text in [
        ({"scale_grad_by_freq": True}, "frequency in the whole batch, which mixes the samples"),
        ({"sparse": True}, "sparse=True gives sparse gradients"),
    ]:
        model = nn.Sequential(nn.Embedding(5, 2, **options))
        cp = h.Cockpit(model.named_parameters(), [h.recorder([h.BATCH_L2])], backend="hooks")
        report = cp.check(model)
        assert not report.ok
        assert text in str(report)
        cp.close()


def test_batchnorm_reason(h):
    """In training mode BatchNorm mixes the samples: check says so before the step runs."""
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    cp = h.Cockpit(model.named_parameters(), [h.recorder([h.BATCH_L2])], backend="hooks")
    report = cp.check(model)
    assert not report.ok
    assert "BatchNorm mixes the samples of a batch" in str(report)
    assert _reasons(report)["0.weight"][0] == "hooks"
    cp.close()


def test_unsupported_parameters_are_served_by_torch_func(h):
    """``backend="auto"`` with a loss: hooks where they can, ``torch.func`` for the rest."""
    stats = [h.BATCH_L2, h.SUM_GRAD_SQUARED, h.BATCH_DOT, h.BATCH_PROJECTION, h.CUBES, h.DOTS]
    r = h.run(
        _model(),
        lambda m, s: _losses(m(_IDX[s])),
        stats,
        backend="auto",
        loss_fn=_losses,
        inputs=_IDX,
        steps=2,
    )
    h.check(r, "routing (hooks + func)", stats)
    r.cockpit.close()


class FunctionalUse(nn.Module):
    """``lin.weight`` is also used by a functional call, which no module hook sees."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return torch.tanh(self.lin(x)) + F.linear(x * x, self.lin.weight)


_X = [
    torch.randn(B, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
    for s in (0, 1)
]


def test_use_outside_the_module_is_caught_not_silently_wrong(h):
    torch.manual_seed(0)
    stats = [h.BATCH_L2, h.BATCH_PROJECTION]
    r = h.run(FunctionalUse().double(), lambda m, s: _losses(m(_X[s])), stats, steps=2)
    for step in (0, 1):  # remembered after the first step
        missing = r.missing(step)
        assert set(missing) == {s.identity for s in stats}
        text = missing[h.BATCH_L2.identity]
        assert "'lin.weight' (Linear): the mean of the per-sample gradients" in text
        assert "also used outside the calls of its module" in text
    r.cockpit.close()


def test_use_outside_the_module_falls_back_to_torch_func(h):
    torch.manual_seed(0)
    with pytest.warns(CockpitWarning, match="the 'func' provider recomputed them"):
        r = h.run(
            FunctionalUse().double(),
            lambda m, s: _losses(m(_X[s])),
            backend="auto",
            loss_fn=_losses,
            inputs=_X,
            steps=2,
        )
    h.check(r, "routing (hooks + func)")
    r.cockpit.close()


@pytest.mark.parametrize("backend", ["hooks", "auto"])
def test_sequence_first_linear_is_reported(h, backend):
    """A plain Linear on ``[T, B, d]`` (T != B): the provider says why, computes nothing wrong."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    xs = [torch.randn(4, B, 3, dtype=torch.float64) for _ in range(2)]

    def losses(m, s):
        return _losses(m(xs[s]).transpose(0, 1).flatten(1))

    r = h.run(model, losses, [h.BATCH_L2], backend=backend)
    text = r.missing(0)[h.BATCH_L2.identity]
    assert "the input of Linear has 4 entries on dimension 0, but the batch has 3 samples" in text
    assert "module hooks need the batch on dimension 0" in text
    r.cockpit.close()
