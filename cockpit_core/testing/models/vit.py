"""A Vision Transformer with a ``cls`` token and a position table as bare parameters.

Patches by a strided convolution, ``torch.cat((cls_token.expand(B, -1, -1), x), 1)``,
``x + pos_embed`` (``[1, N + 1, d]`` broadcast over the batch), pre-norm
``nn.TransformerEncoderLayer`` blocks, the ``cls`` output into a linear head (Dosovitskiy
et al., 2021, "An image is worth 16x16 words").
"""

from __future__ import annotations

import torch
from torch import nn


class ViT(nn.Module):
    """``model(images [B, C, H, W]) -> logits [B, classes]``.

    Args:
        image: Height and width of the images.
        patch: Height and width of a patch.
        channels: Input channels.
        d: Width.
        heads: Attention heads.
        layers: Encoder layers.
        classes: Output classes.
        dropout: Dropout in the encoder layers.

    """

    def __init__(
        self,
        image: int = 8,
        patch: int = 4,
        channels: int = 3,
        d: int = 24,
        heads: int = 2,
        layers: int = 2,
        classes: int = 5,
        dropout: float = 0.0,
    ):
        super().__init__()
        patches = (image // patch) ** 2
        self.patch_embed = nn.Conv2d(channels, d, patch, patch)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, d))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, patches + 1, d))
        self.blocks = nn.Sequential(
            *[
                nn.TransformerEncoderLayer(
                    d, heads, 2 * d, dropout=dropout, batch_first=True, norm_first=True
                )
                for _ in range(layers)
            ]
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # noqa: D102
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.blocks(x + self.pos_embed)
        logits: torch.Tensor = self.head(self.norm(x)[:, 0])
        return logits
