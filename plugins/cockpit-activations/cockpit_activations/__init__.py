"""cockpit-activations: quantities read from the forward pass (activation size, output logits)."""

from cockpit_activations.activations import Activations
from cockpit_activations.logits import Logits

__all__ = ["Activations", "Logits"]
