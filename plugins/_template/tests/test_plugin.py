"""Everything the plugin registers, loaded the way cockpit loads it."""

from importlib.metadata import PackageNotFoundError, distribution

from cockpit_core.testing import check_plugin

import cockpit_example.plugin


def installed() -> bool:
    """Whether the distribution is installed (`pip install -e .`)."""
    try:
        distribution("cockpit-example")
    except PackageNotFoundError:
        return False
    return True


def test_everything_the_plugin_registers():
    # by its entry point once installed, else the module itself (a source checkout)
    report = check_plugin("example" if installed() else cockpit_example.plugin)
    assert report.checked == [
        "quantity max_sample_grad_norm",
        "instrument max_sample_grad_norm",
    ]
