"""The dashboard panels draw on a short run of their quantities."""

import pytest
from cockpit_core.testing import check_instrument

from cockpit_example import MaxSampleGradNorm
from cockpit_example.instruments import INSTRUMENTS


@pytest.mark.parametrize("instrument", INSTRUMENTS, ids=lambda i: i.name)
def test_panel_draws(instrument):
    # warnings and exceptions while drawing fail with their message
    fig = check_instrument(instrument, quantities=[MaxSampleGradNorm])
    assert fig.axes[0].get_ylabel() == r"$\max_n \|g_n\|$"
