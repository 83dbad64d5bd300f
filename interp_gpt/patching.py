"""Activation patching (transformer-lens' sweeps, batched) and attribution patching.

Activation patching runs the model on a corrupted input, replaces one activation with
its value from a clean run, and measures how far a metric moves. transformer-lens'
`patching` module does one forward per patched index; the functions here have its
names, signatures and result tensors, but run many patched copies of the corrupted
input in one batched forward:

  1. one corrupted forward caches the residual stream entering every layer;
  2. all patches at layer L start from that residual (`start_at_layer=L`), so the
     layers before L are never run again; the batch is `n_copies * batch` rows, copy
     `i` patched at the i-th index;
  3. the metric is called on each copy's logits (rows `i*batch:(i+1)*batch`), exactly
     as transformer-lens calls it on one run's logits, so a metric written for
     transformer-lens ports unchanged.

For the built-in sweeps a patch at position `p` cannot change any position before
`p` (attention is causal), so those logit rows are taken from the corrupted run and
only positions `p..` go through the (large) unembedding.

Attribution patching (`attribution_patch`) estimates every patch of a sweep at once
from two forwards and one backward: `(clean_act - corrupted_act) * d metric / d act`,
summed over the patched slice.

Example:
    >>> from interp_gpt import patching
    >>> from interp_gpt.metrics import normalized_logit_diff
    >>> _, clean_cache = model.run_with_cache(clean_tokens)
    >>> metric = normalized_logit_diff(answers, clean_logits, corrupted_logits)
    >>> patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric).shape
    torch.Size([12, 20])                                     # [n_layers, pos]
    >>> estimate = patching.attribution_patch(model, clean_tokens, corrupted_tokens, metric)
    >>> estimate["resid_pre"].shape                          # same layout, one backward pass
    torch.Size([12, 20])
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from .cache import ActivationCache
from .model import GPT
from .utils import get_act_name

AxisNames = Literal["layer", "pos", "head_index", "head", "src_pos", "dest_pos"]
PatchingMetric = Callable[[Float[Tensor, "batch pos d_vocab"]], Any]
PatchSetter = Callable[[Tensor, Sequence[int], Tensor], Tensor]

# How many token rows (copies x batch x pos) one batched forward holds by default:
# large enough that the matmuls run at full speed, small enough that the logits
# (rows x d_vocab floats, ~0.8 GB for GPT-2 at 4096 rows) stay modest.
DEFAULT_ROWS_PER_FORWARD = 4096


# ----------------------------------------------------------------------------
# Patch setters: write the clean slice into one copy's corrupted activation.
# Same names and behaviour as transformer-lens'; `index` starts with the layer.
# ----------------------------------------------------------------------------
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


def _first_changed_pos_fn(patch_setter: Any, hook_name: str) -> Callable[[Sequence[int]], int] | None:
    short = hook_name.rsplit("hook_", 1)[-1]
    layout = "pos" if short in _POS_LAYOUT else "pattern" if short in _PATTERN_LAYOUT else None
    return _FIRST_CHANGED_POS.get((patch_setter, layout)) if layout else None


def make_df_from_ranges(column_max_ranges: Sequence[int], column_names: Sequence[str]) -> Any:
    """A pandas DataFrame of every index tuple in `range(max)` per column, last column fastest
    (transformer-lens' helper; needs pandas)."""
    try:
        import pandas as pd
    except ImportError as e:  # pragma: no cover - pandas comes with transformer-lens
        raise ImportError("make_df_from_ranges / index_df / return_index_df need pandas: pip install pandas") from e
    rows = list(itertools.product(*[range(n) for n in column_max_ranges]))
    return pd.DataFrame(rows, columns=list(column_names))


# ----------------------------------------------------------------------------
# Input checking
# ----------------------------------------------------------------------------
def _check_model(model: Any) -> GPT:
    if not isinstance(model, GPT):
        raise TypeError(f"model: expected an interp_gpt GPT, got {type(model).__name__}")
    return model


def _as_tokens(model: GPT, tokens: Any, arg: str) -> Tensor:
    if isinstance(tokens, (str, list)):
        return model.to_tokens(tokens)
    return model._check_tokens(tokens, arg=arg)


def _axis_ranges(model: GPT, n_pos: int) -> dict[str, tuple[int, str]]:
    """For each axis name: (number of values, what they are called in an error)."""
    layers = (model.cfg.n_layers, "layers")
    heads = (model.cfg.n_heads, "heads")
    positions = (n_pos, "positions")
    return {
        "layer": layers,
        "head": heads,
        "head_index": heads,
        "pos": positions,
        "src_pos": positions,
        "dest_pos": positions,
    }


def _indices_from_axes(model: GPT, n_pos: int, index_axis_names: Any) -> tuple[list[list[int]], list[int]]:
    if isinstance(index_axis_names, str) or not isinstance(index_axis_names, Sequence) or not index_axis_names:
        raise TypeError(
            f"index_axis_names={index_axis_names!r}: expected a sequence of axis names such as ('layer', 'pos')"
        )
    ranges = _axis_ranges(model, n_pos)
    unknown = [a for a in index_axis_names if a not in ranges]
    if unknown:
        raise ValueError(f"index_axis_names: unknown axis {unknown[0]!r}; axes are {sorted(ranges)}")
    if index_axis_names[0] != "layer":
        raise ValueError(f"index_axis_names={tuple(index_axis_names)!r}: the first axis must be 'layer'")
    shape = [ranges[a][0] for a in index_axis_names]
    return [list(row) for row in itertools.product(*[range(n) for n in shape])], shape


def _indices_from_df(model: GPT, n_pos: int, index_df: Any) -> list[list[int]]:
    if not (hasattr(index_df, "columns") and hasattr(index_df, "itertuples")):
        raise TypeError(f"index_df: expected a pandas DataFrame of indices, got {type(index_df).__name__}")
    ranges = _axis_ranges(model, n_pos)
    columns = list(index_df.columns)
    rows = [[int(v) for v in row] for row in index_df.itertuples(index=False)]
    for r, row in enumerate(rows):
        for c, (name, value) in enumerate(zip(columns, row, strict=True)):
            n, what = ranges["layer"] if c == 0 else ranges.get(name, (None, ""))
            if n is not None and not 0 <= value < n:
                col = f"{name} (the first column, the layer)" if c == 0 and name != "layer" else name
                raise ValueError(f"index_df row {r}: {col}={value} is out of range, {what} are 0..{n - 1}")
    return rows


def _check_batch_size(batch_size: Any) -> None:
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1):
        raise ValueError(f"batch_size={batch_size!r}: expected a positive int (patched copies per forward) or None")


def _metric_value(patching_metric: PatchingMetric, logits: Tensor) -> float:
    value = patching_metric(logits)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"patching_metric returned a tensor of shape {tuple(value.shape)}; it must return a scalar "
                "(one number per patched run, e.g. a mean over the batch)"
            )
        return float(value.item())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"patching_metric returned {type(value).__name__}; it must return a scalar tensor or a number")


def _clean_activation(clean_cache: Any, name: str, activation_name: str, layer: int) -> Tensor:
    if not isinstance(clean_cache, Mapping) and not hasattr(clean_cache, "__getitem__"):
        raise TypeError(
            f"clean_cache: expected an ActivationCache (or a dict of hook name -> tensor), got {type(clean_cache).__name__}"
        )
    if name not in clean_cache:
        raise KeyError(
            f"clean_cache has no {name!r}, needed to patch {activation_name!r} at layer {layer}: "
            "run model.run_with_cache(clean_tokens) with a names_filter that includes it (or none)"
        )
    act = clean_cache[name]
    if not isinstance(act, Tensor):
        raise TypeError(f"clean_cache[{name!r}]: expected a tensor, got {type(act).__name__}")
    return act


def _block_of(hook_name: str) -> int | None:
    m = re.match(r"blocks\.(\d+)\.", hook_name)
    return int(m.group(1)) if m else None


# ----------------------------------------------------------------------------
# The batched sweep
# ----------------------------------------------------------------------------
def generic_activation_patch(
    model: GPT,
    corrupted_tokens: Int[Tensor, "batch pos"],
    clean_cache: ActivationCache,
    patching_metric: PatchingMetric,
    patch_setter: PatchSetter,
    activation_name: str,
    index_axis_names: Sequence[AxisNames] | None = None,
    index_df: Any = None,
    return_index_df: bool = False,
    *,
    batch_size: int | None = None,
    progress: bool = True,
) -> Tensor | tuple[Tensor, Any]:
    """Patch `activation_name` from `clean_cache` into the corrupted run at every index and
    return the metric for each; transformer-lens' `generic_activation_patch`, batched.

    Args:
        model: the model.
        corrupted_tokens: `[batch, pos]` token ids of the corrupted run.
        clean_cache: activations of the clean run (same `[batch, pos]` shape), e.g.
            `model.run_with_cache(clean_tokens)[1]`.
        patching_metric: logits `[batch, pos, d_vocab]` of one patched run -> a scalar.
        patch_setter: `(corrupted_activation, index, clean_activation) -> patched activation`,
            called on one copy's activation (`[batch, ...]`), e.g. `layer_pos_patch_setter`.
        activation_name: short hook name ("resid_pre", "z", "pattern", ...); the layer is
            the index's first entry.
        index_axis_names: the axes to sweep, first "layer" (e.g. `("layer", "pos")`); the
            result has one dimension per axis.
        index_df: instead of `index_axis_names`, a DataFrame with one index per row (first
            column the layer); the result is then flat, one value per row.
        return_index_df: also return the DataFrame of indices.
        batch_size: patched copies per forward (each `corrupted_tokens.shape[0]` rows);
            default: as many as fit in about 4096 token rows. Results do not depend on it.
        progress: show a tqdm progress bar.

    Returns:
        float32 tensor on the model's device, `[len(axis) for axis in index_axis_names]` or
        `[len(index_df)]` (and the index DataFrame with `return_index_df`).

    Example:
        >>> out = generic_activation_patch(model, corrupted_tokens, clean_cache, metric,
        ...                                layer_pos_patch_setter, "resid_mid", ("layer", "pos"))
        >>> out.shape      # [n_layers, pos]
    """
    model = _check_model(model)
    corrupted_tokens = _as_tokens(model, corrupted_tokens, "corrupted_tokens")
    if not callable(patching_metric):
        raise TypeError(f"patching_metric: expected a function of the logits, got {type(patching_metric).__name__}")
    if not callable(patch_setter):
        raise TypeError(f"patch_setter: expected a function, got {type(patch_setter).__name__}")
    if not isinstance(activation_name, str):
        raise TypeError(f"activation_name: expected a str such as 'resid_pre', got {type(activation_name).__name__}")
    _check_batch_size(batch_size)
    n_batch, n_pos = corrupted_tokens.shape

    if index_df is None:
        if index_axis_names is None:
            raise ValueError("pass index_axis_names (e.g. ('layer', 'pos')) or index_df")
        indices, out_shape = _indices_from_axes(model, n_pos, index_axis_names)
    else:
        if index_axis_names is not None:
            raise ValueError(
                f"pass index_axis_names or index_df, not both (got index_axis_names={tuple(index_axis_names)!r})"
            )
        indices, out_shape = _indices_from_df(model, n_pos, index_df), [len(index_df)]

    # Hook name and clean activation per layer, checked before anything runs.
    layers = sorted({index[0] for index in indices})
    hook_names = {layer: get_act_name(activation_name, layer) for layer in layers}
    for name in hook_names.values():
        model.hook_points(name, arg="activation_name")  # unknown names raise a KeyError that says why
    clean_acts = {
        layer: _clean_activation(clean_cache, name, activation_name, layer) for layer, name in hook_names.items()
    }

    values = _run_sweep(
        model,
        corrupted_tokens,
        indices,
        hook_names,
        clean_acts,
        patching_metric,
        patch_setter,
        batch_size=batch_size or max(1, DEFAULT_ROWS_PER_FORWARD // (n_batch * n_pos)),
        progress=progress,
        desc=f"patching {activation_name}",
    )
    result = torch.tensor(values, dtype=torch.float32, device=model.W_E.device).reshape(out_shape)
    if not return_index_df:
        return result
    if index_df is None:
        index_df = make_df_from_ranges(out_shape, list(index_axis_names or []))
    return result, index_df


def _run_sweep(
    model: GPT,
    tokens: Tensor,
    indices: list[list[int]],
    hook_names: dict[int, str],
    clean_acts: dict[int, Tensor],
    patching_metric: PatchingMetric,
    patch_setter: PatchSetter,
    batch_size: int,
    progress: bool,
    desc: str,
) -> list[float]:
    """The metric for every index, in the order of `indices`."""
    n_batch = tokens.shape[0]
    values: list[float] = [math.nan] * len(indices)

    # Where the patched copies start: layer L's copies take the residual stream that leaves
    # layer L-1 (after any hooks a user attached there, so none fires twice) and run layers
    # L.. only. Copies of a patch outside the blocks (or at layer 0) start from the tokens.
    start_layer = {layer: _block_of(name) for layer, name in hook_names.items()}
    entry_names = sorted({f"blocks.{s - 1}.hook_resid_post" for s in start_layer.values() if s})
    first_changed = {layer: _first_changed_pos_fn(patch_setter, name) for layer, name in hook_names.items()}
    # Reusing the corrupted logits before the first changed position is safe only when
    # nobody hooks the final LayerNorm / unembedding (such a hook could mix positions).
    final_hooked = any(model.hook_dict[n].has_hooks for n in model.hook_dict if n.startswith(("ln_final.", "unembed.")))

    bar = tqdm(total=len(indices), desc=desc, disable=not progress)
    try:
        with torch.no_grad():
            # 1. One corrupted run: the residual entering each layer, the activations being
            #    patched (to check the clean cache's shapes) and the corrupted logits.
            corrupted_logits, corrupted = model.run_with_cache(
                tokens, names_filter=entry_names + sorted(set(hook_names.values()))
            )
            for layer, name in hook_names.items():
                clean, ours = clean_acts[layer], corrupted[name]
                if clean.shape != ours.shape:
                    raise ValueError(
                        f"clean_cache[{name!r}] has shape {tuple(clean.shape)} but the corrupted run's "
                        f"{name} has shape {tuple(ours.shape)}: the clean and corrupted inputs must have the "
                        f"same shape (corrupted_tokens is {list(tokens.shape)})"
                    )
                clean_acts[layer] = clean.to(ours.device)

            # 2. Per layer, chunks of `batch_size` copies, one batched forward each.
            order = sorted(range(len(indices)), key=lambda c: indices[c][0])
            for layer, group in itertools.groupby(order, key=lambda c: indices[c][0]):
                group = list(group)
                for lo in range(0, len(group), batch_size):
                    chunk = group[lo : lo + batch_size]
                    chunk_indices = [indices[c] for c in chunk]
                    first = first_changed[layer]
                    shortcut = first is not None and start_layer[layer] is not None and not final_hooked
                    start_pos = [first(i) for i in chunk_indices] if shortcut else None
                    logits = _patched_logits(
                        model,
                        tokens,
                        corrupted,
                        corrupted_logits,
                        start_layer[layer],
                        hook_names[layer],
                        clean_acts[layer],
                        chunk_indices,
                        patch_setter,
                        start_pos,
                    )
                    for i, c in enumerate(chunk):
                        values[c] = _metric_value(patching_metric, logits[i * n_batch : (i + 1) * n_batch])
                    bar.update(len(chunk))
    finally:
        bar.close()
    return values


def _patched_logits(
    model: GPT,
    tokens: Tensor,
    corrupted: ActivationCache,
    corrupted_logits: Tensor,
    start_layer: int | None,
    hook_name: str,
    clean_act: Tensor,
    chunk_indices: list[list[int]],
    patch_setter: PatchSetter,
    start_pos: list[int] | None,
) -> Float[Tensor, "copies_x_batch pos d_vocab"]:
    """Logits of `len(chunk_indices)` patched copies of the corrupted run, stacked on the batch axis."""
    n_copies = len(chunk_indices)
    n_batch, n_pos = tokens.shape

    def patch(activation: Tensor, hook: Any) -> Tensor:
        for i, index in enumerate(chunk_indices):
            rows = activation[i * n_batch : (i + 1) * n_batch]  # a view: in-place setters write through
            out = patch_setter(rows, index, clean_act)
            if out is not rows:
                if not isinstance(out, Tensor) or out.shape != rows.shape:
                    got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                    raise ValueError(
                        f"patch_setter returned {got} for {hook_name} at index {index}; expected a tensor "
                        f"of shape {tuple(rows.shape)}"
                    )
                activation[i * n_batch : (i + 1) * n_batch] = out
        return activation

    if start_layer:
        input = corrupted[f"blocks.{start_layer - 1}.hook_resid_post"].repeat(n_copies, 1, 1)
        kwargs: dict[str, Any] = {"start_at_layer": start_layer}
    else:
        input, kwargs = tokens.repeat(n_copies, 1), {}

    with model.hooks(fwd_hooks=[(hook_name, patch)]):
        if start_pos is None or max(start_pos) == 0:
            return model(input, **kwargs)
        resid = model(input, stop_at_layer=model.cfg.n_layers, **kwargs)  # [copies*batch, pos, d_model]

    # Causality: copy i matches the corrupted run before position start_pos[i], so only its
    # later positions need the final LayerNorm and the unembedding (most of GPT-2's compute
    # for short prompts); the rest are the corrupted logits.
    keep = torch.arange(n_pos, device=resid.device)[None, :] >= torch.tensor(start_pos, device=resid.device)[:, None]
    keep = keep.repeat_interleave(n_batch, dim=0).reshape(-1)  # [copies*batch*pos]
    rows = resid.reshape(-1, resid.shape[-1])[keep]  # [rows, d_model]
    new_logits = model.unembed(model.ln_final(rows[None]))[0]  # [rows, d_vocab]
    logits = corrupted_logits.repeat(n_copies, 1, 1)
    logits.view(-1, logits.shape[-1])[keep] = new_logits
    return logits


# ----------------------------------------------------------------------------
# The named sweeps (transformer-lens' names and result shapes)
# ----------------------------------------------------------------------------
# sweep name -> (activation, patch setter, index axes, result shape in words)
_SWEEPS: dict[str, tuple[str, PatchSetter, tuple[str, ...], str]] = {
    "resid_pre": ("resid_pre", layer_pos_patch_setter, ("layer", "pos"), "[n_layers, pos]"),
    "resid_mid": ("resid_mid", layer_pos_patch_setter, ("layer", "pos"), "[n_layers, pos]"),
    "attn_out": ("attn_out", layer_pos_patch_setter, ("layer", "pos"), "[n_layers, pos]"),
    "mlp_out": ("mlp_out", layer_pos_patch_setter, ("layer", "pos"), "[n_layers, pos]"),
    "attn_head_out_by_pos": (
        "z",
        layer_pos_head_vector_patch_setter,
        ("layer", "pos", "head"),
        "[n_layers, pos, n_heads]",
    ),
    "attn_head_q_by_pos": (
        "q",
        layer_pos_head_vector_patch_setter,
        ("layer", "pos", "head"),
        "[n_layers, pos, n_heads]",
    ),
    "attn_head_k_by_pos": (
        "k",
        layer_pos_head_vector_patch_setter,
        ("layer", "pos", "head"),
        "[n_layers, pos, n_heads]",
    ),
    "attn_head_v_by_pos": (
        "v",
        layer_pos_head_vector_patch_setter,
        ("layer", "pos", "head"),
        "[n_layers, pos, n_heads]",
    ),
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
    "attn_head_out_all_pos": ("z", layer_head_vector_patch_setter, ("layer", "head"), "[n_layers, n_heads]"),
    "attn_head_q_all_pos": ("q", layer_head_vector_patch_setter, ("layer", "head"), "[n_layers, n_heads]"),
    "attn_head_k_all_pos": ("k", layer_head_vector_patch_setter, ("layer", "head"), "[n_layers, n_heads]"),
    "attn_head_v_all_pos": ("v", layer_head_vector_patch_setter, ("layer", "head"), "[n_layers, n_heads]"),
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


def _make_sweep(sweep: str) -> Callable[..., Any]:
    activation, setter, axes, shape = _SWEEPS[sweep]

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

    where = {
        "all_pos": "across all positions",
        "by_pos": "by position",
        "dest_src_pos": "by destination and source position",
    }
    where = next((w for suffix, w in where.items() if sweep.endswith(suffix)), "")
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


def get_act_patch_attn_head_all_pos_every(
    model: GPT,
    corrupted_tokens: Int[Tensor, "batch pos"],
    clean_cache: ActivationCache,
    metric: PatchingMetric,
    *,
    batch_size: int | None = None,
    progress: bool = True,
) -> Float[Tensor, "5 n_layers n_heads"]:
    """Every head, across all positions, for output (z), q, k, v and pattern, stacked:
    `[5, n_layers, n_heads]` (transformer-lens' function of the same name).

    Example:
        >>> get_act_patch_attn_head_all_pos_every(model, corrupted_tokens, clean_cache, metric).shape
        torch.Size([5, 12, 12])
    """
    kw = dict(batch_size=batch_size, progress=progress)
    return torch.stack(
        [
            get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, clean_cache, metric, **kw),
            get_act_patch_attn_head_q_all_pos(model, corrupted_tokens, clean_cache, metric, **kw),
            get_act_patch_attn_head_k_all_pos(model, corrupted_tokens, clean_cache, metric, **kw),
            get_act_patch_attn_head_v_all_pos(model, corrupted_tokens, clean_cache, metric, **kw),
            get_act_patch_attn_head_pattern_all_pos(model, corrupted_tokens, clean_cache, metric, **kw),
        ]
    )


def get_act_patch_attn_head_by_pos_every(
    model: GPT,
    corrupted_tokens: Int[Tensor, "batch pos"],
    clean_cache: ActivationCache,
    metric: PatchingMetric,
    *,
    batch_size: int | None = None,
    progress: bool = True,
) -> Float[Tensor, "5 n_layers pos n_heads"]:
    """Every head by position for output (z), q, k, v and pattern (by destination position),
    stacked: `[5, n_layers, pos, n_heads]` (transformer-lens' function of the same name)."""
    kw = dict(batch_size=batch_size, progress=progress)
    pattern = get_act_patch_attn_head_pattern_by_pos(model, corrupted_tokens, clean_cache, metric, **kw)
    return torch.stack(
        [
            get_act_patch_attn_head_out_by_pos(model, corrupted_tokens, clean_cache, metric, **kw),
            get_act_patch_attn_head_q_by_pos(model, corrupted_tokens, clean_cache, metric, **kw),
            get_act_patch_attn_head_k_by_pos(model, corrupted_tokens, clean_cache, metric, **kw),
            get_act_patch_attn_head_v_by_pos(model, corrupted_tokens, clean_cache, metric, **kw),
            pattern.transpose(1, 2),  # [n_layers, head, pos] -> [n_layers, pos, head]
        ]
    )


def get_act_patch_block_every(
    model: GPT,
    corrupted_tokens: Int[Tensor, "batch pos"],
    clean_cache: ActivationCache,
    metric: PatchingMetric,
    *,
    batch_size: int | None = None,
    progress: bool = True,
) -> Float[Tensor, "3 n_layers pos"]:
    """resid_pre, attn_out and mlp_out patched per (layer, position), stacked: `[3, n_layers, pos]`
    (transformer-lens' function of the same name).

    Example:
        >>> get_act_patch_block_every(model, corrupted_tokens, clean_cache, metric).shape
        torch.Size([3, 12, 20])
    """
    kw = dict(batch_size=batch_size, progress=progress)
    return torch.stack(
        [
            get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric, **kw),
            get_act_patch_attn_out(model, corrupted_tokens, clean_cache, metric, **kw),
            get_act_patch_mlp_out(model, corrupted_tokens, clean_cache, metric, **kw),
        ]
    )


# ----------------------------------------------------------------------------
# Attribution patching
# ----------------------------------------------------------------------------
# Attribution estimates laid out like the sweeps: resid_post has no transformer-lens sweep
# but is where a metric linear in the final residual makes the estimate exact.
_ATTRIBUTION_SWEEPS: dict[str, tuple[str, PatchSetter, tuple[str, ...], str]] = {
    **_SWEEPS,
    "resid_post": ("resid_post", layer_pos_patch_setter, ("layer", "pos"), "[n_layers, pos]"),
}


def _reduce_attribution(sweep: str, prod: Tensor) -> Tensor:
    """Sum `prod` (stacked over layers: [layer, batch, ...]) over everything a patch of
    `sweep` covers, leaving the sweep's index axes."""
    setter = _ATTRIBUTION_SWEEPS[sweep][1]
    if setter is layer_pos_patch_setter:  # [layer, batch, pos, d] -> [layer, pos]
        return prod.sum(dim=(1, 3))
    if setter is layer_pos_head_vector_patch_setter:  # [layer, batch, pos, head, d_head] -> [layer, pos, head]
        return prod.sum(dim=(1, 4))
    if setter is layer_head_vector_patch_setter:  # -> [layer, head]
        return prod.sum(dim=(1, 2, 4))
    if (
        setter is layer_head_dest_src_pos_pattern_patch_setter
    ):  # [layer, batch, head, dest, src] -> [layer, head, dest, src]
        return prod.sum(dim=1)
    if setter is layer_head_pos_pattern_patch_setter:  # -> [layer, head, dest]
        return prod.sum(dim=(1, 4))
    return prod.sum(dim=(1, 3, 4))  # layer_head_pattern_patch_setter: -> [layer, head]


@dataclass
class AttributionPatchResult:
    """Attribution-patching estimates of every patch, laid out like the sweeps.

    `estimates[sweep]` estimates `metric(patched) - metric(corrupted)` for the patch that
    `get_act_patch_<sweep>` makes: e.g. `estimates["resid_pre"]` is `[n_layers, pos]`,
    `estimates["attn_head_out_all_pos"]` `[n_layers, n_heads]`. `result[sweep]` reads it.
    `grads[hook_name]`: d metric / d activation at the corrupted run.
    """

    estimates: dict[str, Tensor]
    clean_metric: float
    corrupted_metric: float
    grads: dict[str, Tensor] = field(repr=False)
    clean_cache: ActivationCache = field(repr=False)
    corrupted_cache: ActivationCache = field(repr=False)

    def __getitem__(self, sweep: str) -> Tensor:
        if sweep not in self.estimates:
            raise KeyError(f"no attribution estimate for {sweep!r}; this result has {sorted(self.estimates)}")
        return self.estimates[sweep]

    def keys(self) -> list[str]:
        return list(self.estimates)


def attribution_patch(
    model: GPT,
    clean_input: Int[Tensor, "batch pos"] | str | list[str],
    corrupted_input: Int[Tensor, "batch pos"] | str | list[str],
    metric: PatchingMetric,
    *,
    sweeps: Sequence[str] | None = None,
) -> AttributionPatchResult:
    """Estimate every patch of the sweeps at once: a linear approximation of activation
    patching from a clean forward, a corrupted forward and one backward of the metric.

    For a patch of slice S of activation `a`, the estimate of `metric(patched) -
    metric(corrupted)` is `sum over S of (a_clean - a_corrupted) * d metric / d a`, the
    gradient taken at the corrupted run. It is exact where the metric is linear in `a`
    (e.g. the last layer's `mlp_out` / `resid_post` with a metric linear in the final
    residual stream); elsewhere it is a first-order estimate.

    Args:
        clean_input, corrupted_input: token ids `[batch, pos]` (or strings), same shape.
        metric: logits -> scalar, differentiable (no `.item()`); as for the sweeps.
        sweeps: which estimates to compute (names as in `get_act_patch_<name>`, plus
            "resid_post"); default all.

    Example:
        >>> result = attribution_patch(model, clean_tokens, corrupted_tokens, metric)
        >>> result["resid_pre"].shape                  # [n_layers, pos]
        >>> result["attn_head_out_all_pos"].shape      # [n_layers, n_heads]
    """
    model = _check_model(model)
    clean = _as_tokens(model, clean_input, "clean_input")
    corrupted = _as_tokens(model, corrupted_input, "corrupted_input")
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean_input has shape {tuple(clean.shape)} and corrupted_input {tuple(corrupted.shape)}: "
            "they must have the same shape [batch, pos]"
        )
    if not callable(metric):
        raise TypeError(f"metric: expected a function of the logits, got {type(metric).__name__}")
    sweeps = list(_ATTRIBUTION_SWEEPS) if sweeps is None else list(sweeps)
    unknown = [s for s in sweeps if s not in _ATTRIBUTION_SWEEPS]
    if unknown:
        raise ValueError(f"sweeps: unknown sweep {unknown[0]!r}; known: {list(_ATTRIBUTION_SWEEPS)}")
    n_layers = model.cfg.n_layers
    activations = sorted({_ATTRIBUTION_SWEEPS[s][0] for s in sweeps})
    names = [get_act_name(a, layer) for a in activations for layer in range(n_layers)]

    # 1. Clean forward: the clean activations.
    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(clean, names_filter=names)
        clean_metric = _metric_value(metric, clean_logits)

    # 2. Corrupted forward with the graph kept, holding on to each activation tensor.
    acts: dict[str, Tensor] = {}

    def keep(t: Tensor, hook: Any) -> None:
        acts[hook.name] = t

    def ensure_grad(t: Tensor, hook: Any) -> Tensor | None:
        # With frozen parameters nothing would require grad; start the graph here.
        return None if t.requires_grad else t.detach().requires_grad_(True)

    with torch.enable_grad(), model.hooks(fwd_hooks=[("hook_embed", ensure_grad)] + [(n, keep) for n in names]):
        logits = model(corrupted)
        value = metric(logits)
        if not isinstance(value, Tensor):
            raise TypeError(
                f"metric returned {type(value).__name__}; attribution patching needs a scalar tensor "
                "that autograd can differentiate (no .item())"
            )
        if value.numel() != 1:
            raise ValueError(f"metric returned a tensor of shape {tuple(value.shape)}; it must return a scalar")
        if not value.requires_grad:
            raise ValueError("metric's output does not depend on the logits through autograd (detached?)")
        # 3. One backward pass; torch.autograd.grad leaves the parameters' .grad untouched.
        grads = torch.autograd.grad(value.reshape(()), [acts[n] for n in names], allow_unused=True)
    grad_of = {
        n: (g if g is not None else torch.zeros_like(acts[n])).detach() for n, g in zip(names, grads, strict=True)
    }
    corrupted_cache = ActivationCache({n: acts[n].detach() for n in names}, model)

    estimates: dict[str, Tensor] = {}
    for sweep in sweeps:
        activation = _ATTRIBUTION_SWEEPS[sweep][0]
        layer_names = [get_act_name(activation, layer) for layer in range(n_layers)]
        prod = torch.stack([(clean_cache[n] - corrupted_cache[n]) * grad_of[n] for n in layer_names])
        estimates[sweep] = _reduce_attribution(sweep, prod).float()
    return AttributionPatchResult(
        estimates=estimates,
        clean_metric=clean_metric,
        corrupted_metric=float(value.item()),
        grads=grad_of,
        clean_cache=clean_cache,
        corrupted_cache=corrupted_cache,
    )


@dataclass
class AttributionComparison:
    """Attribution patching against activation patching for one sweep.

    `attribution` and `patching` both measure `metric(patched) - metric(corrupted)`;
    `correlation` is their Pearson correlation over all patches (nan if either is constant).
    """

    sweep: str
    attribution: Tensor
    patching: Tensor
    correlation: float

    @property
    def max_abs_error(self) -> float:
        return float((self.attribution - self.patching).abs().max())


def attribution_vs_activation_patching(
    model: GPT,
    clean_input: Int[Tensor, "batch pos"] | str | list[str],
    corrupted_input: Int[Tensor, "batch pos"] | str | list[str],
    metric: PatchingMetric,
    sweep: str = "resid_pre",
    *,
    attribution: AttributionPatchResult | None = None,
    batch_size: int | None = None,
    progress: bool = False,
) -> AttributionComparison:
    """How well attribution patching estimates real activation patching for one sweep:
    runs both (or reuses `attribution`) and reports the Pearson correlation.

    Example:
        >>> cmp = attribution_vs_activation_patching(model, clean_tokens, corrupted_tokens, metric, "resid_pre")
        >>> cmp.correlation, cmp.max_abs_error
    """
    model = _check_model(model)
    if sweep not in _ATTRIBUTION_SWEEPS:
        raise ValueError(f"sweep={sweep!r}: expected one of {list(_ATTRIBUTION_SWEEPS)}")
    if attribution is None:
        attribution = attribution_patch(model, clean_input, corrupted_input, metric, sweeps=[sweep])
    estimate = attribution[sweep]
    clean = _as_tokens(model, clean_input, "clean_input")
    activation, setter, axes, _ = _ATTRIBUTION_SWEEPS[sweep]
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(
            clean, names_filter=[get_act_name(activation, layer) for layer in range(model.cfg.n_layers)]
        )
    patched = generic_activation_patch(
        model,
        corrupted_input,
        clean_cache,
        metric,
        setter,
        activation,
        axes,
        batch_size=batch_size,
        progress=progress,
    )
    delta = patched - attribution.corrupted_metric
    pair = torch.stack([estimate.flatten().double().cpu(), delta.flatten().double().cpu()])
    correlation = float(torch.corrcoef(pair)[0, 1]) if pair.shape[1] > 1 else math.nan
    return AttributionComparison(sweep=sweep, attribution=estimate, patching=delta, correlation=correlation)


__all__ = [
    "generic_activation_patch",
    "make_df_from_ranges",
    "layer_pos_patch_setter",
    "layer_pos_head_vector_patch_setter",
    "layer_head_vector_patch_setter",
    "layer_head_pattern_patch_setter",
    "layer_head_pos_pattern_patch_setter",
    "layer_head_dest_src_pos_pattern_patch_setter",
    *[f"get_act_patch_{s}" for s in _SWEEPS],
    "get_act_patch_attn_head_all_pos_every",
    "get_act_patch_attn_head_by_pos_every",
    "get_act_patch_block_every",
    "attribution_patch",
    "AttributionPatchResult",
    "attribution_vs_activation_patching",
    "AttributionComparison",
]
