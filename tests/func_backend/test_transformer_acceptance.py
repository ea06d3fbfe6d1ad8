"""Issue 16's acceptance: a transformer's first-order quantities through module hooks.

On the tiny transformer encoder classifier shipped in :mod:`cockpit_core.testing`
(embedding, learned positions, attention, LayerNorm, GELU), every first-order quantity
computed with ``backend="auto"`` equals the same quantity computed by the brute-force
per-sample loop (the ``loop`` test provider: one autograd call per sample). Both run in
float64 and differ only in summation order (about ``1e-15`` relative per statistic, see
``plugins/cockpit-hooks/tests``); ``1e-10`` leaves room for the quantities' own
divisions (e.g. the norm test's ``(B - 1)`` variance over a squared norm) without hiding
a wrong term, which would be of order one. Histogram counts must be identical.

``auto`` must route every parameter to module hooks, the learned positional embedding
``pos`` (a parameter the model adds to the batch in its own forward) included, and nothing
may fall back at run time (the fallback's ``CockpitWarning`` is an error here).
"""

from __future__ import annotations

import pytest

from cockpit_core import BATCH_L2
from cockpit_core.testing import tiny_transformer

from ._helpers import FIRST_ORDER, assert_close, train

pytest.importorskip("cockpit_hooks")

QUANTITIES = [*FIRST_ORDER, "grad_norm"]


@pytest.mark.filterwarnings("error::cockpit_core.CockpitWarning")
def test_every_first_order_quantity_through_hooks_equals_the_per_sample_loop():
    problem = tiny_transformer(extended=False)
    hooks = train(problem, QUANTITIES, steps=3, backend="auto")
    loop = train(problem, QUANTITIES, steps=3, loop_reference=True)

    served = {n: r.provider for n, r in zip(hooks.param_names, hooks._router.routes(BATCH_L2))}
    report = hooks.check(hooks._router.model)  # the trained model
    assert report.ok
    assert {name: route.served for route in report.params for name in route.names} == served
    assert set(served.values()) == {"hooks"}

    out, expected = hooks.get_output(), loop.get_output()
    assert sorted(out) == [0, 1, 2]
    assert set(out[0]) == set(out[1]) == set(QUANTITIES)
    assert set(out[2]) == set(QUANTITIES) - {"alpha"}  # alpha of a step needs the next one
    assert not hooks.errors
    assert_close(out, expected, rtol=1e-10, atol=1e-13)
