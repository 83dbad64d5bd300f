"""What every figure shares: the colour scales, token labels, the axes they go on, and
side-by-side heatmap panels on one colour scale.

Token text is escaped before plotly sees it (`markup_safe`): plotly reads `<b>`, `<br>` and
`&...;` in labels as markup, so a token such as `<script>` must show as text and run nothing.
Positions are category coordinates ("3: ␣the") labelled with the tokens, so a repeated token
keeps its own row.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from ..checks import check_rank, check_str_list

__all__ = [
    "ATTENTION_COLORS",
    "SCORE_COLORS",
    "DIVERGING_COLORS",
    "check_str_tokens",
    "token_labels",
    "markup_safe",
    "axis_labels",
    "token_names",
    "category_axis",
    "token_axis",
    "layer_axis",
    "as_array",
    "as_tensor",
    "stack_panels",
    "heatmap_panels",
    "diverging",
]

ATTENTION_COLORS = "Blues"
SCORE_COLORS = "Viridis"
DIVERGING_COLORS = "RdBu"  # red for negative, blue for positive, white at 0

# Characters that would be invisible (or break a line) in a label, and what shows instead.
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
_EMPTY_TOKEN = "∅"


def check_str_tokens(str_tokens: Any, caller: str, arg: str = "str_tokens") -> list[str]:
    return check_str_list(str_tokens, arg, caller, example="model.to_str_tokens(text)")


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
    tokens = check_str_tokens(str_tokens, "token_labels")
    return ["".join(_visible_char(c) for c in tok) if tok else _EMPTY_TOKEN for tok in tokens]


def markup_safe(text: str) -> str:
    """`text` escaped for plotly's label markup: shows as written, never as tags or TeX."""
    return html.escape(text, quote=False).replace("$", "&#36;")


def axis_labels(str_tokens: Any, n_pos: int, caller: str, what: str) -> list[str]:
    """Escaped visible labels for `n_pos` positions, or a clear error on a length mismatch."""
    tokens = check_str_tokens(str_tokens, caller)
    if len(tokens) != n_pos:
        raise ValueError(f"{caller}: str_tokens has {len(tokens)} tokens, but {what} has {n_pos} positions")
    return [markup_safe(label) for label in token_labels(tokens)]


def token_names(model: Any, ids: Sequence[int]) -> list[str]:
    """Visible labels of token ids: decoded if the model has a tokenizer, else "#id"."""
    if getattr(model, "tokenizer", None) is not None:
        return token_labels(model.tokenizer.decode_each(list(ids)))
    return [f"#{i}" for i in ids]


def category_axis(categories: list[str], ticktext: list[str], title: str) -> dict[str, Any]:
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


def token_axis(labels: list[str], title: str) -> dict[str, Any]:
    """A position axis: the ticks are the tokens, the coordinates "3: ␣the" (unique, so a
    repeated token keeps its own row; hover shows them)."""
    return category_axis([f"{i}: {label}" for i, label in enumerate(labels)], labels, title)


def layer_axis(labels: Sequence[Any], title: str = "layer") -> dict[str, Any]:
    """An axis of layers (or heads), named by `labels` (unique)."""
    names = [markup_safe(str(x)) for x in labels]
    return category_axis(names, names, title)


def as_array(t: Tensor) -> Any:
    """A numpy float32 array: plotly stores it as binary, not as JSON text."""
    return t.detach().to("cpu", torch.float32).numpy()


def as_tensor(values: Any, arg: str, caller: str) -> Tensor:
    """`values` as a tensor: a tensor (detached), or nested lists of numbers."""
    if isinstance(values, Tensor):
        return values.detach()
    try:
        return torch.as_tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(
            f"{caller}: {arg} must be a tensor (or nested lists of numbers), got {type(values).__name__}"
        ) from None


def stack_panels(
    values: Any, titles: Sequence[str] | None, arg: str, caller: str, shape_doc: str
) -> tuple[Tensor, list[str]]:
    """[panel, rows, cols] from a 2-D tensor (one panel) or a 3-D one (one panel per entry)."""
    t = check_rank(as_tensor(values, arg, caller), (2, 3), arg, f"{shape_doc}, or a stack of them", caller)
    if t.ndim == 2:
        t = t[None]
    if titles is None:
        titles = [""] * t.shape[0] if t.shape[0] == 1 else [f"{arg} {i}" for i in range(t.shape[0])]
    titles = [str(x) for x in titles]
    if len(titles) != t.shape[0]:
        raise ValueError(f"{caller}: titles has {len(titles)} entries for {t.shape[0]} panels (shape {tuple(t.shape)})")
    return t, titles


def heatmap_panels(
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
                z=as_array(panels[i]),
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


def diverging(panels: Tensor) -> dict[str, Any]:
    """A red-white-blue colour scale centred on 0, as wide as the largest finite |value|."""
    finite = panels[torch.isfinite(panels)]
    bound = float(finite.abs().max()) if finite.numel() else 1.0
    bound = bound or 1.0
    return dict(colorscale=DIVERGING_COLORS, cmid=0.0, cmin=-bound, cmax=bound)
