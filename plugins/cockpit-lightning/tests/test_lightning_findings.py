"""Findings of ``diagnoses=[...]`` in Lightning: rank-zero warnings and counts in the loggers.

A test diagnosis (``fires``, in ``_common``) fires at every step; the findings must be
warned once each through Lightning's ``rank_zero_warn`` (not also as the Cockpit's own
warning), on global rank 0 only, with or without loggers, and the counts read back from
the ``CSVLogger`` must equal ``cp.findings`` by severity.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

# the helpers shared with the core's tests (tests/integrations/_common.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "integrations"))
from _common import (  # noqa: E402
    FIRES_EXPECTED,
    STEPS,
    data,
    fires_registry,
    import_framework,
    plain_model,
    read_csv,
    severity_counts,
)

pl = import_framework("lightning.pytorch")

from cockpit_lightning import CockpitCallback  # noqa: E402

from cockpit_core import CockpitWarning  # noqa: E402
from cockpit_core.hosts.reporting import finding_text  # noqa: E402
from cockpit_core.log import read_run  # noqa: E402


class Plain(pl.LightningModule):
    """A stock module: nothing for cockpit in it."""

    def __init__(self):
        super().__init__()
        self.net = plain_model()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def _fit_diagnosed(tmp_path, logger, **options):
    """Fit ``Plain`` for ``STEPS`` steps with the test diagnosis ``fires``; the warnings too."""
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    callback = CockpitCallback(
        quantities=["loss", "grad_norm"],
        diagnoses=["fires"],
        registry=fires_registry(),
        log=tmp_path / "run.jsonl",
        dashboard=False,
        **options,
    )
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        callbacks=[callback],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Plain(), loader)
    texts = [str(w.message) for w in caught if "fires:" in str(w.message)]
    assert all(issubclass(w.category, CockpitWarning) for w in caught if "fires:" in str(w.message))
    return callback.cockpit, texts


def test_findings_are_rank_zero_warnings_once_and_counted_in_the_loggers(tmp_path):
    """Each finding warns once (not twice: the Cockpit's own warning is off), the CSV
    holds the number of findings so far of each severity at the step they came."""
    logger = pl.loggers.CSVLogger(tmp_path, name="csv")
    cp, texts = _fit_diagnosed(tmp_path, logger)

    assert severity_counts(cp.findings) == FIRES_EXPECTED
    assert texts == [finding_text(f) for f in cp.findings]  # each once, in order
    assert "cockpit: WARNING fires: the test rule fired (step 0). A test." in texts
    assert "cockpit: ERROR   fires: step one (step 1). Stop." in texts
    assert "cockpit: INFO    fires: first step (step 0)" in texts  # no suggestion
    logged = read_csv(Path(logger.log_dir) / "metrics.csv")
    counts = {
        s: {sev: logged[s][f"cockpit/findings/{sev}"] for sev in FIRES_EXPECTED} for s in (0, 1)
    }
    assert counts == {0: {"info": 1, "warning": 1, "error": 0}, 1: FIRES_EXPECTED}
    assert len(read_run(tmp_path / "run.jsonl").findings) == 4  # the log has them all


@pytest.mark.parametrize("rank", [0, 1])
def test_findings_warn_on_global_rank_zero_only_and_without_a_logger(tmp_path, monkeypatch, rank):
    """No logger: still warned (rank 0) and in ``cp.findings`` and the log on every rank."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", rank)
    cp, texts = _fit_diagnosed(tmp_path, False)

    assert severity_counts(cp.findings) == FIRES_EXPECTED
    assert texts == ([finding_text(f) for f in cp.findings] if rank == 0 else [])
    assert len(read_run(tmp_path / "run.jsonl").findings) == 4


def test_findings_false_leaves_the_cockpits_own_warning_and_logs_no_counts(tmp_path):
    logger = pl.loggers.CSVLogger(tmp_path, name="csv")
    cp, texts = _fit_diagnosed(tmp_path, logger, findings=False)

    core = [f"cockpit: {f.line()}. {f.suggestion}" for f in cp.findings]  # tracker.py's words
    assert texts == core and len(texts) == 4
    logged = read_csv(Path(logger.log_dir) / "metrics.csv")
    assert "cockpit/loss" in logged[0]
    assert not any(k.startswith("cockpit/findings/") for row in logged.values() for k in row)
