"""Models as practitioners write them, for tests and benchmarks of per-sample statistics.

Each reproduces a pattern that model code in the wild uses and that per-sample statistics
must handle in the user's own forward pass:

* :class:`NanoGPT` (nanoGPT-style): token embedding tied to the output head, positions
  looked up once for the batch (``wpe(arange(T))``), a hand-written LayerNorm class,
  causal ``scaled_dot_product_attention``;
* :class:`ViT`: a ``cls`` token and a position table as bare parameters, expanded and
  broadcast into the batch in ``forward``;
* :func:`tiny_gpt2`, :func:`tiny_llama`: ``transformers``' ``GPT2LMHeadModel`` (``Conv1D``
  layers, tied head, positions ``[1, T]``) and ``LlamaForCausalLM`` (its own RMSNorm
  class, gated MLP, rotary positions) from tiny configurations (no download; needs
  ``transformers``).
"""

from cockpit_core.testing.models.hf import tiny_gpt2, tiny_llama
from cockpit_core.testing.models.nanogpt import NanoGPT
from cockpit_core.testing.models.vit import ViT

__all__ = ["NanoGPT", "ViT", "tiny_gpt2", "tiny_llama"]
