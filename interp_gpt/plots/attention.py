"""Pictures of attention: one head's pattern, every head of a layer, and the viewer that
holds every head of every layer behind a layer and a head menu.

Each takes a cache (from `model.run_with_cache`) or the pattern tensors themselves, and the
string tokens that label both axes.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

from ..cache import ActivationCache
from ..checks import cached_activation, check_index, check_int, check_int_in_range, check_rank
from ..inspect import stack_patterns
from .common import ATTENTION_COLORS, as_array, axis_labels, token_axis

__all__ = ["attention_heatmap", "attention_grid", "attention_viewer"]


# ----------------------------------------------------------------------------
# finding the patterns
# ----------------------------------------------------------------------------
def _check_layer(layer: Any, n_layers: int, caller: str) -> int:
    return check_index(layer, n_layers, "layer", f"layers of this {n_layers}-layer model", caller=caller)


def _check_batch(batch: Any, n_batch: int, caller: str) -> int:
    return check_index(batch, n_batch, "batch", f"the {n_batch} prompts", caller=caller)


def _square(pattern: Tensor, caller: str) -> Tensor:
    if pattern.shape[-1] != pattern.shape[-2]:
        raise ValueError(
            f"{caller}: an attention pattern is [query_pos, key_pos] with as many keys as queries, "
            f"got shape {tuple(pattern.shape)}"
        )
    return pattern


def _layer_pattern(source: Any, layer: Any, batch: int, caller: str) -> tuple[Tensor, int | None]:
    """One layer's pattern [n_heads, q_pos, k_pos], from a cache (needs `layer`) or a tensor."""
    if isinstance(source, ActivationCache):
        if layer is None:
            raise ValueError(
                f"{caller}: layer is required with a cache (layers are 0..{source.model.cfg.n_layers - 1})"
            )
        layer = _check_layer(layer, source.model.cfg.n_layers, caller)
        pattern = cached_activation(source, f"blocks.{layer}.attn.hook_pattern", caller)
    elif isinstance(source, Tensor):
        layouts = "[q_pos, k_pos], [head, q_pos, k_pos] or [batch, head, q_pos, k_pos] as cached"
        check_rank(source, (2, 3, 4), "pattern", layouts, caller)
        pattern = source.reshape((1,) * (4 - source.ndim) + tuple(source.shape))
        layer = None if layer is None else check_int(layer, "layer", caller)
    else:
        raise TypeError(
            f"{caller}: expected an ActivationCache or an attention-pattern tensor, got {type(source).__name__}"
        )
    return _square(pattern[_check_batch(batch, pattern.shape[0], caller)], caller), layer


def _all_patterns(source: Any, batch: int, caller: str) -> Tensor:
    """Every layer's patterns [n_layers, n_heads, q_pos, k_pos], from a cache or a tensor."""
    if isinstance(source, ActivationCache):
        stacked = stack_patterns(source)
        return _square(stacked[:, _check_batch(batch, stacked.shape[1], caller)], caller)
    if not isinstance(source, Tensor):
        raise TypeError(f"{caller}: expected an ActivationCache or a tensor of patterns, got {type(source).__name__}")
    layouts = "[head, q_pos, k_pos] for one layer, [layer, head, q_pos, k_pos], or [layer, batch, head, q_pos, k_pos]"
    check_rank(source, (3, 4, 5), "patterns", layouts, caller)
    if source.ndim == 5:
        source = source[:, _check_batch(batch, source.shape[1], caller)]
    return _square(source if source.ndim == 4 else source[None], caller)


def _pick_head(head: Any, n_heads: int, caller: str) -> int:
    if head is None:
        if n_heads == 1:
            return 0
        raise ValueError(f"{caller}: the pattern has {n_heads} heads; pass head=0..{n_heads - 1}")
    return check_index(head, n_heads, "head", f"the {n_heads} heads", caller=caller)


_ATTENTION_HOVER = "query %{y}<br>key %{x}<br>attention %{z:.3f}<extra></extra>"


def _attention_trace(pattern: Tensor, positions: list[str], **kwargs: Any) -> go.Heatmap:
    kwargs.setdefault("hovertemplate", _ATTENTION_HOVER)
    return go.Heatmap(z=as_array(pattern), x=positions, y=positions, **kwargs)


def _attention_size(labels: list[str]) -> dict[str, int]:
    """Width and height for a square pattern: ~24 px a position plus room for the labels."""
    label_px = 7 * max(len(html.unescape(x)) for x in labels)
    side = max(300, min(900, 24 * len(labels))) + label_px + 120
    return dict(width=max(640, side + 100), height=side)


# ----------------------------------------------------------------------------
# the figures
# ----------------------------------------------------------------------------
def attention_heatmap(
    source: ActivationCache | Tensor,
    str_tokens: Sequence[str],
    layer: int | None = None,
    head: int | None = None,
    batch: int = 0,
    title: str | None = None,
) -> go.Figure:
    """One head's attention pattern: queries down, keys across, the tokens on both axes,
    the probability on hover.

    `source`: a cache (give `layer`), or one layer's pattern [q_pos, k_pos],
    [head, q_pos, k_pos] or [batch, head, q_pos, k_pos] (as cached).

    Example:
        >>> _, cache = model.run_with_cache("The cat sat on the mat")
        >>> fig = attention_heatmap(cache, model.to_str_tokens("The cat sat on the mat"), layer=0, head=3)
    """
    caller = "attention_heatmap"
    pattern, layer = _layer_pattern(source, layer, batch, caller)
    h = _pick_head(head, pattern.shape[0], caller)
    labels = axis_labels(str_tokens, pattern.shape[-1], caller, f"the pattern (shape {tuple(pattern.shape[-2:])})")
    x_axis = token_axis(labels, "key (attended to)")
    fig = go.Figure(
        _attention_trace(
            pattern[h],
            x_axis["tickvals"],
            zmin=0.0,
            zmax=1.0,
            colorscale=ATTENTION_COLORS,
            colorbar=dict(title=dict(text="attention")),
        )
    )
    where = f"layer {layer}, head {h}" if layer is not None else f"head {h}"
    fig.update_layout(
        title=dict(text=title or f"Attention pattern, {where}"),
        xaxis=x_axis,
        yaxis=dict(token_axis(labels, "query (attending)"), autorange="reversed"),
        **_attention_size(labels),
    )
    return fig


def attention_grid(
    source: ActivationCache | Tensor,
    str_tokens: Sequence[str],
    layer: int | None = None,
    batch: int = 0,
    cols: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """Every head of one layer, side by side, on one colour scale.

    `source` as in `attention_heatmap`. `cols`: heads per row (default: about square).

    Example:
        >>> _, cache = model.run_with_cache("The cat sat on the mat")
        >>> fig = attention_grid(cache, model.to_str_tokens("The cat sat on the mat"), layer=0)
    """
    caller = "attention_grid"
    pattern, layer = _layer_pattern(source, layer, batch, caller)
    n_heads, n_pos = pattern.shape[0], pattern.shape[-1]
    labels = axis_labels(str_tokens, n_pos, caller, f"the pattern (shape {tuple(pattern.shape[-2:])})")
    if cols is None:
        cols = math.ceil(math.sqrt(n_heads))
    cols = min(check_int_in_range(cols, "cols", 1, None, caller=caller), n_heads)
    rows = math.ceil(n_heads / cols)
    side = max(260, min(500, 16 * n_pos + 160))
    # Room between panels for the next panel's token labels (about 7 px a character) and axis title.
    gap = 7 * max(len(html.unescape(x)) for x in labels) + 50
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[f"head {h}" for h in range(n_heads)],
        horizontal_spacing=min(0.5 / cols, gap / (side * cols + gap)) if cols > 1 else 0.0,
        vertical_spacing=min(0.5 / rows, (gap + 20) / (side * rows + gap)) if rows > 1 else 0.0,
    )
    positions = token_axis(labels, "key")["tickvals"]
    for h in range(n_heads):
        r, c = divmod(h, cols)
        fig.add_trace(
            _attention_trace(pattern[h], positions, coloraxis="coloraxis", name=f"head {h}"), row=r + 1, col=c + 1
        )
        fig.update_xaxes(token_axis(labels, "key"), row=r + 1, col=c + 1)
        fig.update_yaxes(dict(token_axis(labels, "query"), autorange="reversed"), row=r + 1, col=c + 1)
    where = f"layer {layer}" if layer is not None else "one layer"
    fig.update_layout(
        title=dict(text=title or f"Attention patterns, every head of {where}"),
        coloraxis=dict(cmin=0.0, cmax=1.0, colorscale=ATTENTION_COLORS, colorbar=dict(title=dict(text="attention"))),
        width=(side + gap) * cols + 120,
        height=(side + gap) * rows + 100,
    )
    return fig


def attention_viewer(
    source: ActivationCache | Tensor,
    str_tokens: Sequence[str],
    batch: int = 0,
    layer: int = 0,
    head: int = 0,
    title: str | None = None,
) -> go.Figure:
    """Every head of every layer in one figure, with a "layer" and a "head" menu.

    The menus are plotly's own (no extra JavaScript), so they work in a notebook and in the
    page `save_html` writes (one file, plotly.js inside, offline). Each head is a trace;
    the layer menu sets which layer's traces are visible, the head menu which head of the
    visible layer is opaque (and alone answers hover).

    `source`: a cache, or patterns [layer, head, q_pos, k_pos] (or [layer, batch, head,
    q_pos, k_pos]; or [head, q_pos, k_pos] for one layer). `layer`, `head`: shown first.

    Example:
        >>> _, cache = model.run_with_cache("The cat sat on the mat")
        >>> fig = attention_viewer(cache, model.to_str_tokens("The cat sat on the mat"))
        >>> save_html(fig, "attention.html")
    """
    caller = "attention_viewer"
    patterns = _all_patterns(source, batch, caller)
    n_layers, n_heads, n_pos = patterns.shape[0], patterns.shape[1], patterns.shape[-1]
    layer = _check_layer(layer, n_layers, caller)
    head = _pick_head(head, n_heads, caller)
    labels = axis_labels(str_tokens, n_pos, caller, f"the patterns (shape {tuple(patterns.shape)})")
    positions = token_axis(labels, "key")["tickvals"]
    fig = go.Figure()
    for L in range(n_layers):
        for h in range(n_heads):
            fig.add_trace(
                _attention_trace(
                    patterns[L, h],
                    positions,
                    coloraxis="coloraxis",
                    name=f"L{L}H{h}",
                    visible=L == layer,
                    opacity=1.0 if h == head else 0.0,
                    hoverinfo="all" if h == head else "skip",
                    hovertemplate=_ATTENTION_HOVER if h == head else None,
                )
            )
    # trace i is layer i // n_heads, head i % n_heads
    heads_of = [h for _ in range(n_layers) for h in range(n_heads)]
    layers_of = [L for L in range(n_layers) for _ in range(n_heads)]
    layer_menu = [
        dict(label=f"layer {L}", method="restyle", args=[{"visible": [x == L for x in layers_of]}])
        for L in range(n_layers)
    ]
    head_menu = [
        dict(
            label=f"head {h}",
            method="restyle",
            args=[
                {
                    "opacity": [1.0 if x == h else 0.0 for x in heads_of],
                    "hoverinfo": ["all" if x == h else "skip" for x in heads_of],
                    # a hovertemplate overrides hoverinfo="skip", so the hidden heads have none
                    "hovertemplate": [_ATTENTION_HOVER if x == h else None for x in heads_of],
                }
            ],
        )
        for h in range(n_heads)
    ]
    # Both menus sit just above the plot's left edge; the head menu 120 px to the right.
    menu = dict(type="dropdown", direction="down", x=0.0, xanchor="left", y=1.0, yanchor="bottom", showactive=True)
    size = _attention_size(labels)
    fig.update_layout(
        title=dict(text=title or "Attention: pick a layer and a head"),
        updatemenus=[
            dict(menu, buttons=layer_menu, active=layer, pad=dict(l=0, b=8), name="layer"),
            dict(menu, buttons=head_menu, active=head, pad=dict(l=120, b=8), name="head"),
        ],
        coloraxis=dict(cmin=0.0, cmax=1.0, colorscale=ATTENTION_COLORS, colorbar=dict(title=dict(text="attention"))),
        xaxis=token_axis(labels, "key (attended to)"),
        yaxis=dict(token_axis(labels, "query (attending)"), autorange="reversed"),
        margin=dict(t=110),
        width=size["width"],
        height=size["height"] + 60,
    )
    return fig
