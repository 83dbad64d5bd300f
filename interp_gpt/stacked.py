"""Weights stacked across layers, as transformer-lens exposes them: `model.W_Q` is
`[n_layers, n_heads, d_model, d_head]`. Offered on `GPT` through `StackedWeightsMixin`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor, nn

if TYPE_CHECKING:
    from .model import Embed, PosEmbed, Unembed


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

    def _stack(self, module: str, param: str) -> Tensor:
        return torch.stack([getattr(getattr(b, module), param) for b in self.blocks])

    W_Q = property(lambda self: self._stack("attn", "W_Q"), doc="[n_layers, n_heads, d_model, d_head]")
    W_K = property(lambda self: self._stack("attn", "W_K"), doc="[n_layers, n_heads, d_model, d_head]")
    W_V = property(lambda self: self._stack("attn", "W_V"), doc="[n_layers, n_heads, d_model, d_head]")
    W_O = property(lambda self: self._stack("attn", "W_O"), doc="[n_layers, n_heads, d_head, d_model]")
    b_Q = property(lambda self: self._stack("attn", "b_Q"), doc="[n_layers, n_heads, d_head]")
    b_K = property(lambda self: self._stack("attn", "b_K"), doc="[n_layers, n_heads, d_head]")
    b_V = property(lambda self: self._stack("attn", "b_V"), doc="[n_layers, n_heads, d_head]")
    b_O = property(lambda self: self._stack("attn", "b_O"), doc="[n_layers, d_model]")
    W_in = property(lambda self: self._stack("mlp", "W_in"), doc="[n_layers, d_model, d_mlp]")
    W_out = property(lambda self: self._stack("mlp", "W_out"), doc="[n_layers, d_mlp, d_model]")
    b_in = property(lambda self: self._stack("mlp", "b_in"), doc="[n_layers, d_mlp]")
    b_out = property(lambda self: self._stack("mlp", "b_out"), doc="[n_layers, d_model]")
