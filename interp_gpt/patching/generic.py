"""The batched activation-patching sweep: `generic_activation_patch` and its machinery.

transformer-lens' `patching` does one forward per patched index; here many patched copies
of the corrupted input run in one batched forward:

  1. one corrupted forward caches the residual stream entering every layer;
  2. all patches at layer L start from that residual (`start_at_layer=L`), so the
     layers before L are never run again; the batch is `n_copies * batch` rows, copy
     `i` patched at the i-th index;
  3. the metric is called on each copy's logits (rows `i*batch:(i+1)*batch`), exactly
     as transformer-lens calls it on one run's logits, so a metric written for
     transformer-lens ports unchanged.

For the built-in setters a patch at position `p` cannot change any position before `p`
(attention is causal), so those logit rows are taken from the corrupted run and only
positions `p..` go through the (large) unembedding.

Hooks the user attached (`model.add_hook`, an enclosing `with model.hooks(...)`) would see
every stacked copy, and the skipped layers and positions, so a hook that mixes the batch
(a mean ablation) or the positions would change the result. When any forward hook would
fire in the calling thread, the sweep warns, naming the hook points, and runs each patch
alone: one full forward of the user's batch per index, in index order, exactly what
`model.run_with_hooks(corrupted_tokens, fwd_hooks=[(name, setter_hook)])` per index gives.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..cache import ActivationCache
from ..checks import check_callable, check_int_in_range, check_tokens, check_type
from ..hooks import HookPoint
from ..model.gpt import GPT
from ..utils import get_act_name
from .setters import PatchSetter, first_changed_pos

__all__ = ["generic_activation_patch", "make_df_from_ranges"]

AxisNames = Literal["layer", "pos", "head_index", "head", "src_pos", "dest_pos"]
PatchingMetric = Callable[[Float[Tensor, "batch pos d_vocab"]], Any]

# How many token rows (copies x batch x pos) one batched forward holds by default:
# large enough that the matmuls run at full speed, small enough that the logits
# (rows x d_vocab floats, ~0.8 GB for GPT-2 at 4096 rows) stay modest.
DEFAULT_ROWS_PER_FORWARD = 4096
_HERE = os.path.dirname(os.path.abspath(__file__))


def make_df_from_ranges(column_max_ranges: Sequence[int], column_names: Sequence[str]) -> Any:
    """A pandas DataFrame of every index tuple in `range(max)` per column, last column fastest
    (transformer-lens' helper; needs pandas)."""
    try:
        import pandas as pd  # type: ignore[import-untyped]
    except ImportError as e:  # pragma: no cover - pandas comes with transformer-lens
        raise ImportError("make_df_from_ranges / index_df / return_index_df need pandas: pip install pandas") from e
    rows = list(itertools.product(*[range(n) for n in column_max_ranges]))
    return pd.DataFrame(rows, columns=list(column_names))


# ----------------------------------------------------------------------------
# Input checking
# ----------------------------------------------------------------------------
def check_model(model: Any) -> GPT:
    return check_type(model, GPT, "model", "an interp_gpt GPT")


def as_tokens(model: GPT, tokens: Any, arg: str) -> Tensor:
    """Token ids [batch, pos] on the model's device, from a string, a list of strings or ids."""
    if isinstance(tokens, (str, list)):
        return model.to_tokens(tokens)
    expected = "a string, a list of strings or a tensor of token ids"
    ids = check_tokens(tokens, model.cfg.d_vocab, model.cfg.n_ctx, arg, expected=expected)
    return ids.to(model.W_E.device)


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
        raise TypeError(f"index_df must be a pandas DataFrame of indices, got {type(index_df).__name__}")
    ranges = _axis_ranges(model, n_pos)
    columns = list(index_df.columns)
    rows = [[int(v) for v in row] for row in index_df.itertuples(index=False)]
    for r, row in enumerate(rows):
        for c, (name, value) in enumerate(zip(columns, row, strict=True)):
            n, what = ranges["layer"] if c == 0 else ranges.get(name, (None, ""))
            if n is not None:
                col = f"{name} (the first column, the layer)" if c == 0 and name != "layer" else name
                check_int_in_range(value, col, 0, n - 1, what, caller=f"index_df row {r}")
    return rows


def scalar_metric(metric: PatchingMetric, logits: Tensor, purpose: str, hint: str = "") -> Tensor:
    """`metric(logits)` as a 0-d tensor autograd can differentiate, or a clear error naming what
    needs it (`purpose`, e.g. "edge attribution"); `hint` follows "it must return a scalar"."""
    value = metric(logits)
    if not isinstance(value, Tensor):
        raise TypeError(
            f"metric returned {type(value).__name__}; {purpose} needs a scalar tensor that autograd "
            "can differentiate (no .item())"
        )
    if value.numel() != 1:
        raise ValueError(f"metric returned a tensor of shape {tuple(value.shape)}; it must return a scalar{hint}")
    if not value.requires_grad:
        raise ValueError("metric's output does not depend on the logits through autograd (detached?)")
    return value.reshape(())


def metric_value(patching_metric: PatchingMetric, logits: Tensor) -> float:
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
            f"clean_cache must be an ActivationCache (or a dict of hook name -> tensor), got {type(clean_cache).__name__}"
        )
    if name not in clean_cache:
        raise KeyError(
            f"clean_cache has no {name!r}, needed to patch {activation_name!r} at layer {layer}: "
            "run model.run_with_cache(clean_tokens) with a names_filter that includes it (or none)"
        )
    return check_type(clean_cache[name], Tensor, f"clean_cache[{name!r}]", "a tensor")


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
            While forward hooks of the user's are attached it is 1, with a warning (see above).
        progress: show a tqdm progress bar.

    Returns:
        float32 tensor on the model's device, `[len(axis) for axis in index_axis_names]` or
        `[len(index_df)]` (and the index DataFrame with `return_index_df`).

    Example:
        >>> out = generic_activation_patch(model, corrupted_tokens, clean_cache, metric,
        ...                                layer_pos_patch_setter, "resid_mid", ("layer", "pos"))
        >>> out.shape      # [n_layers, pos]
    """
    model = check_model(model)
    corrupted_tokens = as_tokens(model, corrupted_tokens, "corrupted_tokens")
    check_callable(patching_metric, "patching_metric", "a function of the logits")
    check_callable(patch_setter, "patch_setter")
    check_type(activation_name, str, "activation_name", "a str such as 'resid_pre'")
    if batch_size is not None:
        check_int_in_range(batch_size, "batch_size", 1, None, "patched copies per forward")
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


def user_hooked_points(model: GPT) -> list[str]:
    """The hook points where a forward hook would fire in the calling thread: the user's own
    (permanent, `add_hook`, or an enclosing `hooks()` context); another thread's context
    hooks do not fire here and do not count."""
    return [name for name, hp in model.hook_dict.items() if HookPoint._mine(hp.fwd_hooks)]


def warn_unbatched(hooked: list[str]) -> None:
    """Say that a sweep runs unbatched because of the hook points `hooked`. The message does not
    vary with the sweep, so the default filter shows it once per call site (an `_every` once).
    Every batched sweep follows the rule: user hooks attached -> one patch per forward."""
    shown = ", ".join(hooked[:5]) + (f" and {len(hooked) - 5} more" if len(hooked) > 5 else "")
    # Point the warning at the user's line: the first frame outside this package.
    level, frame = 1, sys._getframe(0)  # stacklevel 1 is this function's own frame
    while os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _HERE and frame.f_back is not None:
        level, frame = level + 1, frame.f_back
    warnings.warn(
        f"activation patching: forward hooks are attached at {shown}, so each patch runs in a forward "
        "of its own (not batched) and those hooks see exactly what one patched run shows them; "
        "remove them for the batched sweep",
        stacklevel=level,
    )


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
    # Stacked copies would change what the user's own hooks see: with any, no batching.
    hooked = user_hooked_points(model)
    if hooked:
        warn_unbatched(hooked)

    # Where the patched copies start: layer L's copies take the residual stream that leaves
    # layer L-1 in the corrupted run and run layers L.. only. Copies of a patch outside the
    # blocks (or at layer 0), and every patch when hooks are attached, start from the tokens.
    start_layer = {layer: None if hooked else _block_of(name) for layer, name in hook_names.items()}
    entry_names = sorted({f"blocks.{s - 1}.hook_resid_post" for s in start_layer.values() if s})
    first_changed = {layer: first_changed_pos(patch_setter, name) for layer, name in hook_names.items()}

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

            if hooked:  # 2'. One forward per patch, in index order, as transformer-lens runs them.
                for c, index in enumerate(indices):
                    layer = index[0]
                    args = (tokens, corrupted, corrupted_logits, None, hook_names[layer], clean_acts[layer])
                    logits = _patched_logits(model, *args, [index], patch_setter, None)
                    values[c] = metric_value(patching_metric, logits)
                    bar.update(1)
                return values

            # 2. Per layer, chunks of `batch_size` copies, one batched forward each.
            order = sorted(range(len(indices)), key=lambda c: indices[c][0])
            for layer, same_layer in itertools.groupby(order, key=lambda c: indices[c][0]):
                group = list(same_layer)
                first = first_changed[layer]
                for lo in range(0, len(group), batch_size):
                    chunk = group[lo : lo + batch_size]
                    chunk_indices = [indices[c] for c in chunk]
                    start_pos = None
                    if first is not None and start_layer[layer] is not None:
                        start_pos = [first(i) for i in chunk_indices]
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
                        values[c] = metric_value(patching_metric, logits[i * n_batch : (i + 1) * n_batch])
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

    def patched(rows: Tensor, index: list[int]) -> Tensor:
        out = patch_setter(rows, index, clean_act)
        if out is not rows and not (isinstance(out, Tensor) and out.shape == rows.shape):
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"patch_setter returned {got} for {hook_name} at index {index}; expected a tensor "
                f"of shape {tuple(rows.shape)}"
            )
        return out

    def patch(activation: Tensor, hook: Any) -> Tensor:
        if n_copies == 1:  # the setter's result replaces the activation, as in a hook of one's own
            return patched(activation, chunk_indices[0])
        for i, index in enumerate(chunk_indices):
            rows = activation[i * n_batch : (i + 1) * n_batch]  # a view: in-place setters write through
            out = patched(rows, index)
            if out is not rows:
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
