"""The torch.func provider under gradient accumulation: each micro-batch passes its own inputs."""

import torch
from torch import nn

from cockpit_core import Cockpit

QUANTITIES = ["grad_norm", "norm_test", "inner_test", "mean_gsnr", "grad_hist_1d"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def _batch():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(12, 5, generator=gen, dtype=torch.float64), torch.randint(
        0, 3, (12,), generator=gen
    )


def _cockpit(model):
    cp = Cockpit(model, QUANTITIES, backend="func", on_error="raise")
    return cp.attach(model, nn.CrossEntropyLoss(reduction="none"))


def test_micro_batches_with_their_own_inputs_equal_the_whole_batch():
    x, y = _batch()
    model = _model()
    whole = _cockpit(model)
    model.zero_grad()
    losses = nn.functional.cross_entropy(model(x), y, reduction="none")
    info = {"loss": losses.mean(), "individual_losses": losses, "batch_size": 12}
    with whole(0, info={**info, "inputs": x, "targets": y}):
        losses.mean().backward()

    model = _model()
    split = _cockpit(model)
    model.zero_grad()
    with split(0, info={"batch_size": 12}, accumulate=True) as run:
        for lo, hi in ((0, 5), (5, 12)):
            out = nn.functional.cross_entropy(model(x[lo:hi]), y[lo:hi], reduction="none")
            loss = out.mean() * (hi - lo) / 12
            micro = {"loss": loss, "individual_losses": out, "batch_size": hi - lo}
            with run.micro_batch({**micro, "inputs": x[lo:hi], "targets": y[lo:hi]}):
                loss.backward()

    expected, actual = whole.get_output()[0], split.get_output()[0]
    assert set(actual) == set(QUANTITIES)
    for key in ("grad_norm", "norm_test", "inner_test", "mean_gsnr"):
        torch.testing.assert_close(
            _flat(actual[key]), _flat(expected[key]), rtol=1e-10, atol=1e-12, msg=key
        )
    assert _flat(actual["grad_hist_1d"]).tolist() == _flat(expected["grad_hist_1d"]).tolist()


def _flat(value) -> torch.Tensor:
    """Every number of a (nested) value, in a fixed order."""
    if isinstance(value, dict):
        return torch.cat([_flat(value[k]) for k in sorted(value)])
    return torch.as_tensor(value, dtype=torch.float64).reshape(-1)
