"""Circuits (sets of edges of a `Graph`): choosing them from edge scores (top-k, a threshold,
ACDC's greedy walk), pruning what no longer connects the input to the logits, and measuring them.

A circuit's edges keep their clean values; every other edge is patched (takes its sender's
corrupted value, or an ablation's), exactly as `patch_edges` does, and every evaluation here runs
through `patch_edges`' batched forward. Faithfulness is

    (metric(circuit) - metric(empty circuit)) / (metric(full model) - metric(empty circuit))

where the empty circuit patches every edge (with corrupted tokens: the corrupted run) and the full
model patches none (the clean run). With corrupted tokens this is transformer-lens 4.3's
`faithfulness(...).recovered`, `(m_ablated - m_corrupt) / (m_clean - m_corrupt)`; with a "mean"
ablation transformer-lens still divides by the clean-minus-corrupted-tokens gap, we by the
clean-minus-everything-ablated one, so that the empty circuit is 0 under any ablation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_float, check_int_in_range, check_type
from ..model.gpt import GPT
from ._inputs import circuit_model, prepare
from ._run import Metric
from .graph import Graph

__all__ = ["Circuit", "FaithfulnessCurve", "acdc", "faithfulness", "faithfulness_curve"]


def _check_scores(graph: Graph, scores: Any, caller: str) -> Tensor:
    if not isinstance(scores, Tensor) or scores.shape != (graph.n_edges,) or not scores.is_floating_point():
        got = f"{scores.dtype} {tuple(scores.shape)}" if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"{caller}: scores must be a float tensor [{graph.n_edges}] (one per edge), got {got}")
    return scores.detach().cpu().float()


class Circuit:
    """A set of edges of a `Graph`, kept as a bool mask `[n_edges]` (with the scores it was chosen by).

    Build one from names (`Circuit(graph, ["a0.h0 -> a1.h0<k>", "a1.h0 -> logits"])`), from scores
    (`Circuit.top_k`, `Circuit.above`) or with `acdc`.

    Example:
        >>> g = Graph.from_model(model)
        >>> c = Circuit.top_k(g, eap_scores(model, clean, corrupted, metric), k=20).pruned()
        >>> c.n_edges, c.edges[:3], c.nodes
        >>> faithfulness(model, clean, corrupted, c, metric)
    """

    def __init__(self, graph: Graph, edges: Any = (), scores: Tensor | None = None):
        self.graph = check_type(graph, Graph, "graph", "an interp_gpt.circuits.Graph", "Circuit")
        self.mask: Tensor = graph.edge_mask(edges, caller="Circuit")
        self.scores = None if scores is None else _check_scores(graph, scores, "Circuit")

    # ----- building ----------------------------------------------------------
    @classmethod
    def top_k(cls, graph: Graph, scores: Tensor, k: int, absolute: bool = True) -> Circuit:
        """The `k` edges with the largest scores (by magnitude with `absolute`; NaN scores last)."""
        s = _check_scores(graph, scores, "Circuit.top_k")
        k = check_int_in_range(k, "k", 0, graph.n_edges, "edge counts", caller="Circuit.top_k")
        return cls(graph, _top(s, absolute, k), s)

    @classmethod
    def above(cls, graph: Graph, scores: Tensor, threshold: float, absolute: bool = True) -> Circuit:
        """The edges whose score (its magnitude with `absolute`) is at least `threshold`."""
        s = _check_scores(graph, scores, "Circuit.above")
        t = check_float(threshold, "threshold", float("-inf"), caller="Circuit.above")
        key = s.abs() if absolute else s
        return cls(graph, key >= t, s)

    # ----- views -------------------------------------------------------------
    @property
    def indices(self) -> Tensor:
        """The kept edges' indices `[n_edges kept]`, ascending."""
        return self.mask.nonzero().flatten()

    @property
    def n_edges(self) -> int:
        """How many edges the circuit keeps."""
        return int(self.mask.sum())

    def __len__(self) -> int:
        return self.n_edges

    @property
    def edges(self) -> list[str]:
        """The kept edges' names, in graph order."""
        return [self.graph.edge_name(int(i)) for i in self.indices]

    @property
    def nodes(self) -> list[str]:
        """The nodes that send or receive a kept edge, in forward order (`graph.nodes`' order)."""
        used = torch.zeros(self.graph.n_nodes, dtype=torch.bool)
        used[self.graph.edge_sender[self.mask]] = True
        used[self.graph.receiver_node[self.graph.edge_receiver[self.mask]]] = True
        return [self.graph.nodes[i] for i in used.nonzero().flatten().tolist()]

    def __contains__(self, edge: Any) -> bool:
        return bool(self.mask[self.graph.edge_indices(edge)].all())

    def __repr__(self) -> str:
        return f"Circuit({self.n_edges} of {self.graph.n_edges} edges, {len(self.nodes)} nodes)"

    # ----- pruning -----------------------------------------------------------
    def pruned(self) -> Circuit:
        """The circuit without edges that cannot matter: an edge into a node none of whose kept
        outgoing edges leads on to the logits, and an edge out of a node no kept path reaches from
        the input. Repeated until nothing changes.

        Example:
            >>> Circuit(g, ["input -> a0.h0<q>", "a0.h0 -> a1.h1<v>"]).pruned().edges   # a1.h1 reaches nothing
            []
        """
        return Circuit(self.graph, prune_mask(self.graph, self.mask), self.scores)


def _top(scores: Tensor, absolute: bool, k: int) -> Tensor:
    """A bool mask of the `k` top-ranked edges."""
    mask = torch.zeros(len(scores), dtype=torch.bool)
    mask[_order(scores, absolute)[:k]] = True
    return mask


def _order(scores: Tensor, absolute: bool) -> Tensor:
    key = scores.abs() if absolute else scores.clone()
    key[key.isnan()] = float("-inf")
    return key.argsort(descending=True, stable=True)


def prune_mask(graph: Graph, mask: Tensor) -> Tensor:
    """`mask [n_edges]` without the edges that do not lie on a path input -> ... -> logits."""
    mask = mask.clone()
    sender, dest = graph.edge_sender, graph.receiver_node[graph.edge_receiver]
    n = graph.n_nodes
    while True:
        # Backwards: a node reaches the logits if a kept edge leads from it to a node that does.
        # Nodes are in topological order (every edge goes from a lower to a higher node index).
        reach = torch.zeros(n, dtype=torch.bool)
        reach[n - 1] = True
        for node in range(n - 2, -1, -1):
            reach[node] = bool((mask & (sender == node) & reach[dest]).any())
        # Forwards: a node is reached from the input if a kept edge leads to it from one that is.
        fed = torch.zeros(n, dtype=torch.bool)
        fed[0] = True
        for node in range(1, n):
            fed[node] = bool((mask & (dest == node) & fed[sender]).any())
        new = mask & reach[dest] & fed[sender]
        if bool((new == mask).all()):
            return new
        mask = new


# ----------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------
class _Evaluator:
    """The clean run, the corrupted (or ablation) values and the metric, run once; then the metric
    of any circuits (their complements patched) through `patch_edges`' batched forward."""

    def __init__(self, model: Any, clean: Any, corrupted: Any, metric: Metric, caller: str, **kw: Any):
        self.prepared = prepare(model, clean, corrupted, kw.pop("reference", None), kw.pop("seed", 0), caller=caller)
        self.graph, self.metric, self.kw = self.prepared.graph, metric, kw

    def __call__(self, masks: Sequence[Tensor], progress: bool, desc: str) -> Tensor:
        """Metric `[len(masks)]` of the circuits `masks` (bool `[n_edges]` each); equal masks are run once."""
        return self.prepared.run_circuits(masks, self.metric, progress=progress, desc=desc, **self.kw)


def _circuit_mask(graph: Graph, circuit: Any, caller: str) -> Tensor:
    if isinstance(circuit, Circuit):
        if circuit.graph.cfg.n_layers != graph.n_layers or circuit.graph.n_edges != graph.n_edges:
            raise ValueError(
                f"{caller}: circuit is a circuit of another graph ({circuit.graph!r}); the model's is {graph!r}"
            )
        return circuit.mask
    return graph.edge_mask(circuit, arg="circuit", caller=caller)


def faithfulness(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    circuit: Any,
    metric: Metric,
    *,
    reference: Any = None,
    seed: int = 0,
    logit_positions: Any = None,
    batch_size: int | None = None,
    progress: bool = False,
) -> float:
    """How much of the full model's metric a circuit recovers: `(metric(circuit) - metric(empty)) /
    (metric(full) - metric(empty))` (see the module's docs): 1 for the full graph, 0 for no edges.

    Args:
        circuit: a `Circuit`, or edges (names, indices, a bool mask `[n_edges]`): they keep their
            clean values, every other edge is patched.
        corrupted_tokens: tokens of the clean ones' shape, or "zero" / "mean" / "resample".
        metric: logits `[batch, pos, d_vocab]` -> a scalar.

    Example:
        >>> scores = eap_scores(model, clean, corrupted, metric)
        >>> f = faithfulness(model, clean, corrupted, Circuit.top_k(g, scores, 50), metric)  # 1.0: the whole effect
    """
    mask = _circuit_mask(Graph(circuit_model(model, "faithfulness").cfg), circuit, "faithfulness")
    ev = _Evaluator(
        model, clean_tokens, corrupted_tokens, metric, "faithfulness",
        reference=reference, seed=seed, logit_positions=logit_positions, batch_size=batch_size,
    )  # fmt: skip
    full, empty = torch.ones_like(mask), torch.zeros_like(mask)
    m_circuit, m_full, m_empty = ev([mask, full, empty], progress, "faithfulness").tolist()
    return _ratio(m_circuit, m_full, m_empty)


def _ratio(value: float, full: float, empty: float) -> float:
    if full == empty:
        raise ValueError(
            f"faithfulness is undefined: the full model and the empty circuit give the same metric ({full}); "
            "choose clean and corrupted inputs the metric separates"
        )
    return (value - empty) / (full - empty)


@dataclass
class FaithfulnessCurve:
    """Faithfulness of the top-k circuits: `n_edges[i]` edges kept, `faithfulness[i]` and the raw
    `metric[i]`; `full` / `empty`: the metric with every / no edge kept; `order`: the edges by rank."""

    n_edges: list[int]
    faithfulness: Tensor
    metric: Tensor
    full: float
    empty: float
    order: Tensor


def faithfulness_curve(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    scores: Tensor,
    metric: Metric,
    n_edges: Sequence[int] | None = None,
    *,
    absolute: bool = True,
    prune: bool = False,
    reference: Any = None,
    seed: int = 0,
    logit_positions: Any = None,
    batch_size: int | None = None,
    progress: bool = True,
) -> FaithfulnessCurve:
    """Faithfulness of the top-k edges by `scores` for many k, all in batched patched forwards.

    Args:
        scores: `[n_edges]` edge scores (EAP, EAP-IG, exact), ranked by magnitude with `absolute`.
        n_edges: the edge counts k (default: 0, then about 30 counts spaced evenly up to all).
        prune: prune each top-k circuit (`Circuit.pruned`) before running it; `n_edges` stays k.

    Returns:
        A `FaithfulnessCurve`.

    Example:
        >>> curve = faithfulness_curve(model, clean, corrupted, eap_scores(model, clean, corrupted, metric), metric)
        >>> curve.n_edges[:3], curve.faithfulness[:3]
    """
    graph = Graph(circuit_model(model, "faithfulness_curve").cfg)
    s = _check_scores(graph, scores, "faithfulness_curve")
    total = graph.n_edges
    if n_edges is None:
        ks = sorted({round(total * i / 30) for i in range(31)})
    else:
        if isinstance(n_edges, (str, int)) or not isinstance(n_edges, Sequence) or not n_edges:
            raise TypeError(f"faithfulness_curve: n_edges must be a non-empty list of edge counts, got {n_edges!r}")
        ks = [check_int_in_range(k, "n_edges", 0, total, "edge counts", caller="faithfulness_curve") for k in n_edges]
    ev = _Evaluator(
        model, clean_tokens, corrupted_tokens, metric, "faithfulness_curve",
        reference=reference, seed=seed, logit_positions=logit_positions, batch_size=batch_size,
    )  # fmt: skip
    order = _order(s, absolute)
    masks = []
    for k in ks:
        m = torch.zeros(total, dtype=torch.bool)
        m[order[:k]] = True
        masks.append(prune_mask(graph, m) if prune else m)
    values = ev([*masks, torch.ones(total, dtype=torch.bool), torch.zeros(total, dtype=torch.bool)], progress,
                "faithfulness curve")  # fmt: skip
    full, empty = float(values[-2]), float(values[-1])
    _ratio(full, full, empty)
    faith = torch.tensor([_ratio(float(v), full, empty) for v in values[:-2]])
    return FaithfulnessCurve(list(ks), faith, values[:-2], full, empty, order)


# ----------------------------------------------------------------------------
# ACDC
# ----------------------------------------------------------------------------
def acdc(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    metric: Metric,
    tau: float,
    *,
    reference: Any = None,
    seed: int = 0,
    logit_positions: Any = None,
    batch_size: int | None = None,
    progress: bool = True,
) -> Circuit:
    """ACDC's greedy circuit search (Conmy et al. 2023), with its decisions, batched.

    Start from the full graph; walk the receivers from the logits backwards; for each incoming edge
    of a receiver whose node still reaches the logits, remove it (patch it) and keep it removed if
    the metric moves by less than `tau` from the current circuit's. Edges into nodes that no
    longer reach the logits are dropped without a run. The tries of one receiver are batched
    speculatively: one forward evaluates "remove e1", "remove e1, e2", ...; the walk accepts those
    decisions up to the first edge that is kept, then runs the rest again from there, so the
    result is the sequential algorithm's.

    Args:
        metric: logits -> a scalar; with a distance to the clean run (e.g. KL divergence) this is
            ACDC as published, any metric works.
        tau: the threshold on `|metric(without edge) - metric(current)|`.

    Returns:
        The `Circuit` found, pruned (`Circuit.pruned`).

    Example:
        >>> c = acdc(model, clean, corrupted, metric, tau=0.01)
        >>> c.edges
    """
    tau = check_float(tau, "tau", float("-inf"), caller="acdc")
    ev = _Evaluator(
        model, clean_tokens, corrupted_tokens, metric, "acdc",
        reference=reference, seed=seed, logit_positions=logit_positions, batch_size=batch_size,
    )  # fmt: skip
    graph = ev.graph
    mask = torch.ones(graph.n_edges, dtype=torch.bool)
    current = float(ev([mask], False, "acdc")[0])
    rnode = graph.receiver_node
    bar = tqdm(total=len(graph.receivers), desc="ACDC receivers", disable=not progress)
    try:
        for r in range(len(graph.receivers) - 1, -1, -1):
            bar.update(1)
            lo = graph.receiver_offsets[r]
            edges = list(range(lo, lo + graph.receiver_n_senders[r]))
            node = int(rnode[r])
            # The node's outgoing edges were all decided (they lead to later receivers), and every
            # node they lead to still reaches the logits: with none left, this node reaches nothing.
            if node != graph.n_nodes - 1 and not bool(mask[graph.edge_sender == node].any()):
                mask[edges] = False
                continue
            todo = [e for e in reversed(edges) if mask[e]]  # the latest senders first, as ACDC does
            while todo:
                tries = []
                m = mask.clone()
                for e in todo:
                    m[e] = False
                    tries.append(m.clone())
                values = ev(tries, False, "acdc").tolist()
                for i, (e, v) in enumerate(zip(todo, values, strict=True)):
                    if abs(v - current) < tau:
                        mask[e] = False
                        current = v
                    else:
                        todo = todo[i + 1 :]
                        break
                else:
                    todo = []
    finally:
        bar.close()
    return Circuit(graph, prune_mask(graph, mask))
