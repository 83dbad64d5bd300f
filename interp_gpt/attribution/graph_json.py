"""An attribution graph as circuit-tracer's graph JSON (what its `create_graph_files` writes for one graph).

The file holds `metadata` (slug, scan, transcoder_list, prompt_tokens, prompt, node_threshold,
schema_version), `qParams`, `nodes` and `links`, in the schema of circuit-tracer's frontend, so its viewer
and Neuronpedia's read it. The graph is pruned first (`prune_graph`); a node is written when kept with a
kept edge to or from another kept node (embeddings and logits always); a link `{"source", "target",
"weight"}` per kept edge between kept nodes, by (target, source). Node records, as circuit-tracer's:

    feature    node_id "{layer}_{feature}_{pos}", feature = Cantor pairing of (layer, feature),
               feature_type "cross layer transcoder", influence, activation
    error      feature -1, feature_type "mlp reconstruction error", influence
    embedding  node_id "E_{token id}_{pos}", feature = pos, layer "E", influence
    logit      node_id "{n_layers + 1}_{token id}_{n_pos - 1}", layer "{n_layers + 1}", token_prob,
               is_target_logit for the first, clerp 'Output "{token}" (p=0.123)'

`influence` is the cumulative influence share (`PruneResult.cumulative_scores`). Token text is written as
it is (a page that shows it must escape it for HTML). Unlike circuit-tracer: error node ids are
"err_{layer}_{pos}" (its "0_{layer}_{pos}" is also a layer-0 feature's id); a list of transcoder names as
`scan` becomes "custom-" + 16 hex digits of the SHA-256 of the names joined by "-" (it uses Python's
`hash`); one file is written at `path`, atomically (no folder index).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..checks import check_float, check_type
from ..files import write_atomic
from .graph import AttributionGraph
from .prune import check_graph, prune_graph
from .sparse import as_csr, is_sparse, row_ids

__all__ = ["to_json"]

SCHEMA_VERSION = 1


def _cantor_pairing(x: int, y: int) -> int:
    """One integer for a pair of non-negative integers (the schema's `feature` of a feature node)."""
    return (x + y) * (x + y + 1) // 2 + y


def _node(
    node_id: str, feature: int, layer: str, ctx_idx: int, feature_type: str, js_node_id: str, **rest: Any
) -> dict:
    """A node record with every field of the schema's `Node`, in its order and with its defaults."""
    record: dict[str, Any] = {
        "node_id": node_id, "feature": feature, "layer": layer, "ctx_idx": ctx_idx, "feature_type": feature_type,
        "token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0, "jsNodeId": js_node_id,
        "clerp": "", "influence": None, "activation": None,
    }  # fmt: skip
    record.update(rest)
    return record


def graph_nodes(graph: AttributionGraph, node_mask: Any, cumulative_scores: Any) -> dict[int, dict]:
    """The record of every kept node, by node index."""
    n_features, n_layers, n_pos = graph.n_features, int(graph.cfg.n_layers), graph.n_pos
    error_end = n_features + n_layers * n_pos
    token_end = error_end + n_pos
    active = graph.active_features.tolist()
    selected = graph.selected_features.tolist()
    activations = graph.activation_values.tolist()
    tokens = graph.input_tokens.tolist()
    scores = cumulative_scores.tolist()
    probs = graph.logit_probabilities.tolist()
    nodes = {}
    for i in node_mask.nonzero().flatten().tolist():
        if i < n_features:
            layer, pos, feat = (int(v) for v in active[selected[i]])
            nodes[i] = _node(
                f"{layer}_{feat}_{pos}", _cantor_pairing(layer, feat), str(layer), pos, "cross layer transcoder",
                f"{layer}_{feat}-0", influence=scores[i], activation=float(activations[selected[i]]),
            )  # fmt: skip
        elif i < error_end:
            layer, pos = divmod(i - n_features, n_pos)
            nodes[i] = _node(
                f"err_{layer}_{pos}", -1, str(layer), pos, "mlp reconstruction error", f"{layer}_{pos}-0",
                influence=scores[i],
            )  # fmt: skip
        elif i < token_end:
            pos = i - error_end
            token = int(tokens[pos])
            nodes[i] = _node(f"E_{token}_{pos}", pos, "E", pos, "embedding", f"E_{token}-{pos}", influence=scores[i])
        else:
            k = i - token_end
            label, vocab_idx = graph.logit_targets[k]
            layer_name, prob = str(n_layers + 1), float(probs[k])
            nodes[i] = _node(
                f"{layer_name}_{vocab_idx}_{n_pos - 1}", int(vocab_idx), layer_name, n_pos - 1, "logit",
                f"L_{vocab_idx}-{n_pos - 1}", token_prob=prob, is_target_logit=k == 0,
                clerp=f'Output "{label}" (p={prob:.3f})',
            )  # fmt: skip
    return nodes


def _scan(graph: AttributionGraph, scan: Any) -> tuple[str, list[str]]:
    """The metadata's (scan, transcoder_list) from `scan` or the graph's own."""
    scan = graph.scan if scan is None else scan
    if scan is None:
        raise ValueError(
            "to_json: scan=None and graph.scan is None: name the transcoders the graph was made with "
            "(a string, or a list of names), as circuit-tracer requires"
        )
    if isinstance(scan, str):
        return scan, []
    if isinstance(scan, (list, tuple)) and scan and all(isinstance(s, str) for s in scan):
        digest = hashlib.sha256("-".join(scan).encode()).hexdigest()[:16]
        return f"custom-{digest}", list(scan)
    raise TypeError(f"to_json: scan must be a string or a non-empty list of strings, got {scan!r}")


def graph_json(
    graph: AttributionGraph,
    *,
    slug: str,
    tokenizer: Any,
    scan: str | list[str] | None = None,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
) -> dict[str, Any]:
    """The JSON object `to_json` writes (see there), as a dict."""
    check_graph(graph, "to_json")
    if not isinstance(slug, str) or not slug:
        raise (TypeError if not isinstance(slug, str) else ValueError)(
            f"to_json: slug must be a non-empty string naming the graph, got {slug!r}"
        )
    if not callable(getattr(tokenizer, "decode", None)):
        raise TypeError(
            f"to_json: tokenizer must have a decode(token_id) method (e.g. model.tokenizer), "
            f"got {type(tokenizer).__name__}"
        )
    check_float(node_threshold, "node_threshold", 0.0, 1.0, "to_json")
    check_float(edge_threshold, "edge_threshold", 0.0, 1.0, "to_json")
    scan_name, transcoder_list = _scan(graph, scan)
    node_mask, edge_mask, cumulative_scores = (t.cpu() for t in prune_graph(graph, node_threshold, edge_threshold))
    prompt_tokens = [str(tokenizer.decode(int(t))) for t in graph.input_tokens.tolist()]

    nodes = graph_nodes(graph, node_mask, cumulative_scores)
    adjacency = graph.adjacency_matrix.detach().cpu()
    if is_sparse(adjacency):  # the mask has the CSR adjacency's indices: its kept entries, in row-major order
        adjacency, keep = as_csr(adjacency), edge_mask.values()
        dsts, srcs = row_ids(adjacency)[keep], adjacency.col_indices()[keep]
        weights = adjacency.values()[keep].tolist()
    else:
        dsts, srcs = edge_mask.nonzero(as_tuple=True)
        weights = adjacency[dsts, srcs].tolist()
    links = [
        {"source": nodes[s]["node_id"], "target": nodes[d]["node_id"], "weight": w}
        for d, s, w in zip(dsts.tolist(), srcs.tolist(), weights, strict=True)
        if s in nodes and d in nodes
    ]
    connected = {link["source"] for link in links} | {link["target"] for link in links}
    used = [n for n in nodes.values() if n["node_id"] in connected or n["feature_type"] in ("embedding", "logit")]
    metadata = {
        "slug": slug, "scan": scan_name, "transcoder_list": transcoder_list, "prompt_tokens": prompt_tokens,
        "prompt": graph.input_string, "node_threshold": float(node_threshold), "schema_version": SCHEMA_VERSION,
    }  # fmt: skip
    q_params = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": q_params, "nodes": used, "links": links}


def to_json(
    graph: AttributionGraph,
    path: str | os.PathLike[str],
    *,
    slug: str,
    tokenizer: Any,
    scan: str | list[str] | None = None,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
) -> Path:
    """Write `graph`, pruned, as circuit-tracer's graph JSON to `path` (whole or not at all); returns the path.

    Args:
        graph: an `AttributionGraph`.
        path: the file to write (a `.json` file; its folder is made if missing).
        slug: the graph's name in the viewer.
        tokenizer: anything with `decode(token_id) -> str` (e.g. `model.tokenizer`): the prompt's tokens.
        scan: the transcoders' name (or a list of names), default `graph.scan`.
        node_threshold: passed to `prune_graph`.
        edge_threshold: passed to `prune_graph`.

    Example:
        >>> to_json(graph, "graphs/induction.json", slug="induction", tokenizer=model.tokenizer, scan="tiny-plt")
    """
    check_type(path, (str, os.PathLike), "path", "a file path (str or os.PathLike)", "to_json")  # type: ignore[arg-type]
    data = graph_json(
        graph, slug=slug, tokenizer=tokenizer, scan=scan, node_threshold=node_threshold, edge_threshold=edge_threshold
    )
    return write_atomic(path, json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False))
