"""The conformance kit for quantity authors: protocol checks, tiny problems, brute-force references.

Typical plugin test::

    from cockpit_core.testing import check_quantity, run_cockpit, tiny_mlp
    from cockpit_core.testing.reference import per_sample_gradients

    def test_protocol():
        check_quantity(MyQuantity)

    def test_value_matches_definition():
        result = run_cockpit(tiny_mlp(), [MyQuantity()], steps=3)
        for snap in result.snapshots:
            model = result.model_at(snap.step)
            grads = per_sample_gradients(model, result.problem, snap.x, snap.y)
            ...  # compute the definition, compare with result.output[snap.step]["my_quantity"]

Dashboard panels (instruments) are drawn on sample output, warnings counting as
failures::

    from cockpit_core.testing import check_instrument

    def test_my_panel_draws():
        check_instrument(MY_INSTRUMENT, quantities=[MyQuantity])

Statistics providers have their own kit (``docs/providers.md``)::

    from cockpit_core.testing import check_provider

    def test_my_provider():
        check_provider(MyProvider)

Everything one plugin registers, loaded as ``cockpit`` loads it, with all problems reported
at once::

    from cockpit_core.testing import check_plugin

    def test_everything_my_plugin_registers():
        check_plugin("my_plugin")  # its entry-point name, once installed

A quantity's tensor operations per tracked step should not grow with the number of
parameters (:mod:`cockpit_core.testing.operations`)::

    from cockpit_core.testing import quantity_operations

    def test_cost_does_not_grow_with_the_parameters():
        few = quantity_operations("my_quantity", hidden_layers=1, package=my_plugin)
        assert 0 < few == quantity_operations("my_quantity", hidden_layers=6, package=my_plugin)

Installing ``cockpit-core`` also registers a pytest plugin with the fixtures
``cockpit_tiny_mlp`` and ``cockpit_tiny_cnn``; :func:`tiny_transformer` is a model
BackPACK only partly supports (embedding, attention, LayerNorm).
"""

from cockpit_core.testing.conformance import ConformanceError, check_quantity
from cockpit_core.testing.instrument_checks import check_instrument
from cockpit_core.testing.operations import OperationCounter, quantity_operations
from cockpit_core.testing.plugin_checks import PluginReport, check_plugin
from cockpit_core.testing.problems import Problem, tiny_cnn, tiny_mlp
from cockpit_core.testing.providers.kit import ProviderReport, check_provider
from cockpit_core.testing.runner import RunResult, StepSnapshot, run_cockpit
from cockpit_core.testing.transformer import tiny_transformer

__all__ = [
    "ConformanceError",
    "OperationCounter",
    "PluginReport",
    "Problem",
    "ProviderReport",
    "RunResult",
    "StepSnapshot",
    "check_instrument",
    "check_plugin",
    "check_provider",
    "check_quantity",
    "quantity_operations",
    "run_cockpit",
    "tiny_cnn",
    "tiny_mlp",
    "tiny_transformer",
]
