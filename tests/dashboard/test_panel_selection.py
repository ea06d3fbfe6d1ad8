"""Selecting dashboard panels by name; an unknown name says what exists (issue 21)."""

import matplotlib
import pytest
from cockpit_dashboard import render

from cockpit_core import UnknownInstrumentError, UnknownNameError

matplotlib.use("Agg")

OUTPUT = {
    s: {"loss": 1.0 / (s + 1), "grad_norm": {"total": 2.0, "per_param": [1.0]}} for s in range(3)
}


def test_panels_draws_only_the_named_instruments():
    assert len(render(OUTPUT).axes) == 3  # loss, gradient norm, gradient norm per layer
    assert len(render(OUTPUT, panels=["loss"]).axes) == 1
    assert len(render(OUTPUT, panels=["grad_norm", "loss", "loss"]).axes) == 2


def test_an_unknown_panel_name_names_the_closest_and_lists_the_panels():
    with pytest.raises(UnknownInstrumentError) as err:
        render(OUTPUT, panels=["gradnorm"])
    message = str(err.value)
    assert message.startswith("Unknown panel 'gradnorm'. Did you mean 'grad_norm'? Installed: ")
    assert "loss" in message and "Run `cockpit plugins -v` to list the panels" in message
    assert isinstance(err.value, UnknownNameError) and isinstance(err.value, KeyError)
