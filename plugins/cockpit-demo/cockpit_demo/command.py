"""The ``cockpit demo`` command: its arguments and what it runs.

Train a 64-32-10 MLP on scikit-learn's bundled 8x8 digits, or with ``--model gpt`` a small
nanoGPT on a generated token stream (nothing is downloaded), with cockpit tracking the
chosen quantities, and write the log, ``output.json`` and the dashboard picture into a run
folder (:func:`cockpit_demo.training.run_demo`); with
``--compare-lr`` once per learning rate (:func:`cockpit_demo.training.run_compare_lr`), with
``--scenario`` in a deliberately bad way (:mod:`cockpit_demo.scenarios`). Progress goes to
standard error: a bar on a terminal, otherwise a line at every tenth of the run. The
training modules (and torch) are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys

from cockpit_core.cli.main import positive_int

MODELS = ("mlp", "gpt")
"""The choices of ``--model``: the keys of :data:`cockpit_demo.training.MODELS`, named here
so that the command's parser does not import the training code (and torch)."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``cockpit demo`` to ``parser``."""
    parser.description = (
        "Train a 64-32-10 MLP on scikit-learn's bundled 8x8 digits, or with --model gpt a "
        "small nanoGPT on a generated token stream (nothing is downloaded), with cockpit "
        "tracking the chosen quantities, and write the log, output.json and the dashboard "
        "picture into a run folder. Progress goes to standard error: a bar on a terminal, "
        "otherwise a line at every tenth of the run."
    )
    parser.add_argument(
        "--model",
        default="mlp",
        choices=MODELS,
        help="mlp: a 64-32-10 MLP on the 8x8 digits, SGD (default); gpt: a 2-layer nanoGPT "
        "(causal attention) learning the next token of a seeded Markov chain, AdamW; "
        "'--preset health' draws its forward-pass panels",
    )
    parser.add_argument(
        "--preset", default="economy", help="preset or comma-separated quantities (default economy)"
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="training steps (default 300; with --scenario, the scenario's)",
    )
    parser.add_argument("--out", default=None, help="run folder (default runs/demo-<time>)")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument(
        "--compare-lr",
        default=None,
        metavar="LR,LR,...",
        help="train once per learning rate (e.g. 0.01,0.1,1) from the same start and write "
        "the logs and one comparison picture, compare_lr.png, into --out (default "
        "runs/compare-lr-<time>)",
    )
    parser.add_argument(
        "--scenario",
        default=None,
        metavar="NAME",
        help="train the MLP in a deliberately bad way (lr_too_high, lr_too_low, "
        "batch_too_small, dead_layer, spike; healthy is the control) and print what the "
        "diagnoses find; exit code as cockpit diagnose. 'list' lists them",
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo training (once per learning rate with ``--compare-lr``).

    An unknown preset or quantity, a learning rate that is not a positive number, or
    ``--scenario`` with ``--model gpt`` (the scenarios train the MLP) is a usage error (exit
    2, through ``args.usage_error``); argparse rejects an unknown ``--model``.

    Returns:
        The exit code: 0, or with ``--scenario`` that of :func:`run_scenario_command`.

    """
    from cockpit_demo.training import demo_quantities, run_compare_lr, run_demo

    if args.scenario is not None:
        if args.model != "mlp":
            args.usage_error(
                f"argument --scenario: the scenarios train the MLP; leave out --model {args.model}"
            )
        return run_scenario_command(args)
    steps = 300 if args.steps is None else args.steps
    try:
        demo_quantities(args.preset)
    except ValueError as err:  # ConfigError: the message names the installed ones
        messages = [message for _, message in getattr(err, "errors", ())] or [str(err)]
        args.usage_error(f"argument --preset: {' '.join(messages)}")
    if args.compare_lr is None:
        run_demo(preset=args.preset, steps=steps, out=args.out, seed=args.seed, model=args.model)
        return 0
    try:
        lrs = [float(lr) for lr in _names(args.compare_lr)]
    except ValueError:
        lrs = []
    if not lrs or not all(0 < lr < float("inf") for lr in lrs):
        args.usage_error(
            f"argument --compare-lr: expected positive learning rates such as 0.01,0.1,1, "
            f"got {args.compare_lr!r}"
        )
    run_compare_lr(
        lrs, preset=args.preset, steps=steps, out=args.out, seed=args.seed, model=args.model
    )
    return 0


def run_scenario_command(args: argparse.Namespace) -> int:
    """``cockpit demo --scenario NAME``: 0/1 as ``cockpit diagnose``; a list for ``list``.

    ``list`` prints the scenarios (exit 0); an unknown name prints them on standard error
    (exit 2).

    Returns:
        The exit code.

    """
    from cockpit_demo.scenarios import SCENARIOS, run_scenario, scenario_list

    if args.scenario == "list":
        print(scenario_list())
        return 0
    if args.scenario not in SCENARIOS:
        print(f"error: unknown scenario {args.scenario!r}.\n{scenario_list()}", file=sys.stderr)
        return 2
    return run_scenario(args.scenario, steps=args.steps, out=args.out, seed=args.seed)[1]


def _names(spec: str) -> list[str]:
    """The non-empty comma-separated items of ``spec``, stripped."""
    return [name.strip() for name in spec.split(",") if name.strip()]
