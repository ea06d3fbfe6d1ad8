"""Demo scenarios: the digits demo trained in deliberately bad ways, then diagnosed.

``cockpit demo --scenario NAME`` trains :func:`cockpit_demo.training.run_demo`'s 64-32-10 MLP
(SGD with momentum 0.9) with one thing wrong, tracks the quantities the matching diagnosis
reads, runs that diagnosis while training and prints the report of ``cockpit diagnose`` on
the log. ``healthy`` is the control: the demo's usual settings, which give no warning.
See ``docs/diagnoses.md#demo-scenarios``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch

from cockpit_demo.training import make_model, run_demo


def make_dead_model() -> torch.nn.Module:
    """The demo MLP with a first-layer bias of -100: every ReLU is off for inputs in [0, 1].

    Nothing flows back through the ReLU, so the first layer's weight and bias get an exactly
    zero gradient, and so does the second layer's weight (its input is 0); only the last
    bias learns.
    """
    model = make_model()
    first_layer = cast(torch.nn.Linear, cast(torch.nn.Sequential, model)[0])  # see make_model
    with torch.no_grad():
        first_layer.bias.fill_(-100.0)
    return model


@dataclass(frozen=True)
class Scenario:
    """One way to train the demo (badly), and the finding it should produce.

    Attributes:
        description: What is wrong, in one line.
        quantities: What cockpit tracks (comma-separated names).
        diagnoses: What runs while training.
        expected: The id prefix of the finding it produces (``""``: none).
        lr: Learning rate of SGD with momentum 0.9.
        batch_size: Mini-batch size.
        steps: Default number of steps.
        build_model: Builds the network.
        spike: ``(share, factor)``: the update of step ``int(share * steps)`` is made with
            ``factor`` times the learning rate (one step; ``None``: no spike).

    """

    description: str
    quantities: str
    diagnoses: tuple[str, ...]
    expected: str
    lr: float = 0.1
    batch_size: int = 64
    steps: int = 60
    build_model: Callable[[], torch.nn.Module] = field(default=make_model)
    spike: tuple[float, float] | None = None

    def lr_at(self, steps: int) -> Callable[[int], float] | None:
        """The learning rate of each step of a run of ``steps`` (``None``: ``lr`` throughout)."""
        if self.spike is None:
            return None
        share, factor = self.spike
        at, lr = int(share * steps), self.lr
        return lambda step: lr * factor if step == at else lr


SCENARIOS: dict[str, Scenario] = {
    "healthy": Scenario(
        "the demo's settings (lr 0.1, batch 64): no warning",
        "loss,grad_norm",
        ("dead_layers", "exploding_gradients", "vanishing_gradients", "nonfinite"),
        "",
    ),
    "lr_too_high": Scenario(
        "lr 3: every step overshoots the minimum along its direction (alpha > 0)",
        "loss,grad_norm,alpha",
        ("step_size", "exploding_gradients", "nonfinite"),
        "step_size/overshoot",
        lr=3.0,
    ),
    "lr_too_low": Scenario(
        "lr 1e-4: the steps barely move (alpha near -1)",
        "loss,grad_norm,alpha",
        ("step_size",),
        "step_size/undershoot",
        lr=1e-4,
    ),
    "batch_too_small": Scenario(
        "batch 2: the mini-batch gradient is mostly noise (the norm test fails)",
        "loss,grad_norm,norm_test",
        ("batch_size",),
        "batch_size/norm_test",
        batch_size=2,
    ),
    "dead_layer": Scenario(
        "a first-layer bias of -100 switches every ReLU off: no gradient reaches it",
        "loss,grad_norm",
        ("dead_layers",),
        "dead_layers",
        build_model=make_dead_model,
    ),
    "spike": Scenario(
        "lr x30 for the update of one step, 70 % into the run: the loss spikes right after",
        "loss,grad_norm",
        ("loss_spike", "grad_norm_spike", "nonfinite"),
        "loss_spike",
        steps=100,
        spike=(0.7, 30.0),
    ),
}
"""The scenarios by name; ``healthy`` is the control."""


def scenario_list() -> str:
    """The scenarios, one per line: name, expected finding and description."""
    width = max(map(len, SCENARIOS))
    lines = ["Scenarios (cockpit demo --scenario NAME):"]
    for name, s in SCENARIOS.items():
        lines.append(f"  {name:{width}}  {s.expected or 'no finding':22}  {s.description}")
    return "\n".join(lines)


def run_scenario(
    name: str, steps: int | None = None, out: str | Path | None = None, seed: int = 0
) -> tuple[Path, int]:
    """Train scenario ``name``, print the ``cockpit diagnose`` report of its log.

    Args:
        name: A key of :data:`SCENARIOS`.
        steps: Training steps (default the scenario's).
        out: Run folder (default ``runs/demo-<timestamp>``).
        seed: Seed of the model initialisation and batch order.

    Returns:
        The run folder and the exit code ``cockpit diagnose`` gives its log (0 or 1).

    Raises:
        KeyError: ``name`` is not a scenario.

    """
    from cockpit_core.diagnosing.run import diagnose, exit_code, report_text

    s = SCENARIOS[name]
    print(f"Scenario {name}: {s.description}")
    steps = s.steps if steps is None else steps
    run = run_demo(
        s.quantities,
        steps=steps,
        out=out,
        seed=seed,
        batch_size=s.batch_size,
        lr=s.lr,
        picture=False,
        build_model=s.build_model,
        diagnoses=list(s.diagnoses),
        lr_at=s.lr_at(steps),
    )
    log = run / "log.jsonl"
    findings = diagnose(log)
    print(report_text(str(log), findings))
    return run, exit_code(findings)
