"""Weights stacked across layers, as transformer-lens exposes them: `model.W_Q` is
`[n_layers, n_heads, d_model, d_head]`. Offered on `GPT` through `StackedWeightsMixin`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor, nn

if TYPE_CHECKING:
    from .model import Embed, PosEmbed, Unembed


def _stacked(module: str, param: str) -> property:
    """A property: `blocks[L].<module>.<param>` of every layer L, stacked on a new first axis."""

    def get(self: StackedWeightsMixin) -> Tensor:
        return torch.stack([getattr(getattr(block, module), param) for block in self.blocks])

    return property(get, doc=f"{module}.{param} of every layer, stacked: [n_layers, ...] (a copy)")


class StackedWeightsMixin:
    """`W_E`, `W_pos`, `W_U` and every per-layer weight stacked on a new first axis (a copy)."""

    if TYPE_CHECKING:  # what GPT provides
        embed: Embed
        pos_embed: PosEmbed
        unembed: Unembed
        blocks: nn.ModuleList

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.W_E

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        return self.pos_embed.W_pos

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.unembed.W_U

    # Each a new tensor [n_layers, *shape of one layer's]: W_Q, W_K, W_V [n_layers, n_heads, d_model, d_head],
    # W_O [n_layers, n_heads, d_head, d_model], b_Q, b_K, b_V [n_layers, n_heads, d_head], b_O [n_layers, d_model],
    # W_in [n_layers, d_model, d_mlp], W_out [n_layers, d_mlp, d_model], b_in [n_layers, d_mlp], b_out [n_layers, d_model].
    W_Q, W_K, W_V, W_O = (_stacked("attn", p) for p in ("W_Q", "W_K", "W_V", "W_O"))
    b_Q, b_K, b_V, b_O = (_stacked("attn", p) for p in ("b_Q", "b_K", "b_V", "b_O"))
    W_in, W_out, b_in, b_out = (_stacked("mlp", p) for p in ("W_in", "W_out", "b_in", "b_out"))
