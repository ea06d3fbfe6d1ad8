"""cockpit-attention: attention logits and entropy per layer and head, read from the forward pass."""

from cockpit_attention.attention import Attention, AttentionConfig

__all__ = ["Attention", "AttentionConfig"]
