"""check_quantity turns failures of compute into ConformanceError; option typos get a hint."""

import pytest

from cockpit_core import SUM_GRAD_SQUARED, ConfigError, Quantity, Requirements
from cockpit_core.testing import ConformanceError, check_quantity


class ReadsMissingInfo(Quantity):
    name = "reads_missing_info"

    def compute(self, ctx):
        return float(ctx.info["lr_scale"])


class DeclaresMissingInfo(Quantity):
    name = "declares_missing_info"
    REQUIREMENTS = Requirements(info={"lr_scale"})

    def compute(self, ctx):
        return float(ctx.info["lr_scale"])


class ReadsUndeclaredStat(Quantity):
    name = "reads_undeclared_stat"

    def compute(self, ctx):
        return float(sum(s.sum() for s in ctx.stat(SUM_GRAD_SQUARED)))


class Fails(Quantity):
    name = "fails"

    def compute(self, ctx):
        raise RuntimeError("boom")


def test_a_missing_info_key_is_a_conformance_error():
    with pytest.raises(ConformanceError) as err:
        check_quantity(ReadsMissingInfo)
    assert str(err.value) == (
        "ReadsMissingInfo failed while tracked on the 'mlp' problem: KeyError 'lr_scale'. If "
        "compute reads ctx.info['lr_scale'], declare the key in its requirements "
        "(Requirements(info={'lr_scale'})) so a run without it fails with a clear "
        "MissingInfoError, and pass it with check_quantity(..., info_extra={...}); statistics "
        "are read with ctx.stat(...) after declaring them in Requirements(statistics=...)."
    )
    assert isinstance(err.value.__cause__, KeyError)


def test_a_declared_missing_info_key_is_a_conformance_error_and_info_extra_passes_it():
    with pytest.raises(ConformanceError) as err:
        check_quantity(DeclaresMissingInfo)
    message = str(err.value)
    assert message.startswith("DeclaresMissingInfo failed while tracked on the 'mlp' problem: ")
    assert "lr_scale" in message
    assert message.endswith(
        "check_quantity passes info with loss, individual_losses, batch_size and optimizer; "
        "give other keys with check_quantity(..., info_extra={...})."
    )
    check_quantity(DeclaresMissingInfo, info_extra={"lr_scale": 2.0})
    check_quantity(ReadsMissingInfo, info_extra={"lr_scale": 2.0})


def test_an_undeclared_statistic_is_a_conformance_error():
    with pytest.raises(ConformanceError) as err:
        check_quantity(ReadsUndeclaredStat)
    assert str(err.value).startswith(
        "ReadsUndeclaredStat failed while tracked on the 'mlp' problem: 'reads_undeclared_stat' "
        "reads statistic "
    )
    assert str(err.value).endswith(
        "that its requirements() do not declare; add it to Requirements(statistics=...)."
    )


def test_any_other_exception_is_named():
    with pytest.raises(ConformanceError) as err:
        check_quantity(Fails)
    assert str(err.value) == "Fails failed while tracked on the 'mlp' problem: RuntimeError: boom"


def test_option_typos_suggest_the_closest_option():
    from cockpit_histograms import GradHist1d

    with pytest.raises(ConfigError) as err:
        GradHist1d(bnis=3, evry=2, zzzz=1)
    assert err.value.errors == [
        (
            "grad_hist_1d.bnis",
            "unknown option, did you mean 'bins'? (check the spelling; `cockpit quantities` "
            "lists the options)",
        ),
        (
            "grad_hist_1d.evry",
            "unknown option, did you mean 'every'? (check the spelling; `cockpit quantities` "
            "lists the options)",
        ),
        (
            "grad_hist_1d.zzzz",
            "unknown option (check the spelling; `cockpit quantities` lists the options)",
        ),
    ]


def test_option_typos_in_a_config_file_suggest_the_closest_option():
    from cockpit_core import default_registry, resolve_quantities

    with pytest.raises(ConfigError) as err:
        resolve_quantities([{"name": "grad_hist_1d", "bnis": 3}], default_registry())
    assert "  quantities.0.bnis: unknown option, did you mean 'bins'? (check the spelling" in str(
        err.value
    )
