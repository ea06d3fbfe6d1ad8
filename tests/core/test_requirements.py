import pytest

from cockpit_core import (
    BATCH_L2,
    DIAG_HESSIAN,
    RequirementConflictError,
    Requirements,
    diag_ggn_mc,
    per_sample_transform,
)
from cockpit_core.requirements import merge_requirements
from cockpit_core.statistics.statistic import Statistic


def test_shared_statistics_are_merged_once_with_all_owners():
    merged = merge_requirements(
        [
            ("norm_test", Requirements(statistics=(BATCH_L2,))),
            ("inner_test", Requirements(statistics=(BATCH_L2, DIAG_HESSIAN))),
            ("hess_max_ev", Requirements(loss_graph=True)),
        ]
    )
    assert merged.statistics == (BATCH_L2, DIAG_HESSIAN)
    assert merged.owners[BATCH_L2.identity] == ("norm_test", "inner_test")
    assert merged.loss_graph and merged.per_sample


def test_conflicting_hyperparameters_name_both_quantities_and_the_fix():
    with pytest.raises(RequirementConflictError) as err:
        merge_requirements(
            [
                ("hess_trace", Requirements(statistics=(diag_ggn_mc(1),))),
                ("tic_diag", Requirements(statistics=(diag_ggn_mc(4),))),
            ]
        )
    msg = str(err.value)
    assert "'hess_trace'" in msg and "'tic_diag'" in msg
    assert "mc_samples=1" in msg and "mc_samples=4" in msg
    assert "same options" in msg


def test_transforms_with_different_keys_are_distinct():
    a = per_sample_transform("hist(bins=10)", lambda g, p: g.sum(0))
    b = per_sample_transform("hist(bins=20)", lambda g, p: g.sum(0))
    merged = merge_requirements(
        [("a", Requirements(statistics=(a,))), ("b", Requirements(statistics=(b,)))]
    )
    assert len(merged.statistics) == 2


def test_unknown_statistic_kind_is_rejected():
    with pytest.raises(ValueError, match="Unknown statistic kind 'foo'"):
        Requirements(statistics=(Statistic("foo"),))
    with pytest.raises(ValueError, match="per_sample_transform"):
        Requirements(statistics=(Statistic("transform", key="x"),))
