"""Patch setters: write the clean slice into one copy's corrupted activation.

Same names and behaviour as transformer-lens'; `index` starts with the layer. Each setter
is called on one patched copy's activation (`[batch, ...]`) and may write in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

__all__ = [
    "layer_pos_patch_setter",
    "layer_pos_head_vector_patch_setter",
    "layer_head_vector_patch_setter",
    "layer_head_pattern_patch_setter",
    "layer_head_pos_pattern_patch_setter",
    "layer_head_dest_src_pos_pattern_patch_setter",
]

PatchSetter = Callable[[Tensor, Sequence[int], Tensor], Tensor]


def layer_pos_patch_setter(corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor) -> Tensor:
    """index = [layer, pos]; activation [batch, pos, ...] (not attention patterns)."""
    _, pos = index
    corrupted_activation[:, pos, ...] = clean_activation[:, pos, ...]
    return corrupted_activation


def layer_pos_head_vector_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """index = [layer, pos, head]; activation [batch, pos, head, ...] (q, k, v, z, result)."""
    _, pos, head = index
    corrupted_activation[:, pos, head] = clean_activation[:, pos, head]
    return corrupted_activation


def layer_head_vector_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """index = [layer, head]; activation [batch, pos, head, ...]: every position of one head."""
    _, head = index
    corrupted_activation[:, :, head] = clean_activation[:, :, head]
    return corrupted_activation


def layer_head_pattern_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """index = [layer, head]; activation [batch, head, dest_pos, src_pos] (pattern, scores)."""
    _, head = index
    corrupted_activation[:, head, :, :] = clean_activation[:, head, :, :]
    return corrupted_activation


def layer_head_pos_pattern_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """index = [layer, head, dest_pos]; activation [batch, head, dest_pos, src_pos]."""
    _, head, dest = index
    corrupted_activation[:, head, dest, :] = clean_activation[:, head, dest, :]
    return corrupted_activation


def layer_head_dest_src_pos_pattern_patch_setter(
    corrupted_activation: Tensor, index: Sequence[int], clean_activation: Tensor
) -> Tensor:
    """index = [layer, head, dest_pos, src_pos]; activation [batch, head, dest_pos, src_pos]."""
    _, head, dest, src = index
    corrupted_activation[:, head, dest, src] = clean_activation[:, head, dest, src]
    return corrupted_activation


# The first position a built-in setter can change, given the activation's layout; every
# earlier position of every later activation (and of the logits) equals the corrupted run,
# because attention only looks backwards. Activations laid out [batch, pos, ...] vs
# attention-shaped [batch, head, dest_pos, src_pos]:
_POS_LAYOUT = {
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_out",
    "mlp_out",
    "q",
    "k",
    "v",
    "z",
    "result",
    "pre",
    "post",
    "scale",
    "normalized",
    "q_input",
    "k_input",
    "v_input",
    "attn_in",
    "mlp_in",
}
_PATTERN_LAYOUT = {"pattern", "attn_scores"}
_FIRST_CHANGED_POS: dict[tuple[Any, str], Callable[[Sequence[int]], int]] = {
    (layer_pos_patch_setter, "pos"): lambda index: index[1],
    (layer_pos_head_vector_patch_setter, "pos"): lambda index: index[1],
    (layer_head_vector_patch_setter, "pos"): lambda index: 0,
    (layer_head_pattern_patch_setter, "pattern"): lambda index: 0,
    (layer_head_pos_pattern_patch_setter, "pattern"): lambda index: index[2],
    (layer_head_dest_src_pos_pattern_patch_setter, "pattern"): lambda index: index[2],
}


def first_changed_pos(patch_setter: Any, hook_name: str) -> Callable[[Sequence[int]], int] | None:
    """index -> the first position `patch_setter` can change at `hook_name`, for the built-in
    setters on the layouts they know; None where that is not known."""
    short = hook_name.rsplit("hook_", 1)[-1]
    layout = "pos" if short in _POS_LAYOUT else "pattern" if short in _PATTERN_LAYOUT else None
    return _FIRST_CHANGED_POS.get((patch_setter, layout)) if layout else None


# The axes a patch by each setter covers in an activation stacked over layers ([layer, batch,
# ...]): attribution patching sums them away, leaving the sweep's index axes.
COVERED_AXES: dict[PatchSetter, tuple[int, ...]] = {
    layer_pos_patch_setter: (1, 3),  # [layer, batch, pos, d] -> [layer, pos]
    layer_pos_head_vector_patch_setter: (1, 4),  # [layer, batch, pos, head, d_head] -> [layer, pos, head]
    layer_head_vector_patch_setter: (1, 2, 4),  # -> [layer, head]
    layer_head_pattern_patch_setter: (1, 3, 4),  # [layer, batch, head, dest, src] -> [layer, head]
    layer_head_pos_pattern_patch_setter: (1, 4),  # -> [layer, head, dest]
    layer_head_dest_src_pos_pattern_patch_setter: (1,),  # -> [layer, head, dest, src]
}
