"""Weights stacked across layers, as transformer-lens exposes them: `model.W_Q` is
`[n_layers, n_heads, d_model, d_head]`. Offered on `GPT` through `StackedWeightsMixin`."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from ..checks import check_int_in_range, check_integer_tensor, check_token_ids
from ..factored import FactoredMatrix
from ..utils import composition_scores

if TYPE_CHECKING:
    from ..config import Config
    from .gpt import Embed, PosEmbed, TransformerBlock, Unembed

__all__ = ["StackedWeightsMixin"]


def _stacked(module: str, param: str) -> property:
    """A property: `blocks[L].<module>.<param>` of every layer L, stacked on a new first axis."""

    def get(self: StackedWeightsMixin) -> Tensor:
        if module == "mlp" and self.cfg.attn_only:  # (an AttributeError would be hidden by nn.Module's)
            raise ValueError(f"{param}: this model has attn_only=True, so no MLP weights")
        return torch.stack([getattr(getattr(block, module), param) for block in self.blocks])

    return property(get, doc=f"{module}.{param} of every layer, stacked: [n_layers, ...] (a copy)")


class StackedWeightsMixin:
    """`W_E`, `W_pos`, `W_U` and every per-layer weight stacked on a new first axis (a copy)."""

    if TYPE_CHECKING:  # what GPT provides
        embed: Embed
        pos_embed: PosEmbed
        unembed: Unembed
        blocks: nn.ModuleList
        cfg: Config

        def to_single_token(self, string: str) -> int: ...

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        """The token embedding: [d_vocab, d_model]."""
        return self.embed.W_E

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        """The position embedding: [n_ctx, d_model]."""
        return self.pos_embed.W_pos

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        """The unembedding: [d_model, d_vocab]."""
        return self.unembed.W_U

    @property
    def b_U(self) -> Float[Tensor, " d_vocab"]:
        """The unembedding's bias: [d_vocab]."""
        return self.unembed.b_U

    @property
    def W_E_pos(self) -> Float[Tensor, "d_vocab_plus_n_ctx d_model"]:
        """Token and position embeddings in one matrix, tokens first (transformer-lens' `W_E_pos`)."""
        return torch.cat([self.W_E, self.W_pos], dim=0)

    @property
    def OV(self) -> FactoredMatrix:
        """Every head's OV circuit W_V @ W_O, `[n_layers, n_heads, d_model, d_model]`, kept factored."""
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def QK(self) -> FactoredMatrix:
        """Every head's QK circuit W_Q @ W_K^T, `[n_layers, n_heads, d_model (query), d_model (key)]`, factored."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    def all_composition_scores(self, mode: str) -> Float[Tensor, "n_layers n_heads n_layers n_heads"]:
        """Composition scores of every pair of heads, as transformer-lens: entry `[l1, h1, l2, h2]` is
        how strongly head (l1, h1)'s OV circuit feeds head (l2, h2)'s `mode` input, by
        `utils.composition_scores`. "Q": OV into the query side of QK (OV @ QK); "K": into the key
        side (OV @ QK^T); "V": into the other head's OV (OV @ OV). Zero wherever l1 >= l2 (only an
        earlier layer can feed a later one)."""
        circuits = {"Q": lambda: self.QK, "K": lambda: self.QK.T, "V": lambda: self.OV}
        if not isinstance(mode, str) or mode not in circuits:
            raise ValueError(f"all_composition_scores: mode must be one of 'Q', 'K', 'V', got {mode!r}")
        scores = composition_scores(self.OV, circuits[mode](), broadcast_dims=True)
        layers = torch.arange(self.cfg.n_layers, device=scores.device)
        earlier = (layers[:, None] < layers[None, :])[:, None, :, None]  # [source layer, 1, destination layer, 1]
        return torch.where(earlier, scores, torch.zeros_like(scores))

    def tokens_to_residual_directions(
        self, tokens: str | int | Int[Tensor, ...], arg: str = "tokens"
    ) -> Float[Tensor, "... d_model"]:
        """The unembedding direction of each token: `W_U[:, token]`, `[d_model]` for one token
        (a single-token string, an id, a one-element tensor), `[..., d_model]` for a tensor of ids.
        The residual-stream direction that raises that token's logit, as transformer-lens."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        elif isinstance(tokens, Tensor):
            check_integer_tensor(tokens, arg)
            if tokens.numel() == 1:
                tokens = int(tokens.item())
        elif isinstance(tokens, bool) or not isinstance(tokens, int):
            raise TypeError(f"{arg}: expected a token string, an int or a tensor of ids, got {type(tokens).__name__}")
        ids = check_token_ids(torch.as_tensor(tokens), self.W_U.shape[-1], arg)
        return einops.rearrange(self.W_U[:, ids.to(self.W_U.device)], "d_model ... -> ... d_model")

    def all_head_labels(self) -> list[str]:
        """`["L0H0", "L0H1", ...]`: every head, layer by layer."""
        return [f"L{layer}H{head}" for layer in range(self.cfg.n_layers) for head in range(self.cfg.n_heads)]

    def accumulated_bias(
        self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
    ) -> Float[Tensor, " d_model"]:
        """The sum of the output biases the residual stream has taken in before `layer`: every
        earlier layer's attention `b_O` (and MLP `b_out`, with `include_mlp_biases`), plus
        `layer`'s own `b_O` with `mlp_input` (the stream entering its MLP). As transformer-lens."""
        n = self.cfg.n_layers
        check_int_in_range(layer, "layer", 0, n - 1 if mlp_input else n, "layers (n_layers: the end)")
        blocks = cast("list[TransformerBlock]", list(self.blocks))
        bias = torch.zeros_like(blocks[0].attn.b_O)
        for L in range(layer):
            bias = bias + blocks[L].attn.b_O
            if include_mlp_biases and not self.cfg.attn_only:
                bias = bias + blocks[L].mlp.b_out
        return bias + blocks[layer].attn.b_O if mlp_input else bias

    # Each a new tensor [n_layers, *shape of one layer's]: W_Q, W_K, W_V [n_layers, n_heads, d_model, d_head],
    # W_O [n_layers, n_heads, d_head, d_model], b_Q, b_K, b_V [n_layers, n_heads, d_head], b_O [n_layers, d_model],
    # W_in [n_layers, d_model, d_mlp], W_out [n_layers, d_mlp, d_model], b_in [n_layers, d_mlp], b_out [n_layers, d_model].
    W_Q, W_K, W_V, W_O = (_stacked("attn", p) for p in ("W_Q", "W_K", "W_V", "W_O"))
    b_Q, b_K, b_V, b_O = (_stacked("attn", p) for p in ("b_Q", "b_K", "b_V", "b_O"))
    W_in, W_out, b_in, b_out = (_stacked("mlp", p) for p in ("W_in", "W_out", "b_in", "b_out"))
