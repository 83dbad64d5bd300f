"""`graph_page`: an attribution graph as one offline HTML page to explore it (circuit-tracer's viewer's job).

The page draws the nodes by layer (rows: embeddings at the bottom, features and error nodes by layer, logits
on top) and position (columns), the edges as lines (width: the weight's size; orange positive, blue
negative). Two sliders, node and edge threshold, prune the drawing live by `prune_graph`'s rule (rerun in
JavaScript: its masks, within float rounding); a detail panel shows a node's kind, place, activation,
influence and strongest edges, and for a feature, with `model` and `transcoders`, the tokens its decoder
row promotes and suppresses through the unembedding (no ln_final, no b_U) and, with `contexts`, where it
fires most; pins and supernodes are kept in localStorage under the graph's slug, as JSON to download.
The page is one file with its data a JSON block (every `<` escaped), text never put in as markup, and a
Content-Security-Policy that forbids every request: it opens offline. It holds the nodes `prune_graph`
ranks within `max_node_threshold` (0.99) of the influence, at most `max_nodes`, plus every embedding and
logit, and every edge among them; the edge slider goes up to 0.999.

Example (tiny-gpt2 and its shipped transcoders):
    >>> from interp_gpt import GPT
    >>> from interp_gpt.attribution import attribute, graph_page
    >>> from interp_gpt.sae.training import shipped_transcoders, split_corpus, token_windows
    >>> model = GPT.from_pretrained("tiny-gpt2")
    >>> tcs = shipped_transcoders(model)
    >>> graph = attribute(model, "The cat sat on the mat because", tcs)
    >>> windows = token_windows(model, split_corpus("data/corpus")[1], context_size=64, max_windows=64)
    >>> graph_page(graph, "graph.html", model=model, transcoders=tcs, contexts=windows)
    PosixPath('graph.html')
"""

from __future__ import annotations

import hashlib
import html
import inspect
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from ..checks import check_float, check_int_in_range, check_type
from ..files import write_atomic
from .graph import AttributionGraph
from .graph_json import graph_nodes
from .prune import check_graph, dense_adjacency, node_influences, prune_graph, row_normalized
from .sparse import is_sparse, row_ids
from .viewer_features import feature_details

__all__ = ["graph_page"]

_CALLER = "graph_page"
_ASSETS = Path(__file__).resolve().parent / "viewer_assets"
EDGE_MAX = 0.999  # the edge slider's top (see the module's docs)
_KINDS = {"cross layer transcoder": "feature", "mlp reconstruction error": "error", "embedding": "embedding"}


def _f32(x: float) -> float:
    """A float32 value in 9 significant digits: it reads back (as a float32) to the same value."""
    return float(f"{x:.9g}")


def default_slug(graph: AttributionGraph) -> str:
    """A name for the graph: the prompt's first words and a digest of its tokens and transcoders."""
    words = re.sub(r"[^a-z0-9]+", "-", graph.input_string.lower()).strip("-")[:40].strip("-") or "graph"
    key = json.dumps([graph.input_tokens.tolist(), graph.scan, graph.n_features, graph.n_logits])
    return f"{words}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def _token_text(model: Any, ids: list[int]) -> list[str]:
    """Each token's text ("#id" without a model or a tokenizer)."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return [f"#{i}" for i in ids]
    return [str(s) for s in tok.decode_each(ids)]


def _floor(
    graph: AttributionGraph, influence: Tensor, max_node_threshold: float, max_nodes: int
) -> tuple[Tensor, float]:
    """(`[n_nodes]` bool: the nodes the page holds, the node slider's top).

    The nodes are those `prune_graph` keeps before its clean-up at node threshold `max_node_threshold`
    (influence at least that of the node where the ranked cumulative share reaches it), at most the
    `max_nodes` best ranked (ties kept together), plus the embeddings and logits. At any node threshold
    up to the slider's top, `prune_graph`'s kept nodes are among them."""
    ordered = torch.sort(influence, descending=True).values
    cumulative = torch.cumsum(ordered, dim=0) / torch.sum(ordered)
    index = min(int(torch.searchsorted(cumulative, max_node_threshold).item()), len(cumulative) - 1)
    m = min(index + 1, max_nodes, max(int((ordered > 0).sum()), 1))
    held = influence >= ordered[m - 1]
    held[-(graph.n_pos + graph.n_logits) :] = True
    top = max_node_threshold if m == index + 1 else min(max_node_threshold, float(cumulative[m - 1]))
    return held, top


def _held_edges(adj: Tensor, held: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(targets, sources, weights) of every non-zero entry between held nodes, by (target, source)."""
    if is_sparse(adj):  # CSR: row-major, each row's columns ascending
        rows, cols, values = row_ids(adj), adj.col_indices(), adj.values()
        keep = held[rows] & held[cols] & (values != 0)
        return rows[keep], cols[keep], values[keep]
    held_index = torch.where(held)[0]
    sub = adj[held][:, held]
    targets, sources = sub.nonzero(as_tuple=True)
    return held_index[targets], held_index[sources], sub[targets, sources]


def page_data(graph: AttributionGraph, **options: Any) -> dict[str, Any]:
    """What `graph_page` embeds in the page, as a dict; `options` are `graph_page`'s keyword arguments
    (model, transcoders, contexts, slug, title, node_threshold, ...), with its defaults.

    `nodes`: one record per node held (id as in `to_json`, kind, layer, pos, feature, activation,
    influence (the raw influence prune_graph ranks by), cumulative (its cumulative share), label, token,
    prob; promoted / suppressed / contexts for features when computed); `edges`: a flat list
    `[source, target, weight, ...]` of every non-zero adjacency entry among them (indices into `nodes`)."""
    # Phase 1: the arguments
    o = _check_options(graph, options)

    # Phase 2: the nodes the page holds (prune_graph's rule, bounded by max_node_threshold and max_nodes)
    _, edge_mask, cumulative = prune_graph(graph, o.node_threshold, o.edge_threshold)
    adj, logit_weights = dense_adjacency(graph, _CALLER)
    influence = node_influences(row_normalized(adj), logit_weights, _CALLER)  # what prune_graph ranks by
    held, node_top = _floor(graph, influence, o.max_node_threshold, o.max_nodes)
    if o.node_threshold > node_top:
        raise ValueError(
            f"{_CALLER}: node_threshold={o.node_threshold} needs more than max_nodes={o.max_nodes} nodes (the page's "
            f"node slider reaches {node_top:.4f}); raise max_nodes or lower node_threshold"
        )

    # Phase 3: their records, with the features' details
    records = graph_nodes(graph, held, cumulative)
    index = sorted(records)
    tokens = _token_text(o.model, graph.input_tokens.tolist())
    extras = feature_details(
        graph, [records[i] for i in index], o.model, o.transcoders, o.contexts, o.n_tokens, o.n_contexts, _CALLER
    )
    n_layers = int(graph.cfg.n_layers)
    nodes = [_node_record(graph, records[i], i, adj.shape[0], influence, cumulative, tokens, extras) for i in index]

    # Phase 4: the edges among them
    where = {node: j for j, node in enumerate(index)}
    targets, sources, weights = _held_edges(adj.cpu(), held.cpu())
    edges: list[float | int] = []
    for t, s, w in zip(targets.tolist(), sources.tolist(), weights.tolist(), strict=True):
        edges += [where[s], where[t], _f32(w)]
    return {
        "schema": 1,
        "slug": o.slug or default_slug(graph),
        "title": o.title or "attribution graph",
        "prompt": graph.input_string,
        "tokens": tokens,
        "scan": graph.scan if isinstance(graph.scan, str) else None,
        "n_layers": n_layers,
        "n_pos": graph.n_pos,
        "node_threshold": o.node_threshold,
        "edge_threshold": o.edge_threshold,
        "node_max": _f32(node_top),
        "edge_max": EDGE_MAX,
        "max_nodes_cut": node_top < o.max_node_threshold,
        "n_graph_nodes": int(adj.shape[0]),
        "n_graph_edges": int((adj.values() != 0).sum()) if is_sparse(adj) else int((adj != 0).sum()),
        "n_kept_edges": int(edge_mask.values().sum()) if is_sparse(edge_mask) else int(edge_mask.sum()),
        "nodes": nodes,
        "edges": edges,
    }


def _check_options(graph: AttributionGraph, options: dict[str, Any]) -> SimpleNamespace:
    """`page_data`'s graph and options checked, by name; the options (`graph_page`'s keyword arguments, its
    defaults filled in) as attributes, the numbers as checked."""
    bound = inspect.signature(graph_page).bind(graph, "", **options)
    bound.apply_defaults()
    o = SimpleNamespace(**{k: v for k, v in bound.arguments.items() if k not in ("graph", "path")})
    check_graph(graph, _CALLER)
    o.max_node_threshold = check_float(o.max_node_threshold, "max_node_threshold", 0.0, 1.0, _CALLER)
    o.node_threshold = check_float(o.node_threshold, "node_threshold", 0.0, o.max_node_threshold, _CALLER)
    o.edge_threshold = check_float(o.edge_threshold, "edge_threshold", 0.0, EDGE_MAX, _CALLER)
    o.max_nodes = check_int_in_range(o.max_nodes, "max_nodes", 1, None, caller=_CALLER)
    o.n_tokens = check_int_in_range(o.n_tokens, "n_tokens", 1, None, caller=_CALLER)
    o.n_contexts = check_int_in_range(o.n_contexts, "n_contexts", 1, None, caller=_CALLER)
    for name, value in (("slug", o.slug), ("title", o.title)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise (TypeError if not isinstance(value, str) else ValueError)(
                f"{_CALLER}: {name}={value!r}: expected a non-empty string (or None)"
            )
    model = o.model
    if model is not None and not hasattr(model, "cfg"):
        raise TypeError(f"{_CALLER}: model: expected a GPT (or None), got {type(model).__name__}")
    if model is not None and (model.cfg.n_layers, model.cfg.d_vocab) != (graph.cfg.n_layers, graph.vocab_size):
        raise ValueError(
            f"{_CALLER}: model has {model.cfg.n_layers} layers and a {model.cfg.d_vocab}-token vocabulary; the graph "
            f"was made on {graph.cfg.n_layers} layers and {graph.vocab_size} tokens: pass the graph's model"
        )
    return o


def _node_record(
    graph: AttributionGraph,
    r: dict[str, Any],
    i: int,
    n_nodes: int,
    influence: Tensor,
    cumulative: Tensor,
    tokens: list[str],
    extras: dict[tuple[int, int], dict[str, Any]],
) -> dict[str, Any]:
    """The page's record of node `i` (`r`: its `graph_nodes` record)."""
    n_layers = int(graph.cfg.n_layers)
    kind = _KINDS.get(r["feature_type"], "logit")
    layer = -1 if kind == "embedding" else n_layers if kind == "logit" else int(r["layer"])
    node: dict[str, Any] = {
        "id": r["node_id"], "kind": kind, "layer": layer, "pos": int(r["ctx_idx"]),
        "influence": _f32(float(influence[i])), "cumulative": _f32(float(cumulative[i])),
    }  # fmt: skip
    if kind == "feature":
        node.update(feature=int(r["node_id"].split("_")[1]), activation=_f32(r["activation"]))
        node.update(extras.get((layer, node["feature"]), {}))
        node["label"] = f"L{layer} #{node['feature']}"
    elif kind == "error":
        node["label"] = f"error L{layer}"
    elif kind == "embedding":
        node["label"], node["token"] = f"emb {tokens[node['pos']]!r}", tokens[node["pos"]]
    else:
        k = i - (n_nodes - graph.n_logits)
        node.update(token=graph.logit_targets[k].token_str, prob=_f32(float(graph.logit_probabilities[k])))
        node["label"] = r["clerp"]
    return node


def _json_for_script(data: dict[str, Any]) -> str:
    """`data` as JSON that is safe inside a <script> block: every <, > and & as a \\u escape (so neither
    "</script>" nor "<!--" can appear), U+2028 / U+2029 escaped too."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def render_page(data: dict[str, Any]) -> str:
    """The page's HTML for `page_data`'s dict: one file, script and style inline, no request."""
    from ..plots.page import CSP

    script = (_ASSETS / "graph_viewer.js").read_text(encoding="utf-8")
    style = (_ASSETS / "graph_viewer.css").read_text(encoding="utf-8")
    for name, text in (("graph_viewer.js", script), ("graph_viewer.css", style)):
        if re.search(r"</(script|style)", text, re.IGNORECASE):  # would end its block early
            raise RuntimeError(f"{_CALLER}: {name} holds a closing </script> or </style> tag")
    title = html.escape(f"{data['title']}: {data['slug']}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style></head>
<body>
<header><h1 id="title"></h1><p id="prompt"></p><p id="summary"></p></header>
<div id="controls">
<label for="node-threshold">node threshold</label>
<input type="range" id="node-threshold" min="0.05" max="{data["node_max"]}" step="0.005" value="{data["node_threshold"]}">
<output id="node-threshold-value"></output>
<label for="edge-threshold">edge threshold</label>
<input type="range" id="edge-threshold" min="0.05" max="{data["edge_max"]}" step="0.001" value="{data["edge_threshold"]}">
<output id="edge-threshold-value"></output>
<span id="counts"></span>
</div>
<main>
<div id="graph-wrap"><svg id="graph" xmlns="http://www.w3.org/2000/svg" role="img" aria-label="attribution graph"></svg>
<p id="legend"></p></div>
<aside>
<section><h2>Node</h2><div id="details"><p class="hint">Hover a node; click to pin it.</p></div></section>
<section><h2>Pinned</h2><ul id="pinned"></ul>
<input id="group-name" type="text" maxlength="80" placeholder="supernode name">
<button id="group" type="button">group pinned</button> <button id="clear-pins" type="button">clear pins</button></section>
<section><h2>Supernodes</h2><ul id="supernodes"></ul>
<button id="download" type="button">download grouping</button>
<label class="upload">upload grouping <input type="file" id="upload" accept=".json,application/json"></label>
<p id="grouping-status"></p></section>
</aside>
</main>
<script type="application/json" id="graph-data">{_json_for_script(data)}</script>
<script>{script}</script>
</body></html>
"""


def graph_page(
    graph: AttributionGraph,
    path: str | os.PathLike[str],
    *,
    model: Any = None,
    transcoders: Any = None,
    contexts: Tensor | None = None,
    slug: str | None = None,
    title: str | None = None,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    max_node_threshold: float = 0.99,
    max_nodes: int = 600,
    n_tokens: int = 8,
    n_contexts: int = 5,
) -> Path:
    """Write `graph` as one offline HTML page to explore it (see the module's docs); returns the path.

    Args:
        graph: an `AttributionGraph` (from `attribute`).
        path: the page to write (whole or not at all; its folder is made if missing).
        model: the graph's `GPT`: token text (without it, tokens show as "#id") and, with `transcoders`,
            each feature's promoted and suppressed tokens.
        transcoders: the transcoders the graph was made with (a list, one per layer, or a
            `CrossLayerTranscoder`); needs `model`.
        contexts: token windows `[n, pos]` (e.g. `token_windows(model, texts)`) to find each feature's
            top-activating contexts on (position 0, the BOS, left out, as `attribute` leaves it out);
            needs `model` and `transcoders`.
        slug: the graph's name, and the key its pins and supernodes are saved under in the browser
            (default: the prompt's first words and a digest of its tokens).
        title: the page's heading (default "attribution graph").
        node_threshold: the node slider's first value (`prune_graph`'s default).
        edge_threshold: the edge slider's first value (`prune_graph`'s default).
        max_node_threshold: with `max_nodes`, which nodes the page holds, so its size stays bounded
            (see the module's docs); the node slider reaches `max_node_threshold` at most.
        max_nodes: the most nodes the page holds (see `max_node_threshold`).
        n_tokens: promoted and suppressed tokens per feature; n_contexts: contexts per feature.

    Example:
        >>> graph_page(attribute(model, "The cat sat on the", tcs), "graph.html", model=model, transcoders=tcs)
        PosixPath('graph.html')
    """
    check_type(graph, AttributionGraph, "graph", "an AttributionGraph (from attribute)", _CALLER)
    check_type(path, (str, os.PathLike), "path", "a file path (str or os.PathLike)", _CALLER)  # type: ignore[arg-type]
    data = page_data(
        graph, model=model, transcoders=transcoders, contexts=contexts, slug=slug, title=title,
        node_threshold=node_threshold, edge_threshold=edge_threshold, max_node_threshold=max_node_threshold,
        max_nodes=max_nodes, n_tokens=n_tokens, n_contexts=n_contexts,
    )  # fmt: skip
    return write_atomic(path, render_page(data))
