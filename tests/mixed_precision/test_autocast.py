"""bf16 autocast: statistics of a float32 model whose activations are bfloat16.

Tolerances against the float32 run: bfloat16 keeps 8 significant bits, so every
activation and output gradient carries a relative rounding of up to 2**-9 (0.2%); through
two layers, the loss and three training steps this reaches about 2% in the loss, gradient
norms, update sizes and the top Hessian eigenvalue (rtol 0.05). The gradient tests and
alpha are ratios of sample variances of 16 samples, which amplify it (up to ~5% measured;
rtol 0.15). Histograms: counts move between neighbouring bins, so the total must agree
and at most 5% of the counts may move.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _train import QUANTITIES, assert_same_statistics, flatten, train  # noqa: E402

FIRST_ORDER = [q for q in QUANTITIES if q not in ("tic_diag", "hess_trace")]
RATIOS = {q: (0.15, 1e-3) for q in ("alpha", "inner_test", "norm_test", "ortho_test")}


def _compare_histograms(bf16, fp32) -> None:
    out, ref = bf16._output, fp32._output  # compared here, then left out of the rest
    for step in ref:
        got, want = flatten(out[step].pop("grad_hist_1d")), flatten(ref[step].pop("grad_hist_1d"))
        counts, expected = np.asarray(got["hist"]), np.asarray(want["hist"])
        assert counts.sum() == expected.sum()
        assert np.abs(counts - expected).sum() <= 0.05 * expected.sum()


@pytest.mark.parametrize(
    "path",
    [
        "hooks",
        "backpack",
    ],
)
def test_bf16_autocast_gives_the_float32_statistics(path):
    fp32 = train("plain", path, FIRST_ORDER)
    bf16 = train("bf16", path, FIRST_ORDER)
    assert not bf16.errors, [e["error"] for e in bf16.errors]
    _compare_histograms(bf16, fp32)
    for cp in (bf16, fp32):  # alpha's "exact" flag depends on rounding, not on the value
        for values in cp._output.values():
            if "alpha" in values:
                values["alpha"].pop("exact")
    assert_same_statistics(bf16, fp32, rtol=0.05, atol=1e-6, tolerances=RATIOS)


def test_curvature_diagonals_under_bf16_autocast_are_reported_not_wrong():
    """BackPACK's DiagHessian does not accept bf16 activations: an error, never a number."""
    quantities = ["tic_diag", "hess_trace"]
    fp32 = train("plain", "backpack", quantities).get_output()
    bf16 = train("bf16", "backpack", quantities)
    failed = {(e["step"], e["quantity"]) for e in bf16.errors}
    for step, values in fp32.items():
        for key, value in values.items():
            if (step, key) in failed:
                continue
            np.testing.assert_allclose(
                bf16.get_output()[step][key]["total"], value["total"], rtol=0.05
            )
    assert all("BackPACK" in e["error"] for e in bf16.errors)
