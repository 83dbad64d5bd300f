"""Pruning an attribution graph by influence on the logits, and its two scores (circuit-tracer's definitions).

The phases, as circuit-tracer 0.5 runs them (`circuit_tracer.graph`):

1. normalise: the absolute adjacency, each row (target) divided by its sum, so a node's inputs share 1;
2. node influence: the logit probabilities (one weight per logit node) pushed back through the
   normalised matrix's power series `w A + w A^2 + ...` (finite: an attribution graph has no cycle);
3. node mask: the nodes holding `node_threshold` of the total influence, by cumulative sum of the
   sorted influences; token embeddings and logits are always kept;
4. edge mask: the same on the edges of the graph restricted to the kept nodes, each edge scored by its
   normalised weight times its target's influence (plus the target's logit weight);
5. clean-up: a feature or error node without a kept outgoing edge goes, a feature node without a kept
   incoming edge goes, and their edges with them, until nothing changes.

`compute_graph_scores` gives the replacement score (the share of the tokens' and errors' influence
that is the tokens') and the completeness score (the influence-weighted share of every node's inputs
that is not an error node).

Differences from circuit-tracer (deliberate): thresholds must lie in (0, 1] (it takes 0 too, keeping
only the top node); a graph with a cycle, non-finite weights, no logit node or no influence at all is
refused by name (it loops to a RuntimeError, or returns NaN thresholds); an adjacency in float64 is
pruned in float64 (it fails on one that is not float32).

A sparse adjacency (any torch sparse layout; `attribute(..., sparse=True)` makes CSR) is pruned as CSR,
never made dense: the power series by sparse matrix-vector products, the edge scores and their
threshold on the stored entries only. The results equal the dense graph's to float32 rounding, except
that its `edge_mask` is a CSR bool tensor with the (CSR) adjacency's own indices (`edge_mask.values()`
marks the stored entries kept), and at an edge threshold where the dense rule keeps zero-weight entries
(1.0, with rounding) only stored entries are kept.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..checks import check_float, check_type
from .graph import AttributionGraph
from .sparse import as_csr, csr, is_sparse, row_ids

__all__ = ["PruneResult", "compute_graph_scores", "prune_graph"]


class PruneResult(NamedTuple):
    """What `prune_graph` returns (circuit-tracer's `PruneResult`: same names, same meaning)."""

    node_mask: Tensor  # [n_nodes] bool: the nodes kept
    edge_mask: Tensor  # [n_nodes, n_nodes] bool, [target, source]: the edges kept (CSR for a sparse graph)
    cumulative_scores: Tensor  # [n_nodes] each node's cumulative share of the influence, by rank


def check_graph(graph: object, caller: str) -> AttributionGraph:
    """`graph` if it is an `AttributionGraph` whose tensors have the shapes its node order implies."""
    graph = check_type(graph, AttributionGraph, "graph", "an AttributionGraph", caller)
    where = f"{caller}: graph"
    for name in ("input_tokens", "logit_probabilities", "active_features", "activation_values",
                 "selected_features", "adjacency_matrix"):  # fmt: skip
        if not isinstance(getattr(graph, name), Tensor):
            raise TypeError(f"{where}.{name} must be a tensor, got {type(getattr(graph, name)).__name__}")
    if graph.input_tokens.ndim != 1 or graph.input_tokens.shape[0] == 0:
        raise ValueError(f"{where}.input_tokens has shape {tuple(graph.input_tokens.shape)}, expected [n_pos >= 1]")
    if graph.n_logits == 0:
        raise ValueError(f"{where}.logit_targets is empty: a graph needs at least one logit node")
    if tuple(graph.logit_probabilities.shape) != (graph.n_logits,):
        raise ValueError(
            f"{where}.logit_probabilities has shape {tuple(graph.logit_probabilities.shape)}, "
            f"expected [{graph.n_logits}] (one per logit target)"
        )
    active = graph.active_features
    if active.ndim != 2 or active.shape[1] != 3:
        raise ValueError(f"{where}.active_features has shape {tuple(active.shape)}, expected [n_active, 3]")
    if tuple(graph.activation_values.shape) != (active.shape[0],):
        raise ValueError(
            f"{where}.activation_values has shape {tuple(graph.activation_values.shape)}, "
            f"expected [{active.shape[0]}] (one per active feature)"
        )
    selected = graph.selected_features
    if selected.ndim != 1 or selected.dtype.is_floating_point or selected.dtype == torch.bool:
        raise ValueError(
            f"{where}.selected_features must be a 1-d integer tensor of indices into active_features, "
            f"got shape {tuple(selected.shape)} dtype {selected.dtype}"
        )
    if selected.numel() and (int(selected.min()) < 0 or int(selected.max()) >= active.shape[0]):
        raise ValueError(
            f"{where}.selected_features holds {int(selected.min())}..{int(selected.max())}, "
            f"expected indices 0..{active.shape[0] - 1} into active_features"
        )
    n = graph.n_features + graph.n_errors + graph.n_pos + graph.n_logits
    adj = graph.adjacency_matrix
    if tuple(adj.shape) != (n, n):
        raise ValueError(
            f"{where}.adjacency_matrix has shape {tuple(adj.shape)}, expected [{n}, {n}] ({graph.n_features} "
            f"features + {graph.cfg.n_layers} layers x {graph.n_pos} positions of errors + {graph.n_pos} "
            f"embeddings + {graph.n_logits} logits)"
        )
    if not adj.dtype.is_floating_point:
        raise TypeError(f"{where}.adjacency_matrix must be a float tensor, got {adj.dtype}")
    return graph


def dense_adjacency(graph: AttributionGraph, caller: str) -> tuple[Tensor, Tensor]:
    """The adjacency (float32 or wider; dense, or CSR where the graph's is sparse) and the logit weights over
    all nodes, both checked finite."""
    adj = graph.adjacency_matrix.detach()
    if is_sparse(adj):
        adj = as_csr(adj)
        dtype = torch.promote_types(adj.dtype, torch.float32)
        adj = csr(adj.crow_indices(), adj.col_indices(), adj.values().to(dtype), adj.shape[0])
        finite = bool(torch.isfinite(adj.values()).all())
    else:
        adj = adj.to(torch.promote_types(adj.dtype, torch.float32))
        finite = bool(torch.isfinite(adj).all())
    if not finite:
        raise ValueError(f"{caller}: graph.adjacency_matrix holds NaN or infinite weights")
    probs = graph.logit_probabilities.detach().to(device=adj.device, dtype=adj.dtype)
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(f"{caller}: graph.logit_probabilities holds NaN or infinite values: {probs.tolist()}")
    logit_weights = torch.zeros(adj.shape[0], dtype=adj.dtype, device=adj.device)
    logit_weights[-graph.n_logits :] = probs
    return adj, logit_weights


def _with_values(matrix: Tensor, values: Tensor) -> Tensor:
    """A CSR matrix with `matrix`'s indices and these values."""
    return csr(matrix.crow_indices(), matrix.col_indices(), values, matrix.shape[0])


def row_normalized(matrix: Tensor) -> Tensor:
    """|matrix| with each row divided by its sum (a zero row stays zero); dense or CSR, as given."""
    if is_sparse(matrix):
        absolute = _with_values(matrix, matrix.values().abs())
        sums = (absolute @ torch.ones(matrix.shape[1], dtype=matrix.dtype, device=matrix.device)).clamp(min=1e-10)
        return _with_values(matrix, absolute.values() / torch.repeat_interleave(sums, matrix.crow_indices().diff()))
    normalized = matrix.abs()
    return normalized / normalized.sum(dim=1, keepdim=True).clamp(min=1e-10)


def node_influences(a: Tensor, logit_weights: Tensor, caller: str) -> Tensor:
    """`w A + w A^2 + ...` for the logit weights `w`: each node's total (normalised) effect on the logits.
    The series ends within n_nodes terms when the graph has no cycle; one that does not end is refused.
    A CSR `a` is transposed once (a CSR copy of A^T: `v @ A` as `A^T @ v`, a sparse matrix-vector product;
    torch's own `v @ A` on CSR transposes A at every product, 100x slower)."""
    transposed = as_csr(a.t()) if is_sparse(a) else None

    def times(vector: Tensor) -> Tensor:
        return transposed @ vector if transposed is not None else vector @ a

    current = times(logit_weights)
    influence = current.clone()
    for _ in range(a.shape[0] + 1):
        if not bool(current.any()):
            return influence
        current = times(current)
        influence += current
    raise ValueError(
        f"{caller}: graph.adjacency_matrix has a cycle (the influence series does not end after "
        f"{a.shape[0]} steps); an attribution graph's edges only go forward"
    )


def _threshold(scores: Tensor, threshold: float) -> Tensor:
    """The score at which the sorted scores' cumulative share first reaches `threshold`."""
    ordered = torch.sort(scores, descending=True).values
    cumulative = torch.cumsum(ordered, dim=0) / torch.sum(ordered)
    index = min(int(torch.searchsorted(cumulative, threshold).item()), len(cumulative) - 1)
    # past the end only at threshold 1.0 when rounding leaves the cumulative sum a hair below 1.0
    return ordered[index]


def prune_graph(graph: AttributionGraph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PruneResult:
    """The nodes and edges that carry most of the graph's influence on its logits (circuit-tracer's `prune_graph`).

    Args:
        graph: an `AttributionGraph`.
        node_threshold: keep the most influential nodes that together hold this share (0, 1] of the
            total node influence (token embeddings and logits are always kept).
        edge_threshold: the same for the edges among the kept nodes.

    Returns:
        `PruneResult(node_mask, edge_mask, cumulative_scores)`: `[n_nodes]` bool, `[n_nodes, n_nodes]` bool
        (`[target, source]`), and each node's cumulative influence share in rank order (the most influential
        node's own share first, 1.0 for the last).

    Example:
        >>> node_mask, edge_mask, cumulative_scores = prune_graph(graph, node_threshold=0.8)
        >>> kept = graph.adjacency_matrix * edge_mask  # a dense graph's

        A sparse graph's (CSR) mask has the matrix's layout: `graph.adjacency_matrix.values()[edge_mask.values()]`
        are the kept weights, in row-major order.
    """
    caller = "prune_graph"
    check_graph(graph, caller)
    node_threshold = check_float(node_threshold, "node_threshold", 0.0, 1.0, caller)
    edge_threshold = check_float(edge_threshold, "edge_threshold", 0.0, 1.0, caller)
    adj, logit_weights = dense_adjacency(graph, caller)
    n_tokens, n_logits, n_features = graph.n_pos, graph.n_logits, graph.n_features
    kept_always = n_logits + n_tokens  # the last nodes: embeddings, then logits

    node_influence = node_influences(row_normalized(adj), logit_weights, caller)
    if not bool(node_influence.sum() > 0):
        raise ValueError(
            f"{caller}: graph has no influence on its logits (logit_probabilities {logit_weights[-n_logits:].tolist()} "
            "and the logits' rows of adjacency_matrix give every node 0); nothing to rank"
        )
    node_mask = node_influence >= _threshold(node_influence, node_threshold)
    node_mask[-kept_always:] = True

    if is_sparse(adj):
        edge_mask = _sparse_edge_mask(adj, node_mask, logit_weights, edge_threshold, n_features, kept_always, caller)
    else:
        edge_mask = _dense_edge_mask(adj, node_mask, logit_weights, edge_threshold, n_features, kept_always, caller)
    ordered, order = torch.sort(node_influence, descending=True)
    cumulative_scores = torch.zeros_like(node_influence)
    cumulative_scores[order] = torch.cumsum(ordered, dim=0) / torch.sum(ordered)
    return PruneResult(node_mask, edge_mask, cumulative_scores)


def compute_graph_scores(graph: AttributionGraph) -> tuple[float, float]:
    """`(replacement_score, completeness_score)` of a graph, both in [0, 1] (circuit-tracer's definitions).

    replacement: of the influence the token embeddings and error nodes have on the logits, the tokens'
    share (1.0: the tokens reach the logits through features alone).
    completeness: every node's share of (absolute) input that does not come from error nodes, averaged
    with each node's influence on the logits (its own logit weight included) as the weight.

    Example:
        >>> replacement, completeness = compute_graph_scores(graph)
    """
    caller = "compute_graph_scores"
    check_graph(graph, caller)
    adj, logit_weights = dense_adjacency(graph, caller)
    error_start = graph.n_features
    error_end = error_start + graph.n_errors
    token_end = error_end + graph.n_pos

    normalized = row_normalized(adj)
    node_influence = node_influences(normalized, logit_weights, caller)
    token_influence = node_influence[error_end:token_end].sum()
    error_influence = node_influence[error_start:error_end].sum()
    if not bool(token_influence + error_influence > 0):
        raise ValueError(
            f"{caller}: graph's token embeddings and error nodes have no influence on its logits "
            "(the replacement score would be 0/0)"
        )
    replacement_score = token_influence / (token_influence + error_influence)

    if is_sparse(normalized):
        is_error = torch.zeros(normalized.shape[1], dtype=normalized.dtype, device=normalized.device)
        is_error[error_start:error_end] = 1
        non_error_fractions = 1 - normalized @ is_error
    else:
        non_error_fractions = 1 - normalized[:, error_start:error_end].sum(dim=-1)
    output_influence = node_influence + logit_weights
    completeness_score = (non_error_fractions * output_influence).sum() / output_influence.sum()
    return float(replacement_score.item()), float(completeness_score.item())


def _dense_edge_mask(
    adj: Tensor, node_mask: Tensor, logit_weights: Tensor, edge_threshold: float, n_features: int, kept_always: int,
    caller: str,
) -> Tensor:  # fmt: skip
    """prune_graph's phases 4 and 5 on a dense adjacency (`node_mask` is updated in place)."""
    pruned = adj.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    normalized_pruned = row_normalized(pruned)
    target_influence = node_influences(normalized_pruned, logit_weights, caller) + logit_weights
    edge_scores = normalized_pruned * target_influence[:, None]
    edge_mask = edge_scores >= _threshold(edge_scores.flatten(), edge_threshold)

    # Drop feature and error nodes with no kept outgoing edge and feature nodes with no kept incoming edge,
    # with their edges, until nothing changes (each round can strand others; at most n_layers + 1 rounds).
    while True:
        before = node_mask.clone()
        node_mask[:-kept_always] &= edge_mask[:, :-kept_always].any(0)
        node_mask[:n_features] &= edge_mask[:n_features].any(1)
        if torch.equal(node_mask, before):
            return edge_mask
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False


def _sparse_edge_mask(
    adj: Tensor, node_mask: Tensor, logit_weights: Tensor, edge_threshold: float, n_features: int, kept_always: int,
    caller: str,
) -> Tensor:  # fmt: skip
    """The same on a CSR adjacency, on its stored entries: a CSR bool mask with the adjacency's indices."""
    rows, cols = row_ids(adj), adj.col_indices()
    pruned = _with_values(adj, adj.values() * (node_mask[rows] & node_mask[cols]))
    normalized_pruned = row_normalized(pruned)
    target_influence = node_influences(normalized_pruned, logit_weights, caller) + logit_weights
    edge_scores = normalized_pruned.values() * target_influence[rows]
    keep = edge_scores >= _threshold(edge_scores, edge_threshold)
    n = adj.shape[0]
    while True:  # the dense clean-up, with "any kept edge in this column / row" as a scatter of the kept ones
        before = node_mask.clone()
        has_out = torch.zeros(n, dtype=torch.bool, device=adj.device)
        has_out[cols[keep]] = True
        has_in = torch.zeros(n, dtype=torch.bool, device=adj.device)
        has_in[rows[keep]] = True
        node_mask[:-kept_always] &= has_out[:-kept_always]
        node_mask[:n_features] &= has_in[:n_features]
        if torch.equal(node_mask, before):
            return _with_values(adj, keep)
        keep &= node_mask[rows] & node_mask[cols]
