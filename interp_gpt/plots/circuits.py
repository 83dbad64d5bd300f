"""Pictures of circuits: the circuit as a graph (layers top to bottom) and faithfulness curves.

circuit_graph       the circuit's nodes (input, heads, MLPs, logits) and edges; edge width =
                    |score|, q / k / v edges coloured, hover shows each edge's name and score
faithfulness_plot   faithfulness against the number of edges kept, one line per curve
circuit_page        both in one figure, for `save_html(fig, "circuit.html")` (offline page)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..checks import check_type
from ..circuits.circuit import Circuit, FaithfulnessCurve
from ..circuits.graph import Graph
from .common import markup_safe

__all__ = ["circuit_graph", "faithfulness_plot", "circuit_page", "EDGE_COLORS"]

# Edge colours by what the receiver reads the edge as.
EDGE_COLORS = {"q": "#1f77b4", "k": "#d62728", "v": "#2ca02c", "mlp": "#7f7f7f", "logits": "#222222"}
_KIND_LABELS = {"q": "query", "k": "key", "v": "value", "mlp": "into an MLP", "logits": "into the logits"}
_QKV_OFFSET = {"q": -0.18, "k": 0.0, "v": 0.18}
_MAX_WIDTH, _MIN_WIDTH = 8.0, 0.75


def _positions(graph: Graph) -> dict[str, tuple[float, float]]:
    """Node -> (x, y): the input on top (y = 0), then each layer's heads (x = head) and its MLP
    (a column right of the heads, a row below them; attention-only models have none), logits
    last; y grows downwards (the axis is reversed)."""
    mid = (graph.n_heads - 1) / 2
    rows = 1 + graph.mlps_per_layer  # rows per layer
    pos = {"input": (mid, 0.0)}
    for layer in range(graph.n_layers):
        for h in range(graph.n_heads):
            pos[f"a{layer}.h{h}"] = (float(h), 1.0 + rows * layer)
        if graph.mlps_per_layer:
            pos[f"m{layer}"] = (float(graph.n_heads), 2.0 + rows * layer)
    pos["logits"] = (mid, 1.0 + rows * graph.n_layers)
    return pos


def _axis_labels(graph: Graph) -> tuple[list[str], list[str]]:
    """The y axis' row labels (input, attn 0, mlp 0, ..., logits) and the x axis' column labels."""
    kinds = ("attn", "mlp")[: 1 + graph.mlps_per_layer]
    layers = [f"{kind} {layer}" for layer in range(graph.n_layers) for kind in kinds]
    columns = [f"h{h}" for h in range(graph.n_heads)] + ["MLP"] * graph.mlps_per_layer
    return ["input", *layers, "logits"], columns


def _edge_data(circuit: Circuit, scores: Any) -> list[dict[str, Any]]:
    """One dict per kept edge: name, kind, score, width, colour, the end points."""
    g = circuit.graph
    s = circuit.scores if scores is None else scores
    if s is not None:
        s = Circuit(g, (), s).scores  # checks the shape
    assert s is None or s.shape == (g.n_edges,)
    idx = circuit.indices.tolist()
    mags = [abs(float(s[i])) for i in idx] if s is not None else []
    top = max((m for m in mags if math.isfinite(m)), default=0.0)
    pos = _positions(g)
    out = []
    for j, i in enumerate(idx):
        sender = g.senders[int(g.edge_sender[i])]
        r = g.receivers[int(g.edge_receiver[i])]
        kind = r.kind
        node = "logits" if kind == "logits" else (f"m{r.layer}" if kind == "mlp" else f"a{r.layer}.h{r.head}")
        x1, y1 = pos[node]
        x1 += _QKV_OFFSET.get(kind, 0.0)
        score = float(s[i]) if s is not None else float("nan")
        if s is None or top == 0.0 or not math.isfinite(score):
            width = 2.0
        else:
            width = _MIN_WIDTH + (_MAX_WIDTH - _MIN_WIDTH) * mags[j] / top
        out.append(
            dict(
                name=g.edge_name(i),
                kind=kind,
                score=score,
                width=width,
                color=EDGE_COLORS[kind],
                x=(pos[sender][0], x1),
                y=(pos[sender][1], y1),
            )  # fmt: skip
        )
    return out


def _add_graph(fig: go.Figure, circuit: Circuit, scores: Any, row: int | None = None) -> None:
    where = {} if row is None else {"row": row, "col": 1}
    g, pos = circuit.graph, _positions(circuit.graph)
    shown: set[str] = set()
    for e in _edge_data(circuit, scores):
        (x0, x1), (y0, y1) = e["x"], e["y"]
        label = markup_safe(e["name"]) + ("" if math.isnan(e["score"]) else f"<br>score {e['score']:.4g}")
        fig.add_trace(
            go.Scatter(
                x=[x0, (x0 + x1) / 2, x1], y=[y0, (y0 + y1) / 2, y1], mode="lines",
                line=dict(width=e["width"], color=e["color"]), opacity=0.75,
                name=_KIND_LABELS[e["kind"]], legendgroup=e["kind"], showlegend=e["kind"] not in shown,
                text=[label] * 3, hovertemplate="%{text}<extra></extra>", meta=e["name"],
            ),
            **where,
        )  # fmt: skip
        shown.add(e["kind"])
    nodes = [n for n in circuit.nodes if n not in ("input", "logits")]
    nodes = ["input", *nodes, "logits"]
    fig.add_trace(
        go.Scatter(
            x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers+text",
            text=[markup_safe(n) for n in nodes], textposition="middle right",
            marker=dict(size=14, color=["#ffbf00" if n.startswith("a") else "#9467bd" for n in nodes],
                        line=dict(width=1, color="black")),
            hovertemplate="%{text}<extra></extra>", name="nodes", showlegend=False,
        ),
        **where,
    )  # fmt: skip
    labels, columns = _axis_labels(g)
    fig.update_yaxes(
        autorange="reversed", tickvals=list(range(len(labels))), ticktext=labels, showgrid=False, zeroline=False, **where
    )  # fmt: skip
    fig.update_xaxes(
        tickvals=list(range(len(columns))), ticktext=columns,
        showgrid=False, zeroline=False, range=[-0.8, g.n_heads + 0.9], **where,
    )  # fmt: skip


def circuit_graph(circuit: Circuit, scores: Any = None, title: str | None = None) -> go.Figure:
    """The circuit as a graph: the input on top, each layer's heads (a row, by head index) and its
    MLP below, the logits at the bottom; only the circuit's nodes are drawn. Edge width is
    |score| (`scores`, default the circuit's own; uniform without), colour what the receiver reads
    it as: query, key, value (the three enter a head side by side), MLP, logits. Hover an edge's
    middle for its name and score.

    Example:
        >>> from interp_gpt.circuits import Circuit, eap_scores
        >>> c = Circuit.top_k(g, eap_scores(model, clean, corrupted, metric), 30).pruned()
        >>> fig = circuit_graph(c)                  # fig.show() in a notebook
    """
    check_type(circuit, Circuit, "circuit", "an interp_gpt.circuits.Circuit", "circuit_graph")
    fig = go.Figure()
    _add_graph(fig, circuit, scores)
    g = circuit.graph
    fig.update_layout(
        title=dict(text=markup_safe(title or f"circuit: {circuit.n_edges} of {g.n_edges} edges")),
        height=max(560, 60 * (2 * g.n_layers + 2)), width=max(820, 70 * g.n_heads + 300),
        plot_bgcolor="white", hoverlabel=dict(namelength=-1),
    )  # fmt: skip
    return fig


def _curves(curves: Any, caller: str) -> dict[str, FaithfulnessCurve]:
    if isinstance(curves, FaithfulnessCurve):
        return {"": curves}
    if isinstance(curves, Mapping) and curves and all(isinstance(c, FaithfulnessCurve) for c in curves.values()):
        return {str(k): v for k, v in curves.items()}
    raise TypeError(
        f"{caller}: curves must be a FaithfulnessCurve or a dict label -> FaithfulnessCurve, got {type(curves).__name__}"
    )


def _add_curves(fig: go.Figure, curves: dict[str, FaithfulnessCurve], row: int | None = None) -> None:
    where = {} if row is None else {"row": row, "col": 1}
    for label, c in curves.items():
        fig.add_trace(
            go.Scatter(
                x=list(c.n_edges), y=c.faithfulness.tolist(), mode="lines+markers", name=markup_safe(label or "faithfulness"),
                hovertemplate="%{x} edges: %{y:.3f}<extra>" + markup_safe(label) + "</extra>",
            ),
            **where,
        )  # fmt: skip
    for level in (0.0, 1.0):
        fig.add_hline(y=level, line=dict(dash="dot", color="grey", width=1), **where)
    fig.update_xaxes(title_text="edges kept", **where)
    fig.update_yaxes(title_text="faithfulness", **where)


def faithfulness_plot(curves: Any, title: str = "faithfulness against the number of edges kept") -> go.Figure:
    """Faithfulness curves (`faithfulness_curve`'s result, or a dict label -> result): 1 = the full
    model's metric, 0 = the empty circuit's.

    Example:
        >>> from interp_gpt.circuits import eap_ig_scores, eap_scores, faithfulness_curve
        >>> eap = eap_scores(model, clean, corrupted, metric)
        >>> ig = eap_ig_scores(model, clean, corrupted, metric, steps=5)
        >>> fig = faithfulness_plot({
        ...     "EAP": faithfulness_curve(model, clean, corrupted, eap, metric),
        ...     "EAP-IG": faithfulness_curve(model, clean, corrupted, ig, metric),
        ... })
    """
    fig = go.Figure()
    _add_curves(fig, _curves(curves, "faithfulness_plot"))
    fig.update_layout(title=dict(text=markup_safe(title)), height=420, width=720, plot_bgcolor="white")
    return fig


def circuit_page(circuit: Circuit, curves: Any = None, scores: Any = None, title: str | None = None) -> go.Figure:
    """The circuit graph and (optionally) faithfulness curves in one figure, to save as one
    offline page with `save_html`.

    Example:
        >>> from interp_gpt.circuits import Circuit, eap_scores, faithfulness_curve
        >>> scores = eap_scores(model, clean, corrupted, metric)
        >>> circuit = Circuit.top_k(g, scores, 30)
        >>> curve = faithfulness_curve(model, clean, corrupted, scores, metric)
        >>> save_html(circuit_page(circuit, {"EAP": curve}), "circuit.html")
        PosixPath('circuit.html')
    """
    check_type(circuit, Circuit, "circuit", "an interp_gpt.circuits.Circuit", "circuit_page")
    g = circuit.graph
    graph_height = max(560, 60 * (2 * g.n_layers + 2))
    if curves is None:
        return circuit_graph(circuit, scores, title)
    cs = _curves(curves, "circuit_page")
    fig = make_subplots(
        rows=2, cols=1, row_heights=[graph_height, 380], vertical_spacing=0.08,
        subplot_titles=[f"circuit: {circuit.n_edges} of {g.n_edges} edges", "faithfulness against edges kept"],
    )  # fmt: skip
    _add_graph(fig, circuit, scores, row=1)
    _add_curves(fig, cs, row=2)
    fig.update_layout(
        title=dict(text=markup_safe(title or "circuit")), height=graph_height + 500,
        width=max(820, 70 * g.n_heads + 300), plot_bgcolor="white", hoverlabel=dict(namelength=-1),
    )  # fmt: skip
    return fig
