"""Tracking hess_max_ev at every step keeps memory flat and never warns about reference cycles.

The core takes the gradient graph with ``torch.autograd.grad(create_graph=True)`` from the
loss graph that ``loss.backward(retain_graph=cp.retain_graph(step))`` keeps, so no
parameter/gradient reference cycle is created (Cockpit issue #30).
"""

from __future__ import annotations

import gc
import os
import warnings
import weakref

import torch
from cockpit_curvature import HessMaxEV

from cockpit_core import Cockpit
from cockpit_core.testing import tiny_mlp


def _live_tensors() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor))


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _train(steps: int, create_graph: bool = False, probe_at: tuple[int, ...] = ()):
    problem = tiny_mlp()
    model = problem.make_model()
    loss_fn = problem.loss_module()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cp = Cockpit(model.named_parameters(), [HessMaxEV()], keep_in_memory=False)
    losses, probes = [], {}
    for step in range(steps):
        x, y = problem.batch(step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        with cp(step, info={"loss": loss, "batch_size": len(x)}):
            if create_graph:  # Cockpit 1.0.2's spelling
                loss.backward(create_graph=cp.create_graph(step))
            else:
                loss.backward(retain_graph=cp.retain_graph(step))
        opt.step()
        losses.append(weakref.ref(loss))
        if step in probe_at:
            probes[step] = (_live_tensors(), _rss_bytes(), len(cp._tracker.cache))
    del loss
    gc.collect()
    return cp, losses, probes


def test_1000_tracked_steps_keep_memory_flat_without_cycle_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # BackPACK's hooks warn at every HVP; recording those would itself grow memory
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        cp, losses, probes = _train(1000, probe_at=(100, 999))
    print("live tensors, RSS, cache entries after step 100 / 999:", probes[100], probes[999])
    cycle = [w for w in caught if "reference cycle" in str(w.message)]
    assert cycle == []
    assert not cp.errors
    (tensors_100, rss_100, cache_100), (tensors_999, rss_999, cache_999) = probes[100], probes[999]
    # no tensor (graph, eigenvector) accumulates; tensors kept by earlier tests' models
    # (BackPACK's stored inputs) may be released meanwhile when hooks are switched
    assert tensors_999 <= tensors_100
    assert cache_100 == cache_999 == 1  # only the warm-start eigenvector is kept
    # generous: the allocator may keep some pages; leaking only the Lanczos basis of each
    # step (20 x 74 float64) would add 11 MiB over these 900 steps, a graph far more
    assert rss_999 - rss_100 < 8 * 2**20, (rss_100, rss_999)
    # every step's loss (and with it the graph it holds) is freed
    assert all(ref() is None for ref in losses)


def test_cockpit_style_create_graph_does_not_leak_either():
    # PyTorch warns about a reference cycle here (once per process, so an earlier test may
    # have used that warning up), but the core detaches the differentiable gradients after
    # each step, so nothing accumulates
    _, losses, probes = _train(60, create_graph=True, probe_at=(20, 59))
    assert probes[59][0] == probes[20][0]
    assert all(ref() is None for ref in losses)
