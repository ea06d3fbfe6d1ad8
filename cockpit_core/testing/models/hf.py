"""Tiny ``transformers`` language models, built from configurations (no download).

``transformers`` is imported when a model is built: it is an optional dependency of
``cockpit-core`` (the ``huggingface`` extra).
"""

from __future__ import annotations

import torch


def tiny_gpt2(
    seed: int = 0, vocab: int = 40, positions: int = 16, d: int = 24, layers: int = 2
) -> torch.nn.Module:
    """``GPT2LMHeadModel``: ``Conv1D`` layers, ``lm_head`` tied to ``wte``, positions ``[1, T]``.

    Dropout is off (``*_pdrop=0``) so that a forward pass is deterministic.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_embd=d,
        n_layer=layers,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def tiny_llama(
    seed: int = 0, vocab: int = 40, d: int = 24, layers: int = 2, tie: bool = False
) -> torch.nn.Module:
    """``LlamaForCausalLM``: its own ``LlamaRMSNorm`` class, gated MLP, rotary positions, GQA."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=2 * d,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        tie_word_embeddings=tie,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)
