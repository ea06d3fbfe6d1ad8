"""A GPT written the way nanoGPT writes it (Karpathy, 2022), small enough for float64 tests.

Token embedding ``wte`` tied to the output head (``lm_head.weight is wte.weight``), learned
positions looked up once for the whole batch (``wpe(arange(T))``, shape ``[T, d]``,
broadcast in ``tok + pos``), a LayerNorm class of its own (``F.layer_norm`` with its own
``weight`` and optional ``bias``), causal self-attention through
``F.scaled_dot_product_attention(..., is_causal=True)``, a GELU MLP, dropout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (what ``nn.LayerNorm`` lacked before PyTorch 2.1)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one packed input projection."""

    def __init__(self, d: int, heads: int, dropout: float, bias: bool):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.c_proj = nn.Linear(d, d, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)
        self.heads, self.d, self.dropout = heads, d, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(self.d, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=True,
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        out: torch.Tensor = self.resid_dropout(self.c_proj(y))
        return out


class MLP(nn.Module):
    """Linear, GELU, linear, dropout."""

    def __init__(self, d: int, dropout: float, bias: bool):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        out: torch.Tensor = self.dropout(self.c_proj(self.gelu(self.c_fc(x))))
        return out


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, d: int, heads: int, dropout: float, bias: bool):
        super().__init__()
        self.ln_1 = LayerNorm(d, bias)
        self.attn = CausalSelfAttention(d, heads, dropout, bias)
        self.ln_2 = LayerNorm(d, bias)
        self.mlp = MLP(d, dropout, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        x = x + self.attn(self.ln_1(x))
        mlp: torch.Tensor = self.mlp(self.ln_2(x))
        return x + mlp


class NanoGPT(nn.Module):
    """The GPT of nanoGPT: ``model(idx, targets) -> (logits, loss)``.

    Args:
        vocab: Vocabulary size.
        block_size: Longest sequence (rows of the position table).
        d: Width.
        heads: Attention heads.
        layers: Blocks.
        dropout: Dropout probability (attention, residual, embedding).
        bias: Biases in the linear layers and LayerNorms.

    """

    def __init__(
        self,
        vocab: int = 40,
        block_size: int = 16,
        d: int = 24,
        heads: int = 2,
        layers: int = 2,
        dropout: float = 0.0,
        bias: bool = True,
    ):
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab, d),
                "wpe": nn.Embedding(block_size, d),
                "drop": nn.Dropout(dropout),
                "h": nn.ModuleList([Block(d, heads, dropout, bias) for _ in range(layers)]),
                "ln_f": LayerNorm(d, bias),
            }
        )
        self.lm_head = nn.Linear(d, vocab, bias=False)
        # as nanoGPT writes it; typed, ModuleDict attributes are Tensor | Module (hence the ignores)
        self.transformer.wte.weight = self.lm_head.weight  # type: ignore[union-attr]  # tying
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / (2 * layers) ** 0.5)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[B, T, vocab]`` of token ids ``[B, T]``, and the mean loss if ``targets``."""
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # type: ignore[operator]
        for block in self.transformer.h:  # type: ignore[union-attr]
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))  # type: ignore[operator]
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
        return logits, loss
