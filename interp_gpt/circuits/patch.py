"""Exact edge patching, path patching (IOI) and transformer-lens 4.3's direct-path sweeps, batched.

Edge patching: in a run of the clean input, each patched edge s -> r adds
`(s's output in the corrupted run) - (s's output in this run)` to r's input (the residual stream
before r's LayerNorm); every other edge carries what its sender outputs in this run. Patching
every edge gives the corrupted run, patching none the clean run. Instead of corrupted tokens the
other value can be an ablation: "zero" (the sender outputs 0; biases belong to no sender),
"mean" (its mean over the batch, per position, on `reference` tokens, default the clean ones) or
"resample" (its output on another prompt of `reference`, a seeded permutation).

Path patching (Wang et al. 2022): the senders' outputs come from the corrupted run, every other
node is frozen to the clean run, and only the receivers' inputs see the change (each receiver's
input is its clean value plus the senders' corrupted-minus-clean outputs); the rest of the
network is then recomputed from the patched receivers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from ..checks import check_callable, check_int_in_range
from ..model.gpt import GPT
from ..prepare import prompts
from ._inputs import ABLATIONS, check_z_cache, circuit_model, edge_sets_of, prepare
from ._run import Metric, SenderValues, base_run, run_edge_sets
from .graph import QKV, Graph

__all__ = [
    "patch_edges",
    "path_patch",
    "get_act_patch_direct_path",
    "get_act_patch_direct_path_all_sources",
    "ABLATIONS",
]


# ----------------------------------------------------------------------------
# public functions
# ----------------------------------------------------------------------------
def patch_edges(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    edge_sets: Any,
    metric: Metric | None = None,
    *,
    reference: Any = None,
    seed: int = 0,
    batch_size: int | None = None,
    logit_positions: Any = None,
    progress: bool = True,
) -> Tensor:
    """Run the clean input with each edge set patched (exactly; see the module's docs), many sets
    per batched forward.

    Args:
        clean_tokens: `[batch, pos]` token ids (or strings).
        corrupted_tokens: token ids of the same shape, or an ablation: "zero", "mean" or
            "resample" (pass a prompt that is literally one of these words as tokens). Prompts
            given as text must tokenize, row by row, to as many tokens as their clean prompt
            (refused otherwise, naming the row): patching lines positions up one to one.
        edge_sets: a list of edge sets, each a list of edge names (`'a0.h1 -> a1.h0<k>'`) or
            indices, one name or index, a bool mask `[n_edges]` or an index tensor (see
            `Graph.edge_indices`: an integer 0/1 mask is refused, pass `.bool()`); or a bool
            tensor `[n_sets, n_edges]`. `[]` is the clean run.
        metric: logits `[batch, pos, d_vocab]` -> a scalar; None returns the logits.
        reference: tokens whose run gives the "mean" / "resample" values (default the clean ones);
            as text, its prompts must tokenize to one length; for "resample", as many prompts as clean.
        seed: the resample permutation's seed.
        batch_size: edge sets per forward (default: about 4096 token rows).
        logit_positions: the positions the metric reads (e.g. -1); only those are unembedded,
            the others hold the clean run's logits. A speed-up: the unembedding is about a
            third of GPT-2's compute on short prompts. Default: every position.

    Returns:
        float32 `[n_sets]` metric values, or the logits `[n_sets, batch, pos, d_vocab]`.

    Example:
        >>> g = Graph.from_model(model)
        >>> patch_edges(model, clean, corrupted, [["a0.h1 -> a1.h0<k>"], g.edge_names[:100]], metric)
        tensor([..., ...])
    """
    prepared = prepare(model, clean_tokens, corrupted_tokens, reference, seed)
    sets = edge_sets_of(prepared.graph, edge_sets)
    return prepared.run(sets, metric, batch_size=batch_size, progress=progress, logit_positions=logit_positions)


def _sender(graph: Graph, item: Any, arg: str) -> int:
    if isinstance(item, str):
        return graph.sender_index(item)
    if isinstance(item, tuple) and len(item) == 2:
        layer = check_int_in_range(item[0], f"{arg} layer", 0, graph.n_layers - 1, "layers")
        head = check_int_in_range(item[1], f"{arg} head", 0, graph.n_heads - 1, "heads")
        return graph.head_sender(layer, head)
    raise TypeError(f"{arg}: expected a node name ('a0.h1', 'm2', 'input') or a head (layer, head), got {item!r}")


def _receiver(graph: Graph, item: Any) -> int:
    if isinstance(item, str):
        return graph.receiver_index(item)
    if isinstance(item, tuple) and len(item) == 3:
        layer = check_int_in_range(item[0], "receivers layer", 0, graph.n_layers - 1, "layers")
        head = check_int_in_range(item[1], "receivers head", 0, graph.n_heads - 1, "heads")
        if item[2] not in QKV:
            raise ValueError(f"receivers: {item!r}: the input must be 'q', 'k' or 'v', got {item[2]!r}")
        return graph.head_receiver(layer, head, item[2])
    raise TypeError(
        f"receivers: expected (layer, head, 'q'|'k'|'v') or a name ('a1.h0<q>', 'm3', 'logits'), got {item!r}"
    )


def path_patch(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    senders: Sequence[Any],
    receivers: Sequence[Any],
    metric: Metric | None = None,
    *,
    batch_size: int | None = None,
    logit_positions: Any = None,
    progress: bool = True,
) -> Tensor:
    """Path patching as in the IOI paper, one patched run per sender (or sender group), batched.

    For each entry of `senders`, its output(s) take their corrupted-run value; every other node is
    frozen to the clean run, so only the `receivers`' inputs see the change (their clean input
    plus the senders' corrupted-minus-clean outputs); the network after the receivers is then
    recomputed. A sender downstream of a receiver does not reach it.

    Args:
        senders: each a head `(layer, head)`, a node name (`'a7.h3'`, `'m2'`, `'input'`) or a list
            of them (a group patched together).
        receivers: `(layer, head, 'q'|'k'|'v')` tuples or receiver names (`'a9.h9<q>'`, `'m10'`, `'logits'`).
        corrupted_tokens: tokens of the clean ones' shape, or an ablation ("zero", "mean", "resample").
        logit_positions: the positions the metric reads (see `patch_edges`).

    Returns:
        float32 `[len(senders)]` metric values (logits `[len(senders), batch, pos, d_vocab]` with no metric).

    Example:
        >>> heads = [(0, head) for head in range(model.cfg.n_heads)]           # senders: layer 0's heads
        >>> path_patch(model, clean, corrupted, heads, [(1, 0, "q"), (1, 0, "k"), (1, 2, "v")], metric)
    """
    prepared = prepare(model, clean_tokens, corrupted_tokens, caller="path_patch")
    graph = prepared.graph
    if isinstance(receivers, (str, tuple)) or not isinstance(receivers, Sequence) or not receivers:
        raise TypeError(f"receivers must be a non-empty list of (layer, head, 'q'|'k'|'v') or names, got {receivers!r}")
    if isinstance(senders, str) or not isinstance(senders, Sequence):
        raise TypeError(f"senders must be a list of heads (layer, head), node names or groups, got {senders!r}")
    rec = sorted({_receiver(graph, r) for r in receivers})
    sets = []
    for item in senders:
        group = item if isinstance(item, list) else [item]
        ss = {_sender(graph, s, "senders") for s in group}
        edges = [graph.edge(s, r) for s in sorted(ss) for r in rec if s < graph.receiver_n_senders[r]]
        sets.append(torch.tensor(edges, dtype=torch.long))
    return prepared.run(
        sets,
        metric,
        frozen=True,
        batch_size=batch_size,
        progress=progress,
        desc="path patching",
        logit_positions=logit_positions,
    )


# ----------------------------------------------------------------------------
# transformer-lens 4.3's direct-path sweeps
# ----------------------------------------------------------------------------
def _head_writes(model: GPT, graph: Graph, cache: Any, arg: str) -> SenderValues:
    """Head senders' outputs `z[:, :, h] @ W_O[h]` from a cache's `hook_z` (only heads; checked by
    `check_z_cache`)."""

    def of(ps: Tensor) -> Tensor:
        outs = []
        for s in ps.tolist():
            layer, head = graph.sender_layer(s), graph.sender_head(s)
            if head is None:
                raise ValueError(f"{arg}: direct-path patching reads heads only, got sender {graph.senders[s]}")
            block: Any = model.blocks[layer]
            z = cache[f"blocks.{layer}.attn.hook_z"]  # checked by check_z_cache
            outs.append(z[:, :, head].to(block.attn.W_O) @ block.attn.W_O[head])
        return torch.stack(outs, dim=2)

    return of


def _direct_path(
    model: Any,
    corrupted_tokens: Any,
    clean_cache: Any,
    corrupted_cache: Any,
    patching_metric: Metric,
    sources: list[tuple[int, int]],
    component: str,
    verbose: bool,
    caller: str,
) -> Tensor:
    model = circuit_model(model, caller)
    if component not in QKV:
        raise ValueError(f"{caller}: component={component!r}, expected 'q', 'k' or 'v'")
    check_callable(patching_metric, "patching_metric", "a function of the logits", caller)
    graph = Graph(model.cfg)
    tokens = prompts(model, corrupted_tokens, "corrupted_tokens", caller).ids
    n, h = graph.n_layers, graph.n_heads
    layers = sorted({sl for sl, _ in sources if sl < n - 1})  # the source layers with a later head
    for cache, arg in ((clean_cache, "clean_cache"), (corrupted_cache, "corrupted_cache")):
        check_z_cache(model, cache, arg, layers, tokens, caller)
    base = base_run(model, tokens)
    pairs = [(sl, sh, dl, dh) for sl, sh in sources for dl in range(sl + 1, n) for dh in range(h)]
    sets = [
        torch.tensor([graph.edge(graph.head_sender(sl, sh), graph.head_receiver(dl, dh, component))])
        for sl, sh, dl, dh in pairs
    ]
    values = run_edge_sets(
        model,
        graph,
        base,
        _head_writes(model, graph, clean_cache, "clean_cache"),
        _head_writes(model, graph, corrupted_cache, "corrupted_cache"),
        sets,
        patching_metric,
        progress=verbose,
        desc=f"direct path patching [{component}]",
    )
    out = torch.zeros(n, h, n, h, device=model.W_E.device)
    for (sl, sh, dl, dh), v in zip(pairs, values.tolist(), strict=True):
        out[sl, sh, dl, dh] = v
    return out


def get_act_patch_direct_path(
    model: GPT,
    corrupted_tokens: Any,
    clean_cache: Any,
    corrupted_cache: Any,
    patching_metric: Metric,
    src_layer: int,
    src_head: int,
    component: Literal["q", "k", "v"] = "q",
    verbose: bool = True,
) -> Tensor:
    """transformer-lens 4.3's direct-path sweep, batched: in the corrupted run, add the source
    head's clean-minus-corrupted output (`z @ W_O`, from the caches' `hook_z`) to one later head's
    `component` input (before ln1) at every position; the metric per destination head. Each
    cache must hold `hook_z` of the source layer for `corrupted_tokens`' batch and positions.

    Returns:
        `[n_layers, n_heads]`: `[l, h]` the metric with the path into head (l, h) patched; rows
        `l <= src_layer` are 0.0 placeholders, as in transformer-lens.

    Example:
        >>> _, clean_cache = model.run_with_cache(clean_tokens)
        >>> _, corrupted_cache = model.run_with_cache(corrupted_tokens)
        >>> get_act_patch_direct_path(model, corrupted_tokens, clean_cache, corrupted_cache, metric, 0, 1, "k")
    """
    caller = "get_act_patch_direct_path"
    n_layers, n_heads = circuit_model(model, caller).cfg.n_layers, model.cfg.n_heads
    sl = check_int_in_range(src_layer, "src_layer", 0, n_layers - 1, "layers", caller=caller)
    sh = check_int_in_range(src_head, "src_head", 0, n_heads - 1, "heads", caller=caller)
    out = _direct_path(
        model,
        corrupted_tokens,
        clean_cache,
        corrupted_cache,
        patching_metric,
        [(sl, sh)],
        component,
        verbose,
        "get_act_patch_direct_path",
    )
    return out[sl, sh]


def get_act_patch_direct_path_all_sources(
    model: GPT,
    corrupted_tokens: Any,
    clean_cache: Any,
    corrupted_cache: Any,
    patching_metric: Metric,
    component: Literal["q", "k", "v"] = "q",
    verbose: bool = True,
) -> Tensor:
    """`get_act_patch_direct_path` from every source head, all in batched forwards.

    Returns:
        `[n_layers, n_heads, n_layers, n_heads]`: `[sl, sh, dl, dh]` the metric with the path
        (sl, sh) -> (dl, dh) patched; 0.0 where `dl <= sl`.

    Example:
        >>> get_act_patch_direct_path_all_sources(model, corrupted_tokens, clean_cache, corrupted_cache, metric, "v")
    """
    cfg = circuit_model(model, "get_act_patch_direct_path_all_sources").cfg
    sources = [(sl, sh) for sl in range(cfg.n_layers) for sh in range(cfg.n_heads)]
    return _direct_path(
        model,
        corrupted_tokens,
        clean_cache,
        corrupted_cache,
        patching_metric,
        sources,
        component,
        verbose,
        "get_act_patch_direct_path_all_sources",
    )
