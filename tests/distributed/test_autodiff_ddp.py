"""The ``autodiff`` provider under torch.distributed (2 processes, gloo, CPU, float64).

Each process recomputes the diagonals of its local mean loss (unequal local batches 4/2);
the core combines them as ``sum_r (B_r / N) diag_r`` (``combine="mean"``). Every process's
``hess_trace`` (Hessian and GGN) must equal the explicit float64 references of the global
batch (step 0), and every quantity one process on the global batch (both steps), to 1e-10.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _autodiff_problem import assert_matches, one_batch  # noqa: E402
from test_ddp import launch  # noqa: E402

pytest.importorskip("cockpit_autodiff")


def test_autodiff_diagonals_of_two_processes_equal_one_process(tmp_path):
    expected, references = one_batch()
    outputs = launch("_autodiff_worker.py", 2, tmp_path)
    for rank, result in enumerate(outputs):
        assert "hess_trace  ok           autodiff" in result["check"], result["check"]
        assert_matches(result["output"], expected, references, f"rank {rank}")
