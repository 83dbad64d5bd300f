"""Pictures of attention and of the residual stream, as plotly figures.

Every function returns a `plotly.graph_objects.Figure` and never shows it: call
`fig.show()` in a notebook, or `save_html(fig, "page.html")` for a self-contained page
(plotly.js inside, works offline). The numbers come from `inspect.py`.

    token_labels            string tokens made visible: " the" -> "␣the", "\\n" -> "↵"
    attention_heatmap       one head's pattern, the tokens on both axes
    attention_grid          every head of a layer
    attention_viewer        every head of every layer, with a layer and a head menu
    head_scores_heatmap     layer x head scores (previous-token, duplicate, induction ...)
    logit_lens_heatmap      the top token and its probability at every layer and position
    answer_lens_plot        one answer's probability and logit across layers
    resid_norm_heatmap      the residual stream's norm at every layer and position
    dla_bar                 direct logit attribution of every component
    accumulated_resid_plot  the logit difference the stream holds at each layer
    patching_heatmap        layer x position results of an activation-patching sweep
    head_patching_heatmap   layer x head results of an activation-patching sweep
    save_html               one self-contained, offline HTML file

Token text is escaped before plotly sees it (plotly reads `<b>`, `<br>` and `&...;` in
labels as markup), so a token such as `<script>` shows as text and runs nothing. Positions
are numbers on the axes, labelled with the tokens, so a repeated token keeps its own row.

Example:
    >>> from interp_gpt import plots
    >>> logits, cache = model.run_with_cache("The cat sat on the mat")
    >>> str_tokens = model.to_str_tokens("The cat sat on the mat")
    >>> plots.attention_heatmap(cache, str_tokens, layer=0, head=3).show()
    >>> plots.save_html(plots.attention_viewer(cache, str_tokens), "attention.html")
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from . import inspect as _inspect
from .cache import ActivationCache

__all__ = [
    "token_labels",
    "attention_heatmap",
    "attention_grid",
    "attention_viewer",
    "head_scores_heatmap",
    "logit_lens_heatmap",
    "answer_lens_plot",
    "resid_norm_heatmap",
    "dla_bar",
    "accumulated_resid_plot",
    "patching_heatmap",
    "head_patching_heatmap",
    "save_html",
]

ATTENTION_COLORS = "Blues"
SCORE_COLORS = "Viridis"
DIVERGING_COLORS = "RdBu"  # red for negative, blue for positive, white at 0

# Characters that would be invisible (or break a line) in a label, and what shows instead.
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
_EMPTY_TOKEN = "∅"


# ----------------------------------------------------------------------------
# token labels
# ----------------------------------------------------------------------------
def _check_str_tokens(str_tokens: Any, caller: str) -> list[str]:
    if isinstance(str_tokens, str) or not isinstance(str_tokens, Sequence):
        raise TypeError(
            f"{caller}: str_tokens must be a list of strings (e.g. model.to_str_tokens(text)), "
            f"got {type(str_tokens).__name__}"
        )
    for i, tok in enumerate(str_tokens):
        if not isinstance(tok, str):
            raise TypeError(f"{caller}: str_tokens[{i}] must be a str, got {type(tok).__name__} ({tok!r})")
    return list(str_tokens)


def _visible_char(c: str) -> str:
    if c in _VISIBLE:
        return _VISIBLE[c]
    if c.isprintable():
        return c
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def token_labels(str_tokens: Sequence[str]) -> list[str]:
    """Tokens as readable labels: spaces as "␣", newlines as "↵", tabs as "⇥", "\\r" as "␍",
    other invisible characters as escapes ("\\x00", "\\u200b"), the empty token as "∅".

    One label per token, in order; repeated tokens keep their own entry.

    Example:
        >>> token_labels(["<|endoftext|>", "Hello", " world", "\\n", " the"])
        ['<|endoftext|>', 'Hello', '␣world', '↵', '␣the']
    """
    tokens = _check_str_tokens(str_tokens, "token_labels")
    return ["".join(_visible_char(c) for c in tok) if tok else _EMPTY_TOKEN for tok in tokens]


def _markup_safe(text: str) -> str:
    """`text` escaped for plotly's label markup: shows as written, never as tags or TeX."""
    return html.escape(text, quote=False).replace("$", "&#36;")


def _axis_labels(str_tokens: Any, n_pos: int, caller: str, what: str) -> list[str]:
    """Escaped visible labels for `n_pos` positions, or a clear error on a length mismatch."""
    tokens = _check_str_tokens(str_tokens, caller)
    if len(tokens) != n_pos:
        raise ValueError(f"{caller}: str_tokens has {len(tokens)} tokens, but {what} has {n_pos} positions")
    return [_markup_safe(label) for label in token_labels(tokens)]


def _category_axis(categories: list[str], ticktext: list[str], title: str) -> dict[str, Any]:
    """An axis of named cells; `categories` (unique) are the coordinates, `ticktext` is shown."""
    return dict(
        title=dict(text=title),
        type="category",
        tickmode="array",
        tickvals=categories,
        ticktext=ticktext,
        showgrid=False,
        zeroline=False,
    )


def _token_axis(labels: list[str], title: str) -> dict[str, Any]:
    """A position axis: the ticks are the tokens, the coordinates "3: ␣the" (unique, so a
    repeated token keeps its own row; hover shows them)."""
    return _category_axis([f"{i}: {label}" for i, label in enumerate(labels)], labels, title)


def _values(t: Tensor) -> Any:
    """A numpy float32 array: plotly stores it as binary, not as JSON text."""
    return t.detach().to("cpu", torch.float32).numpy()


# ----------------------------------------------------------------------------
# attention: finding the patterns
# ----------------------------------------------------------------------------
def _check_layer(layer: Any, n_layers: int, caller: str) -> int:
    return _inspect._in_range(layer, n_layers, "layer", caller, f"layers of this {n_layers}-layer model")


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
        pattern = _inspect._get(source, f"blocks.{layer}.attn.hook_pattern", caller)
    elif isinstance(source, Tensor):
        if source.ndim not in (2, 3, 4):
            raise ValueError(
                f"{caller}: pattern must have rank 2, 3 or 4 ([q_pos, k_pos], [head, q_pos, k_pos] or "
                f"[batch, head, q_pos, k_pos] as cached), got rank {source.ndim} (shape {tuple(source.shape)})"
            )
        pattern = source.reshape((1,) * (4 - source.ndim) + tuple(source.shape))
        layer = None if layer is None else _inspect._int(layer, "layer", caller)
    else:
        raise TypeError(
            f"{caller}: expected an ActivationCache or an attention-pattern tensor, got {type(source).__name__}"
        )
    b = _inspect._in_range(batch, pattern.shape[0], "batch", caller, f"the {pattern.shape[0]} prompts")
    return _square(pattern[b], caller), layer


def _all_patterns(source: Any, batch: int, caller: str) -> Tensor:
    """Every layer's patterns [n_layers, n_heads, q_pos, k_pos], from a cache or a tensor."""
    if isinstance(source, ActivationCache):
        stacked = _inspect.stack_patterns(source)
        b = _inspect._in_range(batch, stacked.shape[1], "batch", caller, f"the {stacked.shape[1]} prompts")
        return _square(stacked[:, b], caller)
    if isinstance(source, Tensor):
        if source.ndim == 5:
            b = _inspect._in_range(batch, source.shape[1], "batch", caller, f"the {source.shape[1]} prompts")
            source = source[:, b]
        elif source.ndim == 3:
            source = source[None]
        if source.ndim != 4:
            raise ValueError(
                f"{caller}: patterns must have rank 3, 4 or 5 ([head, q_pos, k_pos] for one layer, "
                f"[layer, head, q_pos, k_pos], or [layer, batch, head, q_pos, k_pos]), "
                f"got rank {source.ndim} (shape {tuple(source.shape)})"
            )
        return _square(source, caller)
    raise TypeError(f"{caller}: expected an ActivationCache or a tensor of patterns, got {type(source).__name__}")


def _pick_head(head: Any, n_heads: int, caller: str) -> int:
    if head is None:
        if n_heads == 1:
            return 0
        raise ValueError(f"{caller}: the pattern has {n_heads} heads; pass head=0..{n_heads - 1}")
    return _inspect._in_range(head, n_heads, "head", caller, f"the {n_heads} heads")


_ATTENTION_HOVER = "query %{y}<br>key %{x}<br>attention %{z:.3f}<extra></extra>"


def _attention_trace(pattern: Tensor, positions: list[str], **kwargs: Any) -> go.Heatmap:
    kwargs.setdefault("hovertemplate", _ATTENTION_HOVER)
    return go.Heatmap(z=_values(pattern), x=positions, y=positions, **kwargs)


def _attention_size(labels: list[str]) -> dict[str, int]:
    """Width and height for a square pattern: ~24 px a position plus room for the labels."""
    label_px = 7 * max(len(html.unescape(x)) for x in labels)
    side = max(300, min(900, 24 * len(labels))) + label_px + 120
    return dict(width=max(640, side + 100), height=side)


# ----------------------------------------------------------------------------
# attention figures
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
    labels = _axis_labels(str_tokens, pattern.shape[-1], caller, f"the pattern (shape {tuple(pattern.shape[-2:])})")
    x_axis = _token_axis(labels, "key (attended to)")
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
        yaxis=dict(_token_axis(labels, "query (attending)"), autorange="reversed"),
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
        >>> fig = attention_grid(cache, model.to_str_tokens("The cat sat on the mat"), layer=0)
    """
    caller = "attention_grid"
    pattern, layer = _layer_pattern(source, layer, batch, caller)
    n_heads, n_pos = pattern.shape[0], pattern.shape[-1]
    labels = _axis_labels(str_tokens, n_pos, caller, f"the pattern (shape {tuple(pattern.shape[-2:])})")
    if cols is None:
        cols = math.ceil(math.sqrt(n_heads))
    cols = _inspect._int(cols, "cols", caller)
    if cols < 1:
        raise ValueError(f"{caller}: cols must be >= 1, got {cols}")
    cols = min(cols, n_heads)
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
    positions = _token_axis(labels, "key")["tickvals"]
    for h in range(n_heads):
        r, c = divmod(h, cols)
        fig.add_trace(
            _attention_trace(pattern[h], positions, coloraxis="coloraxis", name=f"head {h}"), row=r + 1, col=c + 1
        )
        fig.update_xaxes(_token_axis(labels, "key"), row=r + 1, col=c + 1)
        fig.update_yaxes(dict(_token_axis(labels, "query"), autorange="reversed"), row=r + 1, col=c + 1)
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
    labels = _axis_labels(str_tokens, n_pos, caller, f"the patterns (shape {tuple(patterns.shape)})")
    positions = _token_axis(labels, "key")["tickvals"]
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
        xaxis=_token_axis(labels, "key (attended to)"),
        yaxis=dict(_token_axis(labels, "query (attending)"), autorange="reversed"),
        margin=dict(t=110),
        width=size["width"],
        height=size["height"] + 60,
    )
    return fig


# ----------------------------------------------------------------------------
# layer x something heatmaps
# ----------------------------------------------------------------------------
def _as_tensor(values: Any, arg: str, caller: str) -> Tensor:
    if isinstance(values, Tensor):
        return values.detach()
    try:
        return torch.as_tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(
            f"{caller}: {arg} must be a tensor (or nested lists of numbers), got {type(values).__name__}"
        ) from None


def _panels(
    values: Any, titles: Sequence[str] | None, arg: str, caller: str, shape_doc: str
) -> tuple[Tensor, list[str]]:
    """[panel, rows, cols] from a 2-D tensor (one panel) or a 3-D one (one panel per entry)."""
    t = _as_tensor(values, arg, caller)
    if t.ndim == 2:
        t = t[None]
    if t.ndim != 3:
        raise ValueError(
            f"{caller}: {arg} must be {shape_doc}, or a stack of them with one more axis first; got shape {tuple(t.shape)}"
        )
    if titles is None:
        titles = [""] * t.shape[0] if t.shape[0] == 1 else [f"{arg} {i}" for i in range(t.shape[0])]
    titles = [str(x) for x in titles]
    if len(titles) != t.shape[0]:
        raise ValueError(f"{caller}: titles has {len(titles)} entries for {t.shape[0]} panels (shape {tuple(t.shape)})")
    return t, titles


def _heatmap_panels(
    panels: Tensor,
    titles: list[str],
    x_axis: dict[str, Any],
    y_axis: dict[str, Any],
    value_label: str,
    colors: dict[str, Any],
    title: str,
    hover: str,
    text: list[list[str]] | None = None,
    cell_text: bool = False,
    customdata: list[list[str]] | None = None,
) -> go.Figure:
    """Side-by-side heatmaps on one colour axis; rows labelled by y_axis, columns by x_axis.
    `text` is written in the cells (else the values, with `cell_text`); `customdata` is for hover."""
    k = panels.shape[0]
    fig = make_subplots(rows=1, cols=k, subplot_titles=titles if k > 1 else None, horizontal_spacing=0.25 / k)
    n_rows, n_cols = panels.shape[1], panels.shape[2]
    for i in range(k):
        fig.add_trace(
            go.Heatmap(
                z=_values(panels[i]),
                x=x_axis["tickvals"],
                y=y_axis["tickvals"],
                coloraxis="coloraxis",
                text=text,
                texttemplate="%{text}" if text is not None else ("%{z:.2f}" if cell_text else None),
                textfont=dict(size=10),
                customdata=customdata,
                hovertemplate=hover + "<extra></extra>",
                name=titles[i] or value_label,
            ),
            row=1,
            col=i + 1,
        )
        fig.update_xaxes(x_axis, row=1, col=i + 1)
        fig.update_yaxes(dict(y_axis, autorange="reversed"), row=1, col=i + 1)
    cell = 28 if max(n_rows, n_cols) <= 30 else 18
    fig.update_layout(
        title=dict(text=title),
        coloraxis=dict(colors, colorbar=dict(title=dict(text=value_label))),
        width=min(1600, max(420, k * (cell * n_cols + 160) + 120)),
        height=min(1000, max(360, cell * n_rows + 220)),
    )
    return fig


def _layer_axis(labels: Sequence[Any], title: str = "layer") -> dict[str, Any]:
    """An axis of layers (or heads), named by `labels` (unique)."""
    names = [_markup_safe(str(x)) for x in labels]
    return _category_axis(names, names, title)


def _diverging(panels: Tensor) -> dict[str, Any]:
    finite = panels[torch.isfinite(panels)]
    bound = float(finite.abs().max()) if finite.numel() else 1.0
    bound = bound or 1.0
    return dict(colorscale=DIVERGING_COLORS, cmid=0.0, cmin=-bound, cmax=bound)


def head_scores_heatmap(
    scores: Tensor | Mapping[str, Tensor],
    title: str | None = None,
    value_label: str = "score",
    zrange: tuple[float, float] | None = (0.0, 1.0),
) -> go.Figure:
    """Layer x head heatmaps of head scores: one panel, or one per entry of a dict
    (e.g. `inspect.head_scores(model)`), on one colour scale, the values written in the cells.

    `zrange`: the colour scale's range (None: from the data).

    Example:
        >>> from interp_gpt.inspect import head_scores
        >>> fig = head_scores_heatmap(head_scores(model))
    """
    caller = "head_scores_heatmap"
    if isinstance(scores, Mapping):
        if not scores:
            raise ValueError(f"{caller}: scores is an empty dict")
        tensors = [_as_tensor(v, f"scores[{k!r}]", caller) for k, v in scores.items()]
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) != 1:
            raise ValueError(
                f"{caller}: every entry of scores must have the same [n_layers, n_heads] shape, got {sorted(shapes)}"
            )
        panels, titles = _panels(
            torch.stack(tensors), [str(k) for k in scores], "scores", caller, "[n_layers, n_heads]"
        )
    else:
        panels, titles = _panels(scores, None, "scores", caller, "[n_layers, n_heads]")
    n_layers, n_heads = panels.shape[1], panels.shape[2]
    colors: dict[str, Any] = dict(colorscale=SCORE_COLORS)
    if zrange is not None:
        colors.update(cmin=float(zrange[0]), cmax=float(zrange[1]))
    return _heatmap_panels(
        panels,
        titles,
        _layer_axis(range(n_heads), "head"),
        _layer_axis(range(n_layers)),
        value_label,
        colors,
        title or (titles[0] + " scores" if len(titles) == 1 and titles[0] else "Head scores"),
        "layer %{y}, head %{x}<br>" + value_label + " %{z:.3f}",
        cell_text=n_layers * n_heads <= 400,
    )


def patching_heatmap(
    results: Tensor,
    str_tokens: Sequence[str],
    title: str = "Activation patching",
    value_label: str = "patched metric",
    titles: Sequence[str] | None = None,
) -> go.Figure:
    """Layer x position results of a patching sweep ([n_layers, pos]), the tokens along
    the x axis, on a red-white-blue scale centred on 0. A [k, n_layers, pos] stack (e.g.
    resid_pre / attn_out / mlp_out) gives k panels; `titles` names them.

    Example:
        >>> from interp_gpt import patching
        >>> results = patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric)
        >>> fig = patching_heatmap(results, model.to_str_tokens(corrupted_tokens[0]))
    """
    caller = "patching_heatmap"
    panels, titles = _panels(results, titles, "results", caller, "[n_layers, pos]")
    labels = _axis_labels(str_tokens, panels.shape[2], caller, f"results (shape {tuple(panels.shape[-2:])})")
    return _heatmap_panels(
        panels,
        titles,
        _token_axis(labels, "position"),
        _layer_axis(range(panels.shape[1])),
        value_label,
        _diverging(panels),
        title,
        "layer %{y}, position %{x}<br>" + value_label + " %{z:.4f}",
    )


def head_patching_heatmap(
    results: Tensor,
    title: str = "Activation patching per head",
    value_label: str = "patched metric",
    titles: Sequence[str] | None = None,
) -> go.Figure:
    """Layer x head results of a patching sweep ([n_layers, n_heads]), red-white-blue
    around 0. A [k, n_layers, n_heads] stack (e.g. z / q / k / v / pattern) gives k panels.

    Example:
        >>> from interp_gpt import patching
        >>> results = patching.get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, clean_cache, metric)
        >>> fig = head_patching_heatmap(results)
    """
    caller = "head_patching_heatmap"
    panels, titles = _panels(results, titles, "results", caller, "[n_layers, n_heads]")
    return _heatmap_panels(
        panels,
        titles,
        _layer_axis(range(panels.shape[2]), "head"),
        _layer_axis(range(panels.shape[1])),
        value_label,
        _diverging(panels),
        title,
        "layer %{y}, head %{x}<br>" + value_label + " %{z:.4f}",
        cell_text=panels.shape[1] * panels.shape[2] <= 400,
    )


# ----------------------------------------------------------------------------
# the residual stream
# ----------------------------------------------------------------------------
def _token_names(model: Any, ids: Sequence[int]) -> list[str]:
    """Visible labels of token ids: decoded if the model has a tokenizer, else "#id"."""
    if getattr(model, "tokenizer", None) is not None:
        return token_labels(model.tokenizer.decode_each(list(ids)))
    return [f"#{i}" for i in ids]


def logit_lens_heatmap(
    cache: ActivationCache, str_tokens: Sequence[str], batch: int = 0, incl_mid: bool = False
) -> go.Figure:
    """The logit lens: at every layer (rows) and position (columns), the most likely next
    token (written in the cell) and its probability (the colour).

    Example:
        >>> _, cache = model.run_with_cache("The Eiffel Tower is in the city of")
        >>> fig = logit_lens_heatmap(cache, model.to_str_tokens("The Eiffel Tower is in the city of"))
    """
    caller = "logit_lens_heatmap"
    logits, layer_labels = _inspect.logit_lens(cache, batch, incl_mid)
    labels = _axis_labels(str_tokens, logits.shape[1], caller, "the cache")
    top_probs, top_ids = logits.softmax(-1).max(-1)  # [layer, pos]
    names = _token_names(cache.model, top_ids.flatten().tolist())
    n_pos = logits.shape[1]
    full = [[names[r * n_pos + p] for p in range(n_pos)] for r in range(logits.shape[0])]
    short = [[_markup_safe(x if len(x) <= 6 else x[:5] + "…") for x in row] for row in full]
    fig = _heatmap_panels(
        top_probs[None],
        [""],
        _token_axis(labels, "input position (predicting the next token)"),
        _layer_axis(layer_labels, "residual stream at"),
        "top probability",
        dict(colorscale=ATTENTION_COLORS, cmin=0.0, cmax=1.0),
        "Logit lens: top next-token prediction by layer",
        "position %{x}, residual stream at %{y}<br>top token %{customdata}<br>probability %{z:.3f}",
        text=short,
        customdata=[[_markup_safe(x) for x in row] for row in full],
    )
    return fig


def answer_lens_plot(
    cache: ActivationCache, answer: int | str, pos: int = -1, batch: int = 0, incl_mid: bool = False
) -> go.Figure:
    """The probability (left axis) and logit (right axis) of one answer token at `pos`,
    across layers (the logit lens).

    Example:
        >>> fig = answer_lens_plot(cache, " Paris")
    """
    logits, probs, labels = _inspect.answer_lens(cache, answer, pos, batch, incl_mid)
    ids = _inspect._token_ids(cache.model, answer, 1, "answer", "answer_lens_plot").tolist()
    name = _markup_safe(_token_names(cache.model, ids)[0])
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = [_markup_safe(x) for x in labels]
    fig.add_trace(go.Scatter(x=x, y=_values(probs), name=f"P({name})", mode="lines+markers"), secondary_y=False)
    fig.add_trace(
        go.Scatter(x=x, y=_values(logits), name=f"logit({name})", mode="lines+markers", line=dict(dash="dot")),
        secondary_y=True,
    )
    fig.update_layout(title=dict(text=f"Logit lens: the answer {name} at position {pos}"), width=760, height=440)
    fig.update_xaxes(title_text="residual stream at")
    fig.update_yaxes(title_text="probability", range=[0, 1.02], secondary_y=False)
    fig.update_yaxes(title_text="logit", secondary_y=True)
    return fig


def resid_norm_heatmap(
    cache: ActivationCache, str_tokens: Sequence[str], batch: int = 0, incl_mid: bool = False
) -> go.Figure:
    """The residual stream's L2 norm at every layer (rows) and position (columns).

    Example:
        >>> fig = resid_norm_heatmap(cache, model.to_str_tokens(prompt))
    """
    caller = "resid_norm_heatmap"
    norms, layer_labels = _inspect.resid_norms(cache, batch, incl_mid)
    labels = _axis_labels(str_tokens, norms.shape[1], caller, "the cache")
    fig = _heatmap_panels(
        norms[None],
        [""],
        _token_axis(labels, "position"),
        _layer_axis(layer_labels, "residual stream at"),
        "norm",
        dict(colorscale=SCORE_COLORS),
        "Residual stream norm",
        "position %{x}, residual stream at %{y}<br>norm %{z:.3f}",
    )
    return fig


def _logit_diff_name(model: Any, answer: Any, wrong: Any) -> str:
    def name(t: Any) -> str:
        if isinstance(t, (int, str)) and not isinstance(t, bool):
            ids = [model.to_single_token(t)] if isinstance(t, str) else [t]
            return "logit(" + _markup_safe(_token_names(model, ids)[0]) + ")"
        return "logit(answer)" if t is answer else "logit(wrong)"

    return name(answer) + ("" if wrong is None else " - " + name(wrong))


def dla_bar(
    cache: ActivationCache,
    answer: Any,
    wrong: Any = None,
    pos: int = -1,
    batch: int | None = 0,
) -> go.Figure:
    """Direct logit attribution as bars: every component's direct contribution to the
    answer's logit (minus `wrong`'s) at `pos` (see `inspect.direct_logit_attribution`; the
    bars add up to the model's logit difference). `batch=None` averages over the prompts.

    Example:
        >>> fig = dla_bar(cache, " Paris", " London")
    """
    attrs, labels = _inspect.direct_logit_attribution(cache, answer, wrong, pos, batch)
    values = attrs.detach().double().cpu().tolist()
    target = _logit_diff_name(cache.model, answer, wrong)
    fig = go.Figure(
        go.Bar(
            x=[_markup_safe(x) for x in labels],
            y=values,
            marker_color=["#2166ac" if v >= 0 else "#b2182b" for v in values],
            hovertemplate="%{x}: %{y:.4f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=dict(text=f"Direct logit attribution to {target} (total {sum(values):.3f})"),
        xaxis=dict(title=dict(text="component"), type="category", tickangle=-60 if len(labels) > 8 else 0),
        yaxis=dict(title=dict(text=f"contribution to {target}")),
        width=min(1600, max(600, 32 * len(labels) + 200)),
        height=480,
    )
    return fig


def accumulated_resid_plot(
    cache: ActivationCache,
    answer: Any,
    wrong: Any = None,
    pos: int = -1,
    incl_mid: bool = False,
    prompt_labels: Sequence[str] | None = None,
) -> go.Figure:
    """The logit difference (answer - wrong) the residual stream holds at each layer, one
    curve per prompt (and their mean), via the logit lens.

    Example:
        >>> _, cache = model.run_with_cache(["When John and Mary went to the shops, John gave the bag to"])
        >>> fig = accumulated_resid_plot(cache, " Mary", " John")
    """
    caller = "accumulated_resid_plot"
    diffs, labels = _inspect.accumulated_logit_diff(cache, answer, wrong, pos, incl_mid)
    n_batch = diffs.shape[1]
    if prompt_labels is None:
        prompt_labels = [f"prompt {b}" for b in range(n_batch)]
    prompt_labels = _check_str_tokens(prompt_labels, caller)
    if len(prompt_labels) != n_batch:
        raise ValueError(f"{caller}: prompt_labels has {len(prompt_labels)} entries for {n_batch} prompts")
    x = [_markup_safe(x) for x in labels]
    fig = go.Figure()
    for b in range(n_batch):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=_values(diffs[:, b]),
                name=_markup_safe(prompt_labels[b]),
                mode="lines+markers",
                opacity=0.5 if n_batch > 1 else 1.0,
            )
        )
    if n_batch > 1:
        fig.add_trace(
            go.Scatter(x=x, y=_values(diffs.mean(1)), name="mean", mode="lines", line=dict(width=4, color="black"))
        )
    target = _logit_diff_name(cache.model, answer, wrong)
    fig.update_layout(
        title=dict(text=f"Accumulated residual stream: {target} by layer"),
        xaxis=dict(title=dict(text="residual stream at"), type="category"),
        yaxis=dict(title=dict(text=target)),
        width=760,
        height=440,
    )
    return fig


# ----------------------------------------------------------------------------
# saving
# ----------------------------------------------------------------------------
# The saved page may load nothing from anywhere: scripts and styles are inline, images
# are the data: URLs plotly draws heatmaps with. A browser enforces it.
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; connect-src 'none'"
)


def save_html(fig: go.Figure, path: str | os.PathLike[str], config: Mapping[str, Any] | None = None) -> Path:
    """Write `fig` as one self-contained HTML page: plotly.js embedded, no CDN, no request
    to any server (a Content-Security-Policy forbids them), so it opens offline. Returns the path.

    `config`: plotly.js config options to add, e.g. `{"displayModeBar": False}`.

    Example:
        >>> save_html(attention_viewer(cache, str_tokens), "attention.html")
        PosixPath('attention.html')
    """
    if not isinstance(fig, go.Figure):
        raise TypeError(f"save_html: fig must be a plotly Figure, got {type(fig).__name__}")
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"save_html: config must be a dict of plotly.js options, got {type(config).__name__}")
    page = fig.to_html(
        full_html=True,
        include_plotlyjs=True,
        include_mathjax=False,
        config={"displaylogo": False, "showSendToCloud": False, "responsive": False, **(config or {})},
    )
    head = "<head>"
    if head not in page:
        raise RuntimeError("save_html: plotly's page has no <head> to put the security policy in")
    page = page.replace(head, f'{head}<meta http-equiv="Content-Security-Policy" content="{_CSP}">', 1)
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out
