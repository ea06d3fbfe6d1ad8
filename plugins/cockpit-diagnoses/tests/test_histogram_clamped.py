"""histogram_clamped: a range narrower than the gradients puts them into the edge bins."""

import numpy as np
import pytest
import torch
from cockpit_diagnoses import HistogramClamped

from cockpit_core.diagnosis import Window


def test_a_narrow_range_is_reported_from_the_first_step(run, kit):
    hist = {"name": "grad_hist_1d", "range": [-1e-3, 1e-3]}
    out = run([hist], steps=12, lr=0.3)
    (f,) = HistogramClamped().check(Window(out))
    assert (f.first_step, f.last_step) == (0, 11) and f.evidence["range"] == [-1e-3, 1e-3]
    # brute force on step 0: the share of per-sample gradient elements outside the range
    model = kit.make_model(0)
    x, y = kit.make_data(0)
    # the first mini-batch of the run (train draws it from a generator seeded like this)
    idx = torch.randint(0, len(x), (32,), generator=torch.Generator().manual_seed(0))
    outside = total = 0
    for n in idx.tolist():
        model.zero_grad()
        kit.per_sample_losses("classify", model(x[n : n + 1]), y[n : n + 1]).sum().backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
        outside += int(((g < -1e-3) | (g > 1e-3)).sum())
        total += g.numel()
    hist0 = np.asarray(out[0]["grad_hist_1d"]["hist"], dtype=np.float64)
    # the histogram's edge bins hold at least the elements outside its range
    assert (hist0[0] + hist0[-1]) >= outside and hist0.sum() == total
    assert f.evidence["median_edge_share"] > 0.5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_default_range_holds_a_healthy_run(run, seed):
    out = run(["grad_hist_1d"], steps=12, lr=0.3, seed=seed)
    assert HistogramClamped().check(Window(out)) == []
