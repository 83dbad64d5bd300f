"""Attribution graphs over transcoders (circuit-tracer's job, on our hook points, offline).

`attribute(model, prompt, transcoders)` builds a graph (circuit-tracer's `attribute`, see `attribute.py`);
`AttributionGraph` holds it, with circuit-tracer's fields and node order (see `graph.py`).
`prune_graph` / `compute_graph_scores` prune and score it, `to_json` writes circuit-tracer's graph JSON;
`feature_intervention` / `feature_intervention_generate` set features and rerun or generate (see
`intervention.py`):

    >>> node_mask, edge_mask, cumulative_scores = prune_graph(graph, node_threshold=0.8, edge_threshold=0.98)
    >>> replacement, completeness = compute_graph_scores(graph)
    >>> to_json(graph, "graph.json", slug="my-prompt", tokenizer=model.tokenizer, scan="my-transcoders")
    >>> logits, activations = feature_intervention(model, prompt, transcoders, [(1, -1, 3, 5.0)])

`estimate_memory(model, transcoders, prompt_length, batch_size=...)` gives the peak memory a call will take,
part by part, before running it (see `memory.py`); `attribute` refuses a run that would not fit.

`qk_attribution(model, prompt, transcoders, layer, head, query_pos, key_pos)` splits a head's attention
score at (query, key) into query-side and key-side terms (see `qk.py`):

    >>> qk = qk_attribution(model, prompt, transcoders, layer=1, head=0, query_pos=12, key_pos=5)
    >>> qk.top_key_terms(5), qk.top_pairs(5)

`graph_page(graph, "graph.html", model=model, transcoders=transcoders)` writes one offline page to explore
the graph: live pruning sliders, node details, pins and supernodes (see `viewer.py`).
"""

from __future__ import annotations

from .attribute import attribute
from .graph import AttributionGraph, LogitTarget
from .graph_json import to_json
from .intervention import feature_intervention, feature_intervention_generate
from .memory import MemoryEstimate, estimate_memory
from .prune import PruneResult, compute_graph_scores, prune_graph
from .qk import QKAttribution, QKTerm, qk_attribution
from .viewer import graph_page

__all__ = [
    "AttributionGraph",
    "LogitTarget",
    "attribute",
    "MemoryEstimate",
    "estimate_memory",
    "PruneResult",
    "compute_graph_scores",
    "feature_intervention",
    "feature_intervention_generate",
    "graph_page",
    "prune_graph",
    "to_json",
    "QKAttribution",
    "QKTerm",
    "qk_attribution",
]
