"""The named activation-patching sweeps: transformer-lens' `get_act_patch_*` functions,
with its names, arguments and result shapes, each a `generic_activation_patch` call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from jaxtyping import Int
from torch import Tensor

from ..cache import ActivationCache
from ..model.gpt import GPT
from .generic import AxisNames, PatchingMetric, generic_activation_patch
from .setters import (
    PatchSetter,
    layer_head_dest_src_pos_pattern_patch_setter,
    layer_head_pattern_patch_setter,
    layer_head_pos_pattern_patch_setter,
    layer_head_vector_patch_setter,
    layer_pos_head_vector_patch_setter,
    layer_pos_patch_setter,
)

# A sweep: (activation, patch setter, index axes, result shape in words).
Sweep = tuple[str, PatchSetter, tuple[AxisNames, ...], str]
_Layout = tuple[PatchSetter, tuple[AxisNames, ...], str]
_LAYER_POS: _Layout = (layer_pos_patch_setter, ("layer", "pos"), "[n_layers, pos]")
_HEAD_BY_POS: _Layout = (layer_pos_head_vector_patch_setter, ("layer", "pos", "head"), "[n_layers, pos, n_heads]")
_HEAD_ALL_POS: _Layout = (layer_head_vector_patch_setter, ("layer", "head"), "[n_layers, n_heads]")
_HEAD_VECTORS = (("out", "z"), ("q", "q"), ("k", "k"), ("v", "v"))  # sweep name part, activation

SWEEPS: dict[str, Sweep] = {
    **{name: (name, *_LAYER_POS) for name in ("resid_pre", "resid_mid", "attn_out", "mlp_out")},
    **{f"attn_head_{part}_by_pos": (act, *_HEAD_BY_POS) for part, act in _HEAD_VECTORS},
    "attn_head_pattern_by_pos": (
        "pattern",
        layer_head_pos_pattern_patch_setter,
        ("layer", "head_index", "dest_pos"),
        "[n_layers, n_heads, dest_pos]",
    ),
    "attn_head_pattern_dest_src_pos": (
        "pattern",
        layer_head_dest_src_pos_pattern_patch_setter,
        ("layer", "head_index", "dest_pos", "src_pos"),
        "[n_layers, n_heads, dest_pos, src_pos]",
    ),
    **{f"attn_head_{part}_all_pos": (act, *_HEAD_ALL_POS) for part, act in _HEAD_VECTORS},
    "attn_head_pattern_all_pos": (
        "pattern",
        layer_head_pattern_patch_setter,
        ("layer", "head_index"),
        "[n_layers, n_heads]",
    ),
}
_WHAT = {
    "resid_pre": "the residual stream entering each block, per position",
    "resid_mid": "the residual stream between attention and MLP, per position",
    "attn_out": "each attention layer's output, per position",
    "mlp_out": "each MLP layer's output, per position",
    "z": "each head's output (hook_z)",
    "q": "each head's queries",
    "k": "each head's keys",
    "v": "each head's values",
    "pattern": "each head's attention pattern",
}


_WHERE = {
    "all_pos": "across all positions",
    "by_pos": "by position",
    "dest_src_pos": "by destination and source position",
}


def _make_sweep(sweep: str) -> Callable[..., Any]:
    activation, setter, axes, shape = SWEEPS[sweep]

    def sweep_fn(
        model: GPT,
        corrupted_tokens: Int[Tensor, "batch pos"],
        clean_cache: ActivationCache,
        patching_metric: PatchingMetric,
        index_axis_names: Sequence[AxisNames] | None = axes,  # type: ignore[assignment]
        index_df: Any = None,
        return_index_df: bool = False,
        *,
        batch_size: int | None = None,
        progress: bool = True,
    ) -> Tensor | tuple[Tensor, Any]:
        return generic_activation_patch(
            model,
            corrupted_tokens,
            clean_cache,
            patching_metric,
            setter,
            activation,
            index_axis_names=None if index_df is not None else index_axis_names,
            index_df=index_df,
            return_index_df=return_index_df,
            batch_size=batch_size,
            progress=progress,
        )

    where = next((w for suffix, w in _WHERE.items() if sweep.endswith(suffix)), "")
    if sweep == "attn_head_pattern_by_pos":
        where = "by destination position"
    sweep_fn.__name__ = sweep_fn.__qualname__ = f"get_act_patch_{sweep}"
    sweep_fn.__doc__ = (
        f"Activation patching of {_WHAT[activation]}{' (' + where + ')' if where else ''}: "
        f"patches `{activation}` at every {tuple(axes)} index.\n\n"
        f"Returns a float32 tensor {shape} of `patching_metric` per patch (transformer-lens'\n"
        f"`get_act_patch_{sweep}`). `batch_size` (patched copies per forward) and `progress`\n"
        "as in `generic_activation_patch`, which documents the arguments.\n\n"
        "Example:\n"
        "    >>> _, clean_cache = model.run_with_cache(clean_tokens)\n"
        f"    >>> get_act_patch_{sweep}(model, corrupted_tokens, clean_cache, metric).shape  # {shape}\n"
    )
    return sweep_fn


get_act_patch_resid_pre = _make_sweep("resid_pre")
get_act_patch_resid_mid = _make_sweep("resid_mid")
get_act_patch_attn_out = _make_sweep("attn_out")
get_act_patch_mlp_out = _make_sweep("mlp_out")
get_act_patch_attn_head_out_by_pos = _make_sweep("attn_head_out_by_pos")
get_act_patch_attn_head_q_by_pos = _make_sweep("attn_head_q_by_pos")
get_act_patch_attn_head_k_by_pos = _make_sweep("attn_head_k_by_pos")
get_act_patch_attn_head_v_by_pos = _make_sweep("attn_head_v_by_pos")
get_act_patch_attn_head_pattern_by_pos = _make_sweep("attn_head_pattern_by_pos")
get_act_patch_attn_head_pattern_dest_src_pos = _make_sweep("attn_head_pattern_dest_src_pos")
get_act_patch_attn_head_out_all_pos = _make_sweep("attn_head_out_all_pos")
get_act_patch_attn_head_q_all_pos = _make_sweep("attn_head_q_all_pos")
get_act_patch_attn_head_k_all_pos = _make_sweep("attn_head_k_all_pos")
get_act_patch_attn_head_v_all_pos = _make_sweep("attn_head_v_all_pos")
get_act_patch_attn_head_pattern_all_pos = _make_sweep("attn_head_pattern_all_pos")


_EVERY_SUMMARY = {
    "attn_head_all_pos": "Every head, across all positions, for output (z), q, k, v and pattern",
    "attn_head_by_pos": "Every head by position for output (z), q, k, v and pattern (by destination position)",
    "block": "resid_pre, attn_out and mlp_out patched per (layer, position)",
}


def _make_every(kind: str, sweeps: Sequence[str], shape: str, example: str) -> Callable[..., Tensor]:
    """transformer-lens' `get_act_patch_*_every`: the named sweeps' results, stacked."""

    def every(
        model: GPT,
        corrupted_tokens: Int[Tensor, "batch pos"],
        clean_cache: ActivationCache,
        metric: PatchingMetric,
        *,
        batch_size: int | None = None,
        progress: bool = True,
    ) -> Tensor:
        results = []
        for sweep in sweeps:
            activation, setter, axes, _ = SWEEPS[sweep]
            args = (model, corrupted_tokens, clean_cache, metric, setter, activation, axes)
            result = cast(Tensor, generic_activation_patch(*args, batch_size=batch_size, progress=progress))
            if sweep == "attn_head_pattern_by_pos":  # [n_layers, head, pos] -> [n_layers, pos, head], as the others
                result = result.transpose(1, 2)
            results.append(result)
        return torch.stack(results)

    name = f"get_act_patch_{kind}_every"
    every.__name__ = every.__qualname__ = name
    every.__doc__ = (
        f"{_EVERY_SUMMARY[kind]}, stacked: `{shape}` (transformer-lens' function of the same name).\n\n"
        "Example (tiny-gpt2: 2 layers of 4 heads; a 17-token prompt):\n"
        f"    >>> {name}(model, corrupted_tokens, clean_cache, metric).shape\n"
        f"    torch.Size({example})\n"
    )
    return every


_HEAD_PARTS = ("out", "q", "k", "v", "pattern")
_HEADS_ALL_POS = [f"attn_head_{part}_all_pos" for part in _HEAD_PARTS]
_HEADS_BY_POS = [f"attn_head_{part}_by_pos" for part in _HEAD_PARTS]
get_act_patch_attn_head_all_pos_every = _make_every(
    "attn_head_all_pos", _HEADS_ALL_POS, "[5, n_layers, n_heads]", "[5, 2, 4]"
)
get_act_patch_attn_head_by_pos_every = _make_every(
    "attn_head_by_pos", _HEADS_BY_POS, "[5, n_layers, pos, n_heads]", "[5, 2, 17, 4]"
)
get_act_patch_block_every = _make_every(
    "block", ["resid_pre", "attn_out", "mlp_out"], "[3, n_layers, pos]", "[3, 2, 17]"
)


__all__ = [
    *[f"get_act_patch_{sweep}" for sweep in SWEEPS],
    "get_act_patch_attn_head_all_pos_every",
    "get_act_patch_attn_head_by_pos_every",
    "get_act_patch_block_every",
]
