"""What cockpit observes of a training step itself: the batch size, the targets, the losses.

Knowing the model (``Cockpit(model, ...)``, ``cp.attach(model)``) and, for per-sample
losses, the loss (``loss_fn=``), cockpit fills the ``info`` a step needs from the step's own
forward pass, so that a loop needs only ``with cp(step, loss=loss): loss.backward()``.
A :class:`ForwardObserver` watches the forward passes of tracked steps only (the planner
arms it with the keys the coming step needs; an untracked step's model carries no hook of
cockpit's, so it may run compiled):

* **the model's call** (a forward pre-hook on the root module): the batch size, dimension 0
  of the first tensor argument; the targets, the argument bound to a parameter of the
  model's ``forward`` named ``labels``, ``targets``, ``target``, ``label`` or ``y``
  (``model(input_ids=x, labels=x)``, nanoGPT's ``model(idx, targets)``; for a ``forward``
  with ``*args``, the second of exactly two positional tensors); the other arguments are
  the inputs (``info["inputs"]`` for ``torch.func``);
* **the model's output** (a forward hook);
* **the loss call**: a call of the loss module (a forward hook on it), or, from the end of
  the model's forward pass to the start of the ``with cp(...)`` block, a call of
  ``F.cross_entropy``, ``F.mse_loss`` or ``F.binary_cross_entropy_with_logits`` whose input
  is the model's output or a view of it (a ``TorchFunctionMode`` placed at the bottom of
  the mode stack, so that modes entered and left meanwhile are unaffected).

Forward passes without gradients (evaluation under ``torch.no_grad()``), the passes that
statistics providers run themselves (``torch.func`` transforms, :meth:`paused`) and passes
of a copy of the model are ignored. When a step begins, :meth:`ForwardObserver.take` turns
the last forward pass since the previous take into ``info`` entries, and says for each
entry it could not fill why not; the per-sample losses (:mod:`cockpit_core.engine.losses`) are
computed only then, and only if the step needs them.

Modules: :mod:`~cockpit_core.observe.keys` (the ``info`` keys observed, and what to pass
instead), :mod:`~cockpit_core.observe.loss_spec` (the loss the user named),
:mod:`~cockpit_core.observe.forward_pass` (what one pass showed),
:mod:`~cockpit_core.observe.loss_catcher` (functional loss calls) and
:mod:`~cockpit_core.observe.observer` (the hooks).
"""

from cockpit_core.observe.forward_pass import ForwardPass, LossCall, Observed
from cockpit_core.observe.keys import NO_LOSS, NO_MODEL, OBSERVED_KEYS, how_to_pass, observed_keys
from cockpit_core.observe.loss_spec import LossSpec, loss_spec
from cockpit_core.observe.observer import ForwardObserver

__all__ = [
    "NO_LOSS",
    "NO_MODEL",
    "OBSERVED_KEYS",
    "ForwardObserver",
    "ForwardPass",
    "LossCall",
    "LossSpec",
    "Observed",
    "how_to_pass",
    "loss_spec",
    "observed_keys",
]
