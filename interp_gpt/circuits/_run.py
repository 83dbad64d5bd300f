"""The machinery under the circuit tools: sender outputs, the opt-in hook flags, and the batched
edge-patched forward. Nothing here copies the model's maths: senders are read at `hook_z`
(times `W_O`), `hook_mlp_out` (minus `b_out`) and the embeddings; receiver inputs are changed at
`hook_q_input` / `hook_k_input` / `hook_v_input` (`use_split_qkv_input`), `hook_mlp_in`
(`use_hook_mlp_in`) and at the final residual stream, before `ln_final`.

A batched forward stacks E copies of the base run along the batch axis (copy e is rows
`e*B:(e+1)*B`) and starts at the first layer any of its patches reaches (`start_at_layer`), from
the base run's residual stream; the layers are run in segments so that only layers with a patched
head input pay for the per-head inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_index, check_int_in_range
from ..config import Config
from ..hooks import HookPoint
from ..model.gpt import GPT
from ..patching.generic import DEFAULT_ROWS_PER_FORWARD, metric_value, user_hooked_points, warn_unbatched
from .graph import QKV, Graph

__all__ = [
    "PAIR_FLOATS",
    "input_hook_names",
    "sender_hook_names",
    "sender_outputs",
    "BaseRun",
    "base_run",
    "flags",
    "attached",
    "receiver_hook",
    "SenderValues",
    "Metric",
    "patched_logits",
    "LogitsWithBase",
    "chunks",
    "check_positions",
    "run_edge_sets",
    "summed_rows",
]

# Floats (over all copies) the per-(copy, sender) differences of one batched forward may hold:
# 2**26 floats = 256 MB in float32.
PAIR_FLOATS = 2**26


def input_hook_names(cfg: Config) -> list[str]:
    """The hook points whose sum is what the residual stream starts with (the input sender):
    `embed + pos_embed`, or `embed` alone with shortformer positions (added to q and k instead)."""
    return ["hook_embed"] if cfg.positional_embedding_type == "shortformer" else ["hook_embed", "hook_pos_embed"]


def sender_hook_names(cfg: Config) -> list[str]:
    """The hook points whose values give every sender's output."""
    names = input_hook_names(cfg)
    for layer in range(cfg.n_layers):
        names.append(f"blocks.{layer}.attn.hook_z")
        if not cfg.attn_only:
            names.append(f"blocks.{layer}.hook_mlp_out")
    return names


def sender_outputs(model: GPT, cache: Any) -> Tensor:
    """Every sender's output `[batch, pos, n_senders, d_model]` from a cache holding
    `sender_hook_names`: the input (what the residual stream starts with: `embed + pos_embed`,
    `embed` alone with shortformer positions), each head's `z @ W_O` (no `b_O`), each MLP's
    output minus `b_out` (none in an attention-only model)."""
    cfg = model.cfg
    outs = [sum(cache[name] for name in input_hook_names(cfg))[:, :, None]]
    blocks: Any = model.blocks
    for layer, block in enumerate(blocks):
        z = cache[f"blocks.{layer}.attn.hook_z"]  # [batch, pos, n_heads, d_head]
        outs.append(torch.einsum("bphe,hed->bphd", z, block.attn.W_O))
        if not cfg.attn_only:
            outs.append((cache[f"blocks.{layer}.hook_mlp_out"] - block.mlp.b_out)[:, :, None])
    return torch.cat(outs, dim=2)


@dataclass
class BaseRun:
    """One run of the model, kept for patched copies of it."""

    tokens: Tensor  # [batch, pos]
    logits: Tensor  # [batch, pos, d_vocab]
    senders: Tensor  # [batch, pos, n_senders, d_model]
    resid: list[Tensor]  # resid[L]: the residual stream entering layer L; resid[n_layers]: before ln_final
    resid_mid: list[Tensor]  # [batch, pos, d_model] per layer: the MLP's input (empty if attn_only)

    def sender_values(self, ps: Tensor) -> Tensor:
        """`[batch, pos, k, d_model]` the outputs of senders `ps` `[k]` in this run (a `SenderValues`)."""
        return self.senders[:, :, ps]


def base_run(model: GPT, tokens: Tensor) -> BaseRun:
    """Run `tokens` once (no grad), keeping what patched copies of this run need."""
    n = model.cfg.n_layers
    mids = [] if model.cfg.attn_only else [f"blocks.{layer}.hook_resid_mid" for layer in range(n)]
    names = sender_hook_names(model.cfg) + [f"blocks.{layer}.hook_resid_pre" for layer in range(n)]
    names += mids + [f"blocks.{n - 1}.hook_resid_post"]
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=names)
    resid = [cache[f"blocks.{layer}.hook_resid_pre"] for layer in range(n)] + [cache[f"blocks.{n - 1}.hook_resid_post"]]
    return BaseRun(
        tokens=tokens,
        logits=logits,
        senders=sender_outputs(model, cache),
        resid=resid,
        resid_mid=[cache[name] for name in mids],
    )


@contextmanager
def flags(model: GPT, split: bool | None = None, mlp_in: bool | None = None) -> Iterator[None]:
    """Set `use_split_qkv_input` / `use_hook_mlp_in` (None: leave as is); the caller's values come back on exit."""
    saved = (model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in)
    try:
        if split is not None and split != saved[0]:
            model.set_use_split_qkv_input(split)
        if mlp_in is not None and mlp_in != saved[1]:
            model.set_use_hook_mlp_in(mlp_in)
        yield
    finally:
        if model.cfg.use_split_qkv_input != saved[0]:
            model.set_use_split_qkv_input(saved[0])
        if model.cfg.use_hook_mlp_in != saved[1]:
            model.set_use_hook_mlp_in(saved[1])


@contextmanager
def attached(hooks: list[tuple[HookPoint, Callable[..., Any]]]) -> Iterator[None]:
    """Attach forward hooks straight to hook points (they fire in this thread only); removed on exit.
    (Straight to the points, not by name: an opt-in point leaves `hook_dict` while its flag is off.)"""
    handles = []
    try:
        for hp, fn in hooks:
            handles.append((hp, hp.add_hook(fn, thread_only=True)))
        yield
    finally:
        for hp, h in handles:
            hp.remove(h)


def receiver_hook(model: GPT, layer: int, kind: str) -> HookPoint:
    block: Any = model.blocks[layer]
    hook: HookPoint = getattr(block, f"hook_{kind}_input") if kind in QKV else block.hook_mlp_in
    return hook


SenderValues = Callable[[Tensor], Tensor]  # sender indices [k] -> outputs [batch or 1, pos, k, d_model]
Metric = Callable[[Tensor], Any]  # logits [batch, pos, d_vocab] -> a scalar


@dataclass
class _Copies:
    """E patched copies of a base run, laid out for `patched_logits`: the patched edges of every
    copy (one flat list), the (copy, sender) pairs they need, and each pair's difference tensor
    D = `other_of(s) - (s's output in the copy)`, `diff[pair]` (filled as the senders are read)."""

    n_copies: int
    n_batch: int
    n_pos: int
    n_heads: int
    d_model: int
    dev: torch.device
    other_of: SenderValues
    copy: Tensor  # [edges] each patched edge's copy
    receivers: Tensor  # [edges] its receiver
    rec_layer: Tensor  # [edges] its receiver's layer
    heads_of: Tensor  # [edges] its receiver's head (0 for no head)
    pair_of_edge: Tensor  # [edges] its (copy, sender) pair
    pair_copy: Tensor  # [pairs]
    pair_sender: Tensor  # [pairs]
    sender_layer: Tensor  # [pairs] the pair's sender's layer
    diff: Tensor  # [pairs, batch, pos, d_model]

    def other(self, ps: Tensor) -> Tensor:
        """The other values of senders `ps` `[k]`, `[k, batch, pos, d_model]`."""
        return (
            self.other_of(ps.to(self.dev)).expand(self.n_batch, self.n_pos, len(ps), self.d_model).permute(2, 0, 1, 3)
        )

    def add_into(self, x: Tensor, idx: Tensor, fixed: Tensor | None) -> Tensor:
        """x [E*batch, pos, (n_heads,) d_model] with the differences of edges `idx` added (a new tensor)."""
        n_copies, n_batch, n_pos, d_model, dev = self.n_copies, self.n_batch, self.n_pos, self.d_model, self.dev
        x = x.clone()
        per_head = x.ndim == 4
        xs = (
            x.view(n_copies, n_batch, n_pos, self.n_heads, d_model).permute(0, 3, 1, 2, 4)
            if per_head
            else x.view(n_copies, n_batch, n_pos, d_model)
        )
        copies, heads = self.copy[idx].to(dev), self.heads_of[idx].to(dev)
        index = (copies, heads) if per_head else (copies,)
        if fixed is not None:  # frozen: start from the base run's value of the receiver input
            xs[index] = fixed.expand(len(idx), n_batch, n_pos, d_model)
        n_heads = self.n_heads if per_head else 1
        target = copies * n_heads + heads if per_head else copies
        sums = summed_rows(self.diff, self.pair_of_edge[idx].to(dev), target, n_copies * n_heads)
        xs += sums.view(xs.shape)
        return x


def summed_rows(rows: Tensor, src: Tensor, dst: Tensor, n_dst: int) -> Tensor:
    """`out [n_dst, ...]`, `out[d]` the sum of `rows[src[i]]` over the i with `dst[i] == d`, as one sparse
    product: an MIB circuit patches nearly every edge, and gathering `rows[src]` first would copy one
    residual stream per patched edge (most of the time of such a run on GPT-2 small)."""
    flat = rows.reshape(rows.shape[0], -1)
    ones = torch.ones(len(src), dtype=rows.dtype, device=rows.device)
    pick = torch.sparse_coo_tensor(torch.stack([dst, src]), ones, (n_dst, rows.shape[0]), check_invariants=False)
    return torch.sparse.mm(pick, flat).view(n_dst, *rows.shape[1:])


_Hooks = list[tuple[HookPoint, Callable[..., Any]]]


def patched_logits(
    model: GPT,
    graph: Graph,
    base: BaseRun,
    other_of: SenderValues,
    base_of: SenderValues,
    edge_sets: list[Tensor],
    frozen: bool = False,
    from_tokens: bool = False,
    logit_positions: list[int] | None = None,
) -> Tensor:
    """Logits `[E*batch, pos, d_vocab]` of E patched copies of `base`, copy e with the edges
    `edge_sets[e]` patched: each patched edge s -> r adds `other_of(s) - (s's output in this copy)`
    to r's input. With `frozen` (path patching), r's input is instead set to its value in the base
    run plus `other_of(s) - base_of(s)` over its patched edges. `from_tokens`: run the whole model
    from the tokens in one piece (a user's hooks then see one ordinary forward per copy).
    `logit_positions`: unembed only these positions and return only their logits
    `[E*batch, len(logit_positions), d_vocab]` (see `LogitsWithBase`)."""
    n = graph.n_layers
    c = _lay_out(model, graph, base, other_of, edge_sets)
    start = 0 if from_tokens else (int(c.rec_layer.min()) if len(c.receivers) else n)
    hooks = _sender_hooks(model, graph, c, base_of, start, frozen)
    receiver_hooks, split_layers, logits_idx, has_mlp = _receiver_hooks(model, graph, base, c, frozen, from_tokens)
    hooks += receiver_hooks

    with attached(hooks), flags(model, mlp_in=True if has_mlp else None):
        if from_tokens:
            with flags(model, split=True if split_layers else None):
                resid = model(base.tokens.repeat(c.n_copies, 1), stop_at_layer=n)
        else:
            resid = base.resid[start].repeat(c.n_copies, 1, 1)
            layer = start
            while layer < n:  # segments of layers that do / do not need the per-head inputs
                need = layer in split_layers
                end = layer + 1
                while end < n and (end in split_layers) == need:
                    end += 1
                with flags(model, split=True if need else None):
                    resid = model(resid, start_at_layer=layer, stop_at_layer=end)
                layer = end
        if logits_idx is not None:
            resid = c.add_into(resid, logits_idx, base.resid[n][None] if frozen else None)
        if logit_positions is None:
            return model(resid, start_at_layer=n)
        # Only the positions the metric reads go through ln_final and the unembedding (a third
        # of GPT-2's compute on short prompts); LayerNorm and the unembedding act per position.
        return model(resid[:, logit_positions], start_at_layer=n)


def _lay_out(model: GPT, graph: Graph, base: BaseRun, other_of: SenderValues, edge_sets: list[Tensor]) -> _Copies:
    """The patched edges of `edge_sets` (one copy each) and the (copy, sender) pairs they need:
    one difference tensor D per pair that some patched edge needs (left empty here)."""
    n_copies = len(edge_sets)
    n_batch, n_pos = base.tokens.shape
    d_model = model.cfg.d_model
    copy = torch.cat([torch.full((len(s),), i, dtype=torch.long) for i, s in enumerate(edge_sets)])
    edges = torch.cat([s.long() for s in edge_sets]) if n_copies else torch.zeros(0, dtype=torch.long)
    senders = graph.edge_sender[edges]
    receivers = graph.edge_receiver[edges]
    rec_layer = torch.tensor([r.layer for r in graph.receivers])[receivers]
    pair_key, pair_of_edge = torch.unique(copy * len(graph.senders) + senders, return_inverse=True)
    pair_copy, pair_sender = pair_key // len(graph.senders), pair_key % len(graph.senders)
    sender_layer = torch.tensor([graph.sender_layer(s) for s in range(len(graph.senders))])[pair_sender]
    return _Copies(
        n_copies=n_copies,
        n_batch=n_batch,
        n_pos=n_pos,
        n_heads=graph.n_heads,
        d_model=d_model,
        dev=base.resid[0].device,
        other_of=other_of,
        copy=copy,
        receivers=receivers,
        rec_layer=rec_layer,
        heads_of=torch.tensor([graph.receivers[int(r)].head or 0 for r in receivers], dtype=torch.long),
        pair_of_edge=pair_of_edge,
        pair_copy=pair_copy,
        pair_sender=pair_sender,
        sender_layer=sender_layer,
        diff=base.resid[0].new_empty(len(pair_key), n_batch, n_pos, d_model),  # [pairs, batch, pos, d_model]
    )


def _sender_hooks(model: GPT, graph: Graph, c: _Copies, base_of: SenderValues, start: int, frozen: bool) -> _Hooks:
    """Fill the differences of the senders whose output is the base run's (layers before `start`,
    all of them when `frozen`, and the input); return the hooks that fill the live senders' (layers
    >= `start`) as each copy runs."""
    n_copies, n_batch, n_pos, n_heads, d_model, dev = c.n_copies, c.n_batch, c.n_pos, c.n_heads, c.d_model, c.dev
    early = (c.sender_layer < start) | frozen | (c.pair_sender == 0)  # senders whose output is the base run's
    if bool(early.any()):
        ps = c.pair_sender[early]
        c.diff[early.to(dev)] = c.other(ps) - base_of(ps.to(dev)).permute(2, 0, 1, 3)
    hooks: _Hooks = []
    for layer in range(start, graph.n_layers):
        at = (~early) & (c.sender_layer == layer)
        if not bool(at.any()):
            continue
        pids = at.nonzero().flatten()
        is_head = torch.tensor([graph.sender_head(int(s)) is not None for s in c.pair_sender[pids]], dtype=torch.bool)
        block: Any = model.blocks[layer]
        head_p, mlp_p = pids[is_head], pids[~is_head]
        if len(head_p):
            heads = torch.tensor([graph.sender_head(int(s)) for s in c.pair_sender[head_p]])

            def read_z(z: Tensor, hook: Any, p: Tensor = head_p, h: Tensor = heads, attn: Any = block.attn) -> None:
                zs = z.view(n_copies, n_batch, n_pos, n_heads, -1)[c.pair_copy[p].to(dev), :, :, h.to(dev)]
                cur = torch.einsum("kbpe,ked->kbpd", zs, attn.W_O[h.to(dev)])
                c.diff[p.to(dev)] = c.other(c.pair_sender[p]) - cur

            hooks.append((block.attn.hook_z, read_z))
        if len(mlp_p):

            def read_mlp(out: Tensor, hook: Any, p: Tensor = mlp_p, mlp: Any = block.mlp) -> None:
                cur = out.view(n_copies, n_batch, n_pos, d_model)[c.pair_copy[p].to(dev)] - mlp.b_out
                c.diff[p.to(dev)] = c.other(c.pair_sender[p]) - cur

            hooks.append((block.hook_mlp_out, read_mlp))
    return hooks


def _receiver_hooks(
    model: GPT, graph: Graph, base: BaseRun, c: _Copies, frozen: bool, from_tokens: bool
) -> tuple[_Hooks, set[int], Tensor | None, bool]:
    """The hooks that add the patched edges' differences into their receivers' inputs, per hook
    point; with the layers run with split q / k / v inputs, the edges into the logits (added by
    the caller, before ln_final) and whether any MLP input is patched."""
    kinds = [graph.receivers[int(r)].kind for r in c.receivers]
    groups: dict[tuple[int, str], list[int]] = {}
    for i, key in enumerate(zip(c.rec_layer.tolist(), kinds, strict=True)):
        groups.setdefault(key, []).append(i)

    # Patched head inputs: only the patched (copy, head) pairs' q / k / v are recomputed from
    # their patched inputs (the block's own ln1 and `attn.project`) and written over what the
    # layer computed. Split inputs (every head its own copy of the residual stream) cost about
    # 1.7 plain layers; they are kept for a user's hooks, which then see ordinary split inputs,
    # and for shortformer models, which add positions to q and k after ln1.
    hooks: _Hooks = []
    split_layers: set[int] = set()
    if from_tokens or model.cfg.positional_embedding_type == "shortformer":
        split_layers = {layer for layer, kind in groups if kind in QKV}
    resid_in: dict[int, Tensor] = {}  # layer -> the copies' input to it, as the forward runs
    for layer in sorted({layer for layer, kind in groups if kind in QKV} - split_layers):

        def keep(x: Tensor, hook: Any, layer: int = layer) -> None:
            resid_in[layer] = x

        block: Any = model.blocks[layer]
        hooks.append((block.hook_resid_pre, keep))

    logits_idx: Tensor | None = None
    for (layer, kind), idx_list in groups.items():
        idx = torch.tensor(idx_list, dtype=torch.long)
        if kind == "logits":
            logits_idx = idx
            continue
        fixed = None
        if frozen:
            fixed = (base.resid[layer] if kind in QKV else base.resid_mid[layer])[None]
        if kind in QKV and layer not in split_layers:
            recompute = _heads_recomputed(
                model, layer, kind, idx, fixed, c.copy, c.heads_of, c.diff, c.pair_of_edge[idx], resid_in
            )
            hooks.append((getattr(model.blocks[layer].attn, f"hook_{kind}"), recompute))
            continue

        def patch(x: Tensor, hook: Any, idx: Tensor = idx, fixed: Tensor | None = fixed) -> Tensor:
            return c.add_into(x, idx, fixed)

        hooks.append((receiver_hook(model, layer, kind), patch))
    has_mlp = any(kind == "mlp" for _, kind in groups)
    return hooks, split_layers, logits_idx, has_mlp


class LogitsWithBase:
    """Full logits `[batch, pos, d_vocab]` of one patched copy from its logits at `positions`,
    the other positions holding the base run's: `rows(part)`. With `reuse`, one buffer serves
    every call (copying the base run's logits once rather than per copy: at GPT-2's vocabulary
    that is 4 MB per prompt and position) and is refilled if a caller changed it in place."""

    def __init__(self, base_logits: Tensor, positions: list[int], reuse: bool):
        self.base, self.positions, self.reuse = base_logits, positions, reuse
        self.buffer: Tensor | None = None
        self.version = -1

    def __call__(self, part: Tensor) -> Tensor:
        if not self.reuse:
            rows = self.base.clone()
            rows[:, self.positions] = part
            return rows
        if self.buffer is None or self.buffer._version != self.version:
            self.buffer = self.base.clone()
        self.buffer[:, self.positions] = part
        self.version = self.buffer._version
        return self.buffer


def _heads_recomputed(
    model: GPT,
    layer: int,
    kind: str,
    idx: Tensor,
    fixed: Tensor | None,
    copy: Tensor,
    heads_of: Tensor,
    diff: Tensor,
    pair_idx: Tensor,
    resid_in: dict[int, Tensor],
) -> Callable[..., Tensor]:
    """A hook on `layer`'s `kind` output (q, k or v, `[copies * batch, pos, n_heads, d_head]`)
    that recomputes each (copy, head) that the patched edges `idx` reach from the copy's input
    to the layer (`resid_in[layer]`, or with `fixed` the base run's) plus those edges'
    differences `diff[pair_idx]` (read when it fires: live senders fill theirs during the
    forward), with the block's own ln1 and `attn.project`."""
    block: Any = model.blocks[layer]
    n_heads = block.cfg.n_heads
    key, inverse = torch.unique(copy[idx] * n_heads + heads_of[idx], return_inverse=True)
    dev = diff.device
    copies, heads, inverse, pair_idx = (
        (key // n_heads).to(dev),
        (key % n_heads).to(dev),
        inverse.to(dev),
        pair_idx.to(dev),
    )
    W, b = getattr(block.attn, f"W_{kind.upper()}")[heads], getattr(block.attn, f"b_{kind.upper()}")[heads]

    def hook(out: Tensor, hook: Any) -> Tensor:
        resid = resid_in[layer].view(-1, *diff.shape[1:])  # [copies, batch, pos, d_model]
        x = (fixed if fixed is not None else resid[copies]).expand(len(key), *diff.shape[1:])
        x = x + summed_rows(diff, pair_idx, inverse, len(key))  # [pairs, batch, pos, d_model]: each head's input
        new = block.attn.project(block.ln1(x).permute(1, 2, 0, 3), W, b)  # [batch, pos, pairs, d_head]
        o = out.reshape(resid.shape[0], -1, *out.shape[1:])  # [copies, batch, pos, n_heads, d_head]
        o[copies, :, :, heads] = new.permute(2, 0, 1, 3)
        return o.reshape(out.shape)

    return hook


def chunks(n_pairs: list[int], rows_per_copy: int, d_model: int, max_copies: int) -> list[list[int]]:
    """Split edge-set positions into chunks of at most `max_copies` copies whose (copy, sender)
    differences fit in PAIR_FLOATS."""
    max_pairs = max(1, PAIR_FLOATS // (rows_per_copy * d_model))
    out: list[list[int]] = []
    cur: list[int] = []
    pairs = 0
    for i, k in enumerate(n_pairs):
        if cur and (len(cur) >= max_copies or pairs + k > max_pairs):
            out.append(cur)
            cur, pairs = [], 0
        cur.append(i)
        pairs += k
    if cur:
        out.append(cur)
    return out


# ----------------------------------------------------------------------------
# one patched run per edge set, batched (every circuit tool's runs)
# ----------------------------------------------------------------------------
def check_positions(logit_positions: Any, n_pos: int) -> list[int] | None:
    """`logit_positions` (None, an int or a list of ints) as sorted positions 0..n_pos-1."""
    if logit_positions is None:
        return None
    items = [logit_positions] if isinstance(logit_positions, int) else logit_positions
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise TypeError(f"logit_positions must be None, a position or a list of positions, got {logit_positions!r}")
    return sorted({check_index(p, n_pos, "logit_positions", "positions") for p in items})


def _start(graph: Graph, edges: Tensor) -> int:
    if not len(edges):
        return graph.n_layers
    return min(graph.receivers[int(r)].layer for r in graph.edge_receiver[edges].unique())


def run_edge_sets(
    model: GPT,
    graph: Graph,
    base: BaseRun,
    other_of: SenderValues,
    base_of: SenderValues,
    sets: list[Tensor],
    metric: Metric | None,
    *,
    frozen: bool = False,
    batch_size: int | None = None,
    progress: bool = True,
    desc: str = "patching edges",
    logit_positions: Any = None,
) -> Tensor:
    """Metric `[n_sets]` (or logits `[n_sets, batch, pos, d_vocab]` with no metric) of one patched
    run per edge set, batched (see `patched_logits`). While the user's own forward hooks are
    attached, each set runs alone from the tokens, as the patching sweeps do."""
    if batch_size is not None:
        check_int_in_range(batch_size, "batch_size", 1, None, "edge sets per forward")
    n_batch, n_pos = base.tokens.shape
    positions = check_positions(logit_positions, n_pos)
    hooked = user_hooked_points(model)
    if hooked:
        warn_unbatched(hooked)
    max_copies = 1 if hooked else batch_size or max(1, DEFAULT_ROWS_PER_FORWARD // (n_batch * n_pos))
    starts = [0 if hooked else _start(graph, s) for s in sets]
    order = sorted(range(len(sets)), key=lambda i: starts[i])
    values: list[float] = [0.0] * len(sets)
    logits_out: list[Tensor | None] = [None] * len(sets)
    full = None if positions is None else LogitsWithBase(base.logits, positions, reuse=metric is not None)
    bar = tqdm(total=len(sets), desc=desc, disable=not progress)
    try:
        with torch.no_grad():
            i = 0
            while i < len(order):
                j = i
                while j < len(order) and starts[order[j]] == starts[order[i]]:
                    j += 1
                group = order[i:j]
                n_pairs = [len(graph.edge_sender[sets[c]].unique()) for c in group]
                for chunk in chunks(n_pairs, n_batch * n_pos, model.cfg.d_model, max_copies):
                    ids = [group[k] for k in chunk]
                    logits = patched_logits(
                        model,
                        graph,
                        base,
                        other_of,
                        base_of,
                        [sets[c] for c in ids],
                        frozen=frozen,
                        from_tokens=bool(hooked),
                        logit_positions=positions,
                    )
                    for k, c in enumerate(ids):
                        rows = logits[k * n_batch : (k + 1) * n_batch]
                        if full is not None:
                            rows = full(rows)
                        if metric is None:
                            logits_out[c] = rows
                        else:
                            values[c] = metric_value(metric, rows)
                    bar.update(len(ids))
                i = j
    finally:
        bar.close()
    if metric is None:
        if not sets:
            return base.logits.new_zeros(0, *base.logits.shape)
        return torch.stack([t for t in logits_out if t is not None])
    return torch.tensor(values, dtype=torch.float32, device=base.logits.device)
