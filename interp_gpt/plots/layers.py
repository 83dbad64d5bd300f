"""Pictures of numbers per layer: head scores (layer x head), activation-patching results
(layer x position, layer x head), and the residual stream read at every layer (the logit
lens, its norm, direct logit attribution, the logit difference it already holds).

The numbers come from `inspect.py` and `patching`; these functions only draw them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from ..cache import ActivationCache
from ..checks import check_answer_tokens
from ..inspect import accumulated_logit_diff, answer_lens, cache_logit_lens, direct_logit_attribution, resid_norms
from .common import (
    ATTENTION_COLORS,
    SCORE_COLORS,
    as_array,
    as_tensor,
    axis_labels,
    check_str_tokens,
    diverging,
    heatmap_panels,
    layer_axis,
    markup_safe,
    stack_panels,
    token_axis,
    token_names,
)

__all__ = [
    "head_scores_heatmap",
    "patching_heatmap",
    "head_patching_heatmap",
    "logit_lens_heatmap",
    "answer_lens_plot",
    "resid_norm_heatmap",
    "dla_bar",
    "accumulated_resid_plot",
]


# ----------------------------------------------------------------------------
# layer x head and layer x position grids
# ----------------------------------------------------------------------------
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
        tensors = [as_tensor(v, f"scores[{k!r}]", caller) for k, v in scores.items()]
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) != 1:
            raise ValueError(
                f"{caller}: every entry of scores must have the same [n_layers, n_heads] shape, got {sorted(shapes)}"
            )
        panels, titles = stack_panels(
            torch.stack(tensors), [str(k) for k in scores], "scores", caller, "[n_layers, n_heads]"
        )
    else:
        panels, titles = stack_panels(scores, None, "scores", caller, "[n_layers, n_heads]")
    n_layers, n_heads = panels.shape[1], panels.shape[2]
    colors: dict[str, Any] = dict(colorscale=SCORE_COLORS)
    if zrange is not None:
        colors.update(cmin=float(zrange[0]), cmax=float(zrange[1]))
    return heatmap_panels(
        panels,
        titles,
        layer_axis(range(n_heads), "head"),
        layer_axis(range(n_layers)),
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
    panels, titles = stack_panels(results, titles, "results", caller, "[n_layers, pos]")
    labels = axis_labels(str_tokens, panels.shape[2], caller, f"results (shape {tuple(panels.shape[-2:])})")
    return heatmap_panels(
        panels,
        titles,
        token_axis(labels, "position"),
        layer_axis(range(panels.shape[1])),
        value_label,
        diverging(panels),
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
    panels, titles = stack_panels(results, titles, "results", caller, "[n_layers, n_heads]")
    return heatmap_panels(
        panels,
        titles,
        layer_axis(range(panels.shape[2]), "head"),
        layer_axis(range(panels.shape[1])),
        value_label,
        diverging(panels),
        title,
        "layer %{y}, head %{x}<br>" + value_label + " %{z:.4f}",
        cell_text=panels.shape[1] * panels.shape[2] <= 400,
    )


# ----------------------------------------------------------------------------
# the residual stream, layer by layer
# ----------------------------------------------------------------------------
def logit_lens_heatmap(
    cache: ActivationCache, str_tokens: Sequence[str], batch: int = 0, incl_mid: bool = False, *, lens: Any = None
) -> go.Figure:
    """The logit lens: at every layer (rows) and position (columns), the most likely next
    token (written in the cell) and its probability (the colour).

    `lens`: a `TunedLens` (`interp_gpt.lenses`) to read each `blocks.L.hook_resid_pre` through instead
    (`lens(h, L)`); the last row, `final_post`, is the model's own output either way.

    Example:
        >>> _, cache = model.run_with_cache("The Eiffel Tower is in the city of")
        >>> fig = logit_lens_heatmap(cache, model.to_str_tokens("The Eiffel Tower is in the city of"))
        >>> from interp_gpt.lenses import TunedLens
        >>> fig = logit_lens_heatmap(cache, model.to_str_tokens("The Eiffel Tower is in the city of"),
        ...                          lens=TunedLens.from_model(model))   # a trained lens: fit_tuned_lens
    """
    caller = "logit_lens_heatmap"
    logits, layer_labels = cache_logit_lens(cache, batch, incl_mid)
    name = "Logit lens"
    if lens is not None:
        logits, name = _through_lens(cache, lens, batch, incl_mid, logits, caller), "Tuned lens"
    labels = axis_labels(str_tokens, logits.shape[1], caller, "the cache")
    top_probs, top_ids = logits.softmax(-1).max(-1)  # [layer, pos]
    names = token_names(cache.model, top_ids.flatten().tolist())
    n_pos = logits.shape[1]
    full = [[names[r * n_pos + p] for p in range(n_pos)] for r in range(logits.shape[0])]
    short = [[markup_safe(x if len(x) <= 6 else x[:5] + "…") for x in row] for row in full]
    fig = heatmap_panels(
        top_probs[None],
        [""],
        token_axis(labels, "input position (predicting the next token)"),
        layer_axis(layer_labels, "residual stream at"),
        "top probability",
        dict(colorscale=ATTENTION_COLORS, cmin=0.0, cmax=1.0),
        f"{name}: top next-token prediction by layer",
        "position %{x}, residual stream at %{y}<br>top token %{customdata}<br>probability %{z:.3f}",
        text=short,
        customdata=[[markup_safe(x) for x in row] for row in full],
    )
    return fig


@torch.no_grad()
def _through_lens(cache: ActivationCache, lens: Any, batch: int, incl_mid: bool, plain: Tensor, caller: str) -> Tensor:
    """`plain` (the logit lens, [n_layers + 1, pos, d_vocab]) with each resid_pre row read through `lens`."""
    if incl_mid:
        raise ValueError(f"{caller}: incl_mid=True with a lens: a tuned lens reads blocks.L.hook_resid_pre only")
    n_layers = cache.model.cfg.n_layers
    if not callable(lens) or getattr(lens, "__len__", None) is None or len(lens) != n_layers:
        raise TypeError(
            f"{caller}: lens={type(lens).__name__}: expected a TunedLens for this model's {n_layers} layers "
            "(interp_gpt.lenses.TunedLens)"
        )
    rows = [lens(cache[f"blocks.{layer}.hook_resid_pre"][batch], layer) for layer in range(n_layers)]
    return torch.cat([torch.stack(rows).to(plain.dtype), plain[-1:]])


def answer_lens_plot(
    cache: ActivationCache, answer: int | str, pos: int = -1, batch: int = 0, incl_mid: bool = False
) -> go.Figure:
    """The probability (left axis) and logit (right axis) of one answer token at `pos`,
    across layers (the logit lens).

    Example:
        >>> fig = answer_lens_plot(cache, " him")
    """
    logits, probs, labels = answer_lens(cache, answer, pos, batch, incl_mid)
    ids = check_answer_tokens(cache.model, answer, 1, "answer", "answer_lens_plot").tolist()
    name = markup_safe(token_names(cache.model, ids)[0])
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = [markup_safe(x) for x in labels]
    fig.add_trace(go.Scatter(x=x, y=as_array(probs), name=f"P({name})", mode="lines+markers"), secondary_y=False)
    fig.add_trace(
        go.Scatter(x=x, y=as_array(logits), name=f"logit({name})", mode="lines+markers", line=dict(dash="dot")),
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
    norms, layer_labels = resid_norms(cache, batch, incl_mid)
    labels = axis_labels(str_tokens, norms.shape[1], caller, "the cache")
    fig = heatmap_panels(
        norms[None],
        [""],
        token_axis(labels, "position"),
        layer_axis(layer_labels, "residual stream at"),
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
            return "logit(" + markup_safe(token_names(model, ids)[0]) + ")"
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
        >>> fig = dla_bar(cache, " him", " her")
    """
    attrs, labels = direct_logit_attribution(cache, answer, wrong, pos, batch)
    values = attrs.detach().double().cpu().tolist()
    target = _logit_diff_name(cache.model, answer, wrong)
    fig = go.Figure(
        go.Bar(
            x=[markup_safe(x) for x in labels],
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
        >>> _, cache = model.run_with_cache(["The man gave the book to the woman, and then she gave it to"])
        >>> fig = accumulated_resid_plot(cache, " him", " her")
    """
    caller = "accumulated_resid_plot"
    diffs, labels = accumulated_logit_diff(cache, answer, wrong, pos, incl_mid)
    n_batch = diffs.shape[1]
    if prompt_labels is None:
        prompt_labels = [f"prompt {b}" for b in range(n_batch)]
    prompt_labels = check_str_tokens(prompt_labels, caller, "prompt_labels")
    if len(prompt_labels) != n_batch:
        raise ValueError(f"{caller}: prompt_labels has {len(prompt_labels)} entries for {n_batch} prompts")
    x = [markup_safe(x) for x in labels]
    fig = go.Figure()
    for b in range(n_batch):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=as_array(diffs[:, b]),
                name=markup_safe(prompt_labels[b]),
                mode="lines+markers",
                opacity=0.5 if n_batch > 1 else 1.0,
            )
        )
    if n_batch > 1:
        fig.add_trace(
            go.Scatter(x=x, y=as_array(diffs.mean(1)), name="mean", mode="lines", line=dict(width=4, color="black"))
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
