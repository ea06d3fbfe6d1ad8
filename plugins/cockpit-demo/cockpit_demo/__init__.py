"""cockpit-demo: ``cockpit demo``, a small network trained on bundled data with cockpit on.

:mod:`cockpit_demo.training` trains the demo (once, or once per learning rate),
:mod:`cockpit_demo.scenarios` trains it in deliberately bad ways for the diagnoses, and
:mod:`cockpit_demo.command` is the ``cockpit demo`` command that :mod:`cockpit_demo.plugin`
registers.
"""
