"""`attribute`: the attribution graph (direct, linear effects between features, error nodes, token embeddings
and next-token logits) of a prompt in a local replacement model -- circuit-tracer's `attribute`, offline
(https://transformer-circuits.pub/2025/attribution-graphs/methods.html). The phases:

0. **Local replacement model** (replacement.py): attention patterns and LayerNorm scales frozen, MLPs
   replaced by the transcoders (hooks on an unchanged model), so every direct effect is one gradient.
1. **Forward pass** (replacement.py): one copy of the prompt, each layer's transcoder input and MLP output
   and the embeddings recorded; position 0 (the BOS) zeroed: it is no node's value (a model with no
   tokenizer gets no BOS put first: its position 0 is the prompt's first token, kept).
2. **Logit targets** (targets.py): the top logits until `desired_logit_prob` or `max_n_logits` (or the
   targets given), each a demeaned unembedding direction through the frozen ln_final.
3. **Logit attribution**: a backward pass per batch of targets, batched over the one copy's graph; a row
   holds, per source, the gradient at its place dotted with its vector (activation x decoder row, error
   vector, `W_E[token]`).
4. **Feature attribution**: the same, injecting each feature's encoder row, in order of position, each
   batch over a prefix of the prompt that holds its targets (replacement.Prefixes); with
   `max_feature_nodes`, by influence on the logits (re-ranked every `update_interval` batches), only
   those visited kept.
5. **Assemble graph**: `adjacency_matrix[target, source]` in circuit-tracer's node order (features by layer,
   pos, feature; errors by layer, pos; embeddings; logits), dense or a `torch.sparse_csr_tensor` (sparse.py).

Example (tiny-gpt2 and its shipped transcoders):
    >>> from interp_gpt import GPT
    >>> from interp_gpt.attribution import attribute
    >>> from interp_gpt.sae.training import shipped_transcoders
    >>> model = GPT.from_pretrained("tiny-gpt2")
    >>> graph = attribute(model, "The cat sat on the mat because", shipped_transcoders(model))
    >>> graph.adjacency_matrix.shape[0] == graph.n_features + graph.n_errors + graph.n_pos + graph.n_logits
    True
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_int_in_range
from ..sae.transcoders.clt import CrossLayerTranscoder
from ..sae.transcoders.io import transcoders_scan
from ..sae.transcoders.transcoder import Transcoder
from ._inputs import bos_positions, prepare
from .graph import AttributionGraph
from .memory import available_bytes, refuse_if_short
from .replacement import ForwardPass, Prefixes, Readers, run_forward
from .sparse import RowPieces, cone_nonzeros, csr_bytes
from .targets import logit_targets

__all__ = ["attribute"]

_CALLER = "attribute"


# Under a caller's torch.inference_mode() too: the graph is gradients, so inference mode is switched off
# here (torch.enable_grad alone does not), and token ids made inside an inference block are copied out of it.
@torch.inference_mode(False)
def attribute(
    model: Any,
    prompt: str | Tensor | list[int],
    transcoders: list[Transcoder] | CrossLayerTranscoder,
    *,
    attribution_targets: Any = None,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    max_feature_nodes: int | None = None,
    batch_size: int | None = None,
    update_interval: int = 4,
    sparse: bool | None = None,
    verbose: bool = False,
    check_memory: bool = True,
) -> AttributionGraph:
    """The attribution graph of `prompt`'s next token (see the module's docs for the phases).

    Args:
        model: a `GPT`.
        prompt: text, or token ids (a list or a 1-D tensor). A BOS is put first unless the prompt
            starts with the tokenizer's BOS, EOS or pad token (position 0 is no node's value). A model
            with no tokenizer takes the ids as they are: no BOS is put first and position 0 is kept.
        transcoders: one `Transcoder` per layer (a list, layer 0 first; every layer needs one) or a
            `CrossLayerTranscoder`, reading `blocks.L.ln2.hook_normalized` (or another hook of block L
            before its MLP) and writing `blocks.L.hook_mlp_out`.
        attribution_targets: None (the top logits), token ids, token strings, or (label, weight,
            direction [d_model]) tuples (see targets.py).
        max_n_logits: at most this many top logits are targets, when attribution_targets is None.
        desired_logit_prob: the top logits are taken until their probabilities sum to this (at most
            `max_n_logits` of them), when attribution_targets is None.
        max_feature_nodes: at most this many feature nodes, the most influential (None: every active feature).
        batch_size: targets per backward pass (circuit-tracer's batch_size is that and the copies of the prompt
            in its forward pass: ours runs one copy); None: 16 on the CPU (as fast as larger batches there, in
            less memory: bench/attribution.py), 128 on a GPU.
        update_interval: batches between re-rankings of the features by influence.
        sparse: the adjacency as a `torch.sparse_csr_tensor` (float32 values, int32 indices) holding only the
            non-zeros (about a quarter of the entries with every feature a node: each target's causal cone),
            or dense. None: dense where the dense matrices fit the memory available, else sparse. Only a
            graph with every active feature a node is built sparse: sparse=True with max_feature_nodes below
            the number of active features is refused (that graph is small: its rows are the kept nodes').
        verbose: a progress bar over the feature targets.
        check_memory: refuse, before any work, a run whose estimated peak (`estimate_memory`, memory.py)
            exceeds the memory available, naming a batch_size and a max_feature_nodes that fit (the
            adjacency is checked again after the forward pass, with the active features known: a transcoder
            not TopK has them unknown before); False: run anyway (sparse=None still picks the layout).
    """
    model, tokens, readers = prepare(model, prompt, transcoders, _CALLER)
    if tokens.is_inference():  # made in an inference block: it cannot be saved for the backward passes
        tokens = tokens.clone()
    batch_size = _check_options(
        max_n_logits, desired_logit_prob, max_feature_nodes, batch_size, update_interval, sparse, tokens.device
    )
    if not isinstance(check_memory, bool):
        raise TypeError(f"{_CALLER}: check_memory={check_memory!r}: expected True or False")
    if check_memory:  # before any work: the estimate (memory.py) against the memory available
        given = attribution_targets is not None and isinstance(attribution_targets, (list, tuple, Tensor))
        n_logits = len(attribution_targets) if given else max_n_logits
        refuse_if_short(model, readers, tokens.shape[0], batch_size, max_feature_nodes, sparse, n_logits, _CALLER)

    # Phases 0 and 1: the local replacement model and its forward pass
    # the BOS's features and error vectors are zeroed, as circuit-tracer does (none without a tokenizer)
    fwd = run_forward(model, tokens, readers, bos_positions(model))
    n_layers, n_pos = model.cfg.n_layers, tokens.shape[0]
    acts = torch.stack(fwd.activations)  # [n_layers, pos, d_sae]
    fwd.activations.clear()  # the dense activations are not held past here (only the active ones)
    active = acts.nonzero()  # [n_active, 3] (layer, pos, feature), in that order
    values = acts[tuple(active.T)]
    del acts
    n_active = active.shape[0]
    sources = _Sources(model, tokens, readers, fwd, active, values)
    last_logits = fwd.logits[-1]
    del fwd  # its graph is the Prefixes' now, replaced as shorter ones are built: one graph held at a time

    # Phase 2: the logit targets
    targets, probs, vecs = logit_targets(model, last_logits, attribution_targets, max_n_logits, desired_logit_prob)
    n_logits = len(targets)
    n_keep = n_active if max_feature_nodes is None else min(max_feature_nodes, n_active)
    as_sparse = _check_room(active, n_layers, n_pos, n_logits, n_keep, sparse, check_memory)
    rows = _Rows(n_active, n_layers, n_pos, n_logits, n_keep, as_sparse)

    # Phase 3: logit attribution
    _logit_attribution(sources, rows, vecs, n_layers, n_pos, batch_size)

    # Phase 4: feature attribution (by influence when max_feature_nodes limits them)
    visited = _feature_attribution(sources, rows, active, probs, batch_size, update_interval, verbose)

    # Phase 5: assemble the graph
    selected = torch.where(visited)[0]
    adjacency = rows.adjacency(selected)
    tok = getattr(model, "tokenizer", None)
    return AttributionGraph(
        input_string=str(model.to_string(tokens)) if tok is not None else "",
        input_tokens=tokens,
        logit_targets=targets,
        logit_probabilities=probs.detach().float(),
        active_features=active,
        activation_values=values.detach().float(),
        selected_features=selected,
        adjacency_matrix=adjacency,
        cfg=model.cfg,
        vocab_size=int(model.cfg.d_vocab),
        scan=transcoders_scan(transcoders),  # circuit-tracer's name of the set, when it was loaded with one
    )


def _check_options(
    max_n_logits: Any,
    desired_logit_prob: Any,
    max_feature_nodes: Any,
    batch_size: Any,
    update_interval: Any,
    sparse: Any,
    device: torch.device,
) -> int:
    """Refuse `attribute`'s options out of range, by name; returns the batch size (None: by `device`)."""
    check_int_in_range(max_n_logits, "max_n_logits", 1, None, caller=_CALLER)
    if isinstance(desired_logit_prob, bool) or not isinstance(desired_logit_prob, (int, float)):
        raise TypeError(f"{_CALLER}: desired_logit_prob={desired_logit_prob!r}: expected a number in (0, 1]")
    if not 0 < desired_logit_prob <= 1:
        raise ValueError(f"{_CALLER}: desired_logit_prob={desired_logit_prob!r}: expected a number in (0, 1]")
    if max_feature_nodes is not None:
        check_int_in_range(max_feature_nodes, "max_feature_nodes", 1, None, caller=_CALLER)
    if batch_size is None:
        batch_size = 16 if device.type == "cpu" else 128
    check_int_in_range(batch_size, "batch_size", 1, None, caller=_CALLER)
    check_int_in_range(update_interval, "update_interval", 1, None, caller=_CALLER)
    if sparse is not None and not isinstance(sparse, bool):
        raise TypeError(f"{_CALLER}: sparse={sparse!r}: expected True, False or None")
    return batch_size  # type: ignore[no-any-return]


class _Rows:
    """Phases 3 to 5's rows of direct effects. Every feature a node (`direct`): each row is written straight
    into the adjacency at its node's place (one dense [nodes, nodes] matrix in memory), or its non-zeros kept
    (sparse). A subset: rows kept as visited, then assembled (rows x all sources)."""

    def __init__(self, n_active: int, n_layers: int, n_pos: int, n_logits: int, n_keep: int, as_sparse: bool):
        self.n_active, self.n_logits, self.n_keep = n_active, n_logits, n_keep
        self.logit_offset = n_active + (n_layers + 1) * n_pos
        self.total = total = self.logit_offset + n_logits
        self.direct = direct = n_keep == n_active
        self.pieces = RowPieces(total) if as_sparse else None
        self.edges = torch.zeros(0 if as_sparse else (total if direct else n_keep + n_logits), total)
        self.row_node = torch.zeros(n_keep + n_logits, dtype=torch.long)  # the node each row of `edges` belongs to

    def write(self, at: int, rows: Tensor) -> None:
        if self.pieces is not None:
            self.pieces.add(at, rows)
        else:
            self.edges[at : at + rows.shape[0], : self.logit_offset] = rows

    def adjacency(self, selected: Tensor) -> Tensor:
        """Phase 5: `adjacency_matrix[target, source]` of the nodes (`selected`: the visited features)."""
        if self.pieces is not None:
            return self.pieces.to_csr()
        if self.direct:
            return self.edges
        n_keep, n_logits = self.n_keep, self.n_logits
        keep = torch.cat([selected, torch.arange(self.n_active, self.total)])
        order = self.row_node.argsort()  # feature rows by node (selected is sorted), then the logits
        n_nodes = keep.shape[0]
        adjacency = torch.zeros(n_nodes, n_nodes)
        adjacency[:n_keep] = self.edges[order[:n_keep]][:, keep]
        adjacency[n_nodes - n_logits :] = self.edges[order[n_keep:]][:, keep]
        del self.edges
        return adjacency


def _logit_attribution(
    sources: _Sources, rows: _Rows, vecs: Tensor, n_layers: int, n_pos: int, batch_size: int
) -> None:
    """Phase 3: one backward pass per batch of logit targets, read at ln_final's output at the last position."""
    for i in range(0, rows.n_logits, batch_size):
        vec = vecs[i : i + batch_size]
        layers = torch.full((vec.shape[0],), n_layers)
        at = rows.logit_offset + i if rows.direct else i
        rows.write(at, sources.rows(layers, torch.full_like(layers, n_pos - 1), vec))
        rows.row_node[i : i + vec.shape[0]] = torch.arange(i, i + vec.shape[0]) + rows.logit_offset


def _feature_attribution(
    sources: _Sources,
    rows: _Rows,
    active: Tensor,
    probs: Tensor,
    batch_size: int,
    update_interval: int,
    verbose: bool,
) -> Tensor:
    """Phase 4: the rows of the feature targets (every active feature, or the `n_keep` most influential,
    re-ranked every `update_interval` batches); returns the `[n_active]` mask of the features visited."""
    n_active, n_keep, direct = rows.n_active, rows.n_keep, rows.direct
    st, visited = rows.n_logits, torch.zeros(n_active, dtype=torch.bool)
    encoders = sources.encoder_rows()
    bar = tqdm(total=n_keep, desc="Feature attribution", disable=not verbose)
    while int(visited.sum()) < n_keep:
        if direct:
            pending = torch.arange(n_active)
        else:
            influence = _partial_influence(rows.edges[:st], probs, rows.row_node[:st])[:n_active]
            ranked = torch.argsort(influence, descending=True)
            pending = ranked[~visited[ranked]][: min(update_interval * batch_size, n_keep - int(visited.sum()))]
        # in order of position (then layer, feature), each batch run over a prefix of the prompt that holds
        # its targets (replacement.Prefixes); the order changes no row, nor which are visited
        pending = pending[torch.argsort(active[pending, 1], stable=True)]
        batches = pending.split(batch_size)
        needed = torch.stack([active[batch, 1].max() + 1 for batch in batches])
        work = torch.tensor([len(batch) * (int(active[batch, 0].max()) + 1) for batch in batches])
        for batch, length in zip(batches, sources.prefixes.plan(needed, work), strict=True):
            batch_rows = sources.rows(active[batch, 0], active[batch, 1], encoders[batch], length)
            if direct:  # each row at its node's place
                for at, run in _runs(batch, batch_rows):
                    rows.write(at, run)
            else:
                rows.write(st, batch_rows)
            rows.row_node[st : st + len(batch)] = batch
            visited[batch] = True
            st += len(batch)
            bar.update(len(batch))
    bar.close()
    return visited


def _runs(nodes: Tensor, rows: Tensor) -> list[tuple[int, Tensor]]:
    """The rows of `nodes` (ascending within runs of consecutive nodes) as (first node, rows) runs."""
    breaks = (torch.where(nodes.diff() != 1)[0] + 1).tolist()
    bounds = [0, *breaks, nodes.shape[0]]
    return [(int(nodes[a]), rows[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class _Sources:
    """Phases 3 and 4's backward passes: the rows of direct effects for a batch of targets."""

    def __init__(self, model: Any, tokens: Tensor, readers: Readers, fwd: ForwardPass, active: Tensor, values: Tensor):
        self.readers, self.active, self.errors = readers, active, fwd.errors
        self.d_in = fwd.graph.inputs[0].shape[-1]
        self.prefixes = Prefixes(model, tokens, readers, fwd.graph)  # the graph held from here on: only there
        self.n_layers, self.n_pos = model.cfg.n_layers, tokens.shape[0]
        dtype = fwd.graph.embeds.dtype
        # every feature's scaled decoder rows, flattened: (feature index, layer written, pos, a_s * W_dec row)
        feat_idx, out_layer, pos, vec = [], [], [], []
        for layer in range(model.cfg.n_layers):
            mask = active[:, 0] == layer
            if not mask.any():
                continue
            idx = torch.where(mask)[0]
            rows, outs = readers.decoder_rows(layer, active[idx, 2])  # [n, n_out, d], [n_out]
            scaled = (rows * values[idx, None, None]).detach().to(dtype)
            for j, m in enumerate(outs.tolist()):
                feat_idx.append(idx)
                out_layer.append(torch.full_like(idx, m))
                pos.append(active[idx, 1])
                vec.append(scaled[:, j])
        d = model.cfg.d_model
        self.feat_idx = torch.cat(feat_idx) if feat_idx else torch.zeros(0, dtype=torch.long)
        self.out_layer = torch.cat(out_layer) if out_layer else torch.zeros(0, dtype=torch.long)
        self.pos = torch.cat(pos) if pos else torch.zeros(0, dtype=torch.long)
        self.dec = torch.cat(vec) if vec else torch.zeros(0, d, dtype=dtype)
        # sorted by (layer written, pos): the rows of one (layer, pos) are one matmul with its gradient
        order = torch.argsort(
            self.out_layer * (int(self.pos.max()) + 1 if self.pos.numel() else 1) + self.pos, stable=True
        )
        self.feat_idx, self.out_layer, self.pos, self.dec = (
            t[order] for t in (self.feat_idx, self.out_layer, self.pos, self.dec)
        )
        self.groups: dict[int, list[tuple[int, int, int]]] = {}
        start = 0
        for layer, p in torch.stack([self.out_layer, self.pos], dim=1).tolist():
            groups = self.groups.setdefault(layer, [])
            if groups and groups[-1][0] == p:
                groups[-1] = (p, groups[-1][1], start + 1)
            else:
                groups.append((p, start, start + 1))
            start += 1
        self.per_row = torch.zeros(0, self.dec.shape[0])
        self.n_active = active.shape[0]
        self.token_vectors = fwd.graph.embeds[0].detach()  # [pos, d_model]: W_E[token]

    def encoder_rows(self) -> Tensor:
        """`[n_active, d_in]` each active feature's encoder row (what its pre-activation reads)."""
        enc = torch.zeros(self.n_active, self.d_in, dtype=self.readers.dtype)
        for layer in self.active[:, 0].unique().tolist():
            mask = self.active[:, 0] == layer
            enc[mask] = self.readers.encoder_columns(layer, self.active[mask, 2]).T.detach()
        return enc

    def rows(self, layers: Tensor, positions: Tensor, inject: Tensor, length: int | None = None) -> Tensor:
        """`[n, n_active + (n_layers + 1) * n_pos]` the direct effects on `inject[b]` read at layer `layers[b]`'s
        input (n_layers: ln_final's output) at `positions[b]`, of every feature, error node and embedding.

        One backward pass for the `n` targets together, batched over one copy of the graph of the prompt's
        first `length` positions (None: all; replacement.Prefixes). Only the sources in the targets' causal
        cone are read: MLP outputs of the layers below the highest target and positions up to the last
        target's (the gradient is zero elsewhere)."""
        n = layers.shape[0]
        n_layers, n_pos = self.n_layers, self.n_pos
        top, last = min(int(layers.max()), n_layers), int(positions.max()) + 1
        graph = self.prefixes.get(n_pos if length is None else length)
        assert graph.n >= last, f"a graph of {graph.n} positions for targets up to position {last - 1}"
        places = [*graph.mlp_outs[:top], graph.embeds]
        outputs, cotangents = [], []
        for layer in layers.unique().tolist():
            mask = layers == layer
            target = graph.final if layer == n_layers else graph.inputs[layer]  # [1, n, d]
            cotangent = target.new_zeros(n, *target.shape)  # target b's injection in sample b
            cotangent[torch.where(mask)[0], 0, positions[mask]] = inject[mask].to(target.dtype)
            outputs.append(target)
            cotangents.append(cotangent)
        with torch.enable_grad():  # under a caller's no_grad too
            raw = torch.autograd.grad(
                outputs, places, cotangents, retain_graph=True, allow_unused=True, is_grads_batched=True
            )
        raw = tuple(None if r is None else r[:, 0] for r in raw)  # [n, positions held, d]
        out = torch.zeros(n, self.n_active + (n_layers + 1) * n_pos)
        if self.per_row.shape[0] < n:
            self.per_row = torch.zeros(n, self.dec.shape[0])
        errors = out[:, self.n_active : self.n_active + n_layers * n_pos].view(n, n_layers, n_pos)
        for layer, g in enumerate(raw[:-1]):
            if g is None:
                continue
            g = g[:n, :last]  # [n, pos, d_model]
            errors[:, layer, :last] = torch.einsum("bpd,pd->bp", g, self.errors[layer, :last].to(g.dtype)).float()
            for p, start, end in self.groups.get(layer, []):
                if p < last:
                    self.per_row[:n, start:end] = (g[:, p] @ self.dec[start:end].T).float()
        if self.dec.shape[0]:
            out[:, : self.n_active].index_add_(1, self.feat_idx, self.per_row[:n])
            self.per_row.zero_()
        if raw[-1] is not None:
            at = self.n_active + n_layers * n_pos
            out[:, at : at + last] = torch.einsum("bpd,pd->bp", raw[-1][:, :last], self.token_vectors[:last]).float()
        return out


def _dense_bytes(n_active: int, n_fixed: int, n_logits: int, n_keep: int) -> int:
    """The dense matrices of a graph: [nodes, nodes] for every feature a node; else the visited rows over
    every source plus the assembled [nodes, nodes]."""
    total = n_active + n_fixed + n_logits
    if n_keep == n_active:
        return 4 * total * total
    return 4 * ((n_keep + n_logits) * total + (n_keep + n_fixed + n_logits) ** 2)


def _available_bytes() -> int | None:
    """The host memory available now (Linux's MemAvailable), or None where it cannot be read."""
    return available_bytes("cpu")


def _check_room(
    active: Tensor, n_layers: int, n_pos: int, n_logits: int, n_keep: int, sparse: bool | None, refuse: bool = True
) -> bool:
    """Whether to build the adjacency sparse; refuse (unless not `refuse`), before any backward pass, a graph
    that would not fit in the memory available now (Linux's MemAvailable; no check where it cannot be read)
    in the layout asked for (sparse None: dense if it fits, else sparse), naming the layouts tried and
    max_feature_nodes."""
    n_active, n_fixed = active.shape[0], (n_layers + 1) * n_pos
    every = n_keep == n_active
    if sparse and not every:
        raise ValueError(
            f"{_CALLER}: sparse=True with max_feature_nodes={n_keep} of {n_active} active features: only a graph "
            "with every active feature a node is built sparse; pass sparse=None or False, or max_feature_nodes=None"
        )
    free = _available_bytes()
    dense = _dense_bytes(n_active, n_fixed, n_logits, n_keep)
    total = n_active + n_fixed + n_logits
    small = csr_bytes(cone_nonzeros(active, n_layers, n_pos, n_logits), total) if every else None
    if free is None or not refuse:
        return bool(sparse) if free is None or sparse is not None else (dense > free and small is not None)
    if sparse is False or (sparse is None and (dense <= free or small is None)):
        if dense <= free:
            return False
        tried = f"{dense / 2**30:.1f} GiB of dense matrices"
    elif small is not None and small <= free:
        return True
    else:
        tried = f"{(small or 0) / 2**30:.1f} GiB sparse (at most; {dense / 2**30:.1f} GiB dense)"
    lo, hi = 0, n_keep  # the most feature nodes that fit (dense: a subset of the features is built dense)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _dense_bytes(n_active, n_fixed, n_logits, mid) <= free else (lo, mid - 1)
    raise ValueError(
        f"{_CALLER}: a graph of {n_keep} of {n_active} active features as nodes needs {tried} and "
        f"{free / 2**30:.1f} GiB are available: pass max_feature_nodes={lo} or fewer, or a shorter prompt"
    )


def _partial_influence(edges: Tensor, weights: Tensor, row_node: Tensor, max_iter: int = 128) -> Tensor:
    """Each node's influence on the logits through the rows computed so far (circuit-tracer's partial
    influence): the logits' weights pushed back through the row-normalised |edges| until nothing is left."""
    norm = edges.abs()
    norm = norm / norm.sum(dim=1, keepdim=True).clamp(min=1e-8)
    influence = torch.zeros(edges.shape[1])
    flow = torch.zeros(edges.shape[1])
    flow[edges.shape[1] - len(weights) :] = weights.float()
    for _ in range(max_iter):
        flow = flow[row_node] @ norm
        if not flow.any():
            return influence
        influence += flow
    raise RuntimeError(
        f"{_CALLER}: the feature influences did not converge in {max_iter} steps (a cycle in the graph?)"
    )
