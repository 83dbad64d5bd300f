"""Small helpers shared across the package, named as in transformer-lens."""

from __future__ import annotations

import re

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .factored import FactoredMatrix
from .slices import Slice  # noqa: F401 (transformer-lens offers it as utils.Slice)

# Short names people type, mapped to the hook names they mean.
_ACT_ALIASES = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_post": "post",
}
_LAYER_TYPE_ALIASES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}
# Per-head inputs (q_input, k_input, v_input, attn_in) and mlp_in are hooks of the block, not of attn/mlp.
_ATTN_ACTS = {"q", "k", "v", "z", "result", "pattern", "attn_scores"}
_MLP_ACTS = {"pre", "post"}
_LN_ACTS = {"scale", "normalized"}


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """The full hook name for a short activation name, as transformer-lens spells it.

    Examples:
        >>> get_act_name("k", 6)
        'blocks.6.attn.hook_k'
        >>> get_act_name("scale", 2, "ln1")
        'blocks.2.ln1.hook_scale'
        >>> get_act_name("resid_post", 0)
        'blocks.0.hook_resid_post'
        >>> get_act_name("pre5")
        'blocks.5.mlp.hook_pre'
        >>> get_act_name("scale")
        'ln_final.hook_scale'
    """
    if not isinstance(name, str):
        raise TypeError(f"get_act_name: name must be a str, got {type(name).__name__}")
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name  # already a full name
    packed = re.fullmatch(r"([a-z_]+?)(\d+)([a-z0-9_]*)", name)
    if packed and layer is None:  # "pre5", "scale4ln1", "k6a"
        name, layer, layer_type = packed.group(1), int(packed.group(2)), packed.group(3) or None
    name = _ACT_ALIASES.get(name, name)
    if name in _ATTN_ACTS:
        layer_type = "attn"
    elif name in _MLP_ACTS:
        layer_type = "mlp"
    elif layer_type in _LAYER_TYPE_ALIASES:
        layer_type = _LAYER_TYPE_ALIASES[layer_type]
    parts = []
    if layer is not None:
        parts.append(f"blocks.{layer}")
    if layer_type:
        parts.append(layer_type)
    parts.append(f"hook_{name}")
    full = ".".join(parts)
    if name in _LN_ACTS and layer is None:
        full = f"ln_final.{full}"
    return full


def lm_cross_entropy_loss(
    logits: Float[Tensor, "batch posn d_vocab"],
    tokens: Int[Tensor, "batch posn"],
    attention_mask: Int[Tensor, "batch posn"] | None = None,
    per_token: bool = False,
) -> Tensor:
    """Next-token cross-entropy; padding (mask 0) neither predicts nor is predicted."""
    if tokens.shape != logits.shape[:2]:
        raise ValueError(f"tokens: shape {tuple(tokens.shape)} does not match logits {tuple(logits.shape[:2])}")
    log_probs = logits[:, :-1].log_softmax(dim=-1)
    loss = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]  # [batch, posn - 1]
    if attention_mask is None:
        return loss if per_token else loss.mean()
    valid = (attention_mask[:, 1:] * attention_mask[:, :-1]).to(loss.dtype)
    loss = loss * valid
    return loss if per_token else loss.sum() / valid.sum()


def composition_scores(
    left: FactoredMatrix, right: FactoredMatrix, broadcast_dims: bool = True
) -> Float[Tensor, "*leading"]:
    """How strongly `left` feeds `right`: `||left @ right|| / (||left|| ||right||)` (Frobenius norms),
    one score per leading index, as transformer-lens' `composition_scores`.

    With `broadcast_dims` (the default) every matrix of `left` meets every matrix of `right`: the
    result is `[*left's leading axes, *right's leading axes]` (model.OV against model.QK gives
    `[n_layers, n_heads, n_layers, n_heads]`). Without it the leading axes broadcast against each other.
    `left`'s columns (`rdim`) must match `right`'s rows (`ldim`), normally d_model.
    """
    for name, matrix in (("left", left), ("right", right)):
        if not isinstance(matrix, FactoredMatrix):
            raise TypeError(
                f"composition_scores: {name} must be a FactoredMatrix (such as model.OV or model.QK), "
                f"got {type(matrix).__name__}"
            )
    if not isinstance(broadcast_dims, bool):
        raise TypeError(f"composition_scores: broadcast_dims must be a bool, got {broadcast_dims!r}")
    if left.rdim != right.ldim:
        raise ValueError(
            f"composition_scores: left has shape {tuple(left.shape)} and right has shape {tuple(right.shape)}: "
            f"left's columns ({left.rdim}) must match right's rows ({right.ldim}), the residual stream width"
        )
    # left = U_l (S_l V_l^T) and right = (U_r S_r) V_r^T, with U_l and V_r orthonormal, so
    # ||left @ right|| = ||(S_l V_l^T) @ (U_r S_r)||: a [k, k] product per pair instead of [ldim, rdim].
    inner_left, inner_right = left.collapse_l(), right.collapse_r()
    norm_left, norm_right = left.norm(), right.norm()
    if broadcast_dims:
        n_left, n_right = left.ndim - 2, right.ndim - 2
        inner_left = inner_left.reshape((*inner_left.shape[:-2], *(1,) * n_right, *inner_left.shape[-2:]))
        norm_left = norm_left.reshape((*norm_left.shape, *(1,) * n_right))
        inner_right = inner_right.reshape((1,) * n_left + inner_right.shape)
        norm_right = norm_right.reshape((1,) * n_left + norm_right.shape)
    try:
        product = inner_left @ inner_right
    except RuntimeError:
        raise ValueError(
            f"composition_scores: with broadcast_dims=False the leading axes of left (shape {tuple(left.shape)}) "
            f"and right (shape {tuple(right.shape)}) must broadcast against each other"
        ) from None
    return torch.linalg.matrix_norm(product) / norm_left / norm_right
