"""Pictures of attention and of the residual stream, as plotly figures.

Every function returns a `plotly.graph_objects.Figure` and never shows it: call `fig.show()` in a
notebook, or `save_html(fig, "page.html")` for a self-contained page (plotly.js inside, works offline).
The numbers come from `inspect.py`. Token text is escaped before plotly sees it (plotly reads `<b>`,
`<br>` and `&...;` as markup), so a token such as `<script>` shows as text; positions are numbers on the
axes, labelled with the tokens, so a repeated token keeps its own row. The figures, by module:

    attention.py  attention_heatmap (one head), attention_grid (a layer's heads), attention_viewer (every
                  head of every layer, with a layer and a head menu)
    layers.py     head_scores_heatmap (layer x head), logit_lens_heatmap, answer_lens_plot,
                  resid_norm_heatmap, dla_bar, accumulated_resid_plot, patching_heatmap (layer x position)
                  and head_patching_heatmap (layer x head) of an activation-patching sweep
    circuits.py   circuit_graph (interp_gpt.circuits' nodes and edges), faithfulness_plot, circuit_page
    page.py       save_html: one self-contained, offline HTML file
    common.py     token_labels (" the" -> "␣the", "\\n" -> "↵"), colours, axes and heatmap panels

Example:
    >>> from interp_gpt import plots
    >>> logits, cache = model.run_with_cache("The cat sat on the mat")
    >>> str_tokens = model.to_str_tokens("The cat sat on the mat")
    >>> plots.attention_heatmap(cache, str_tokens, layer=0, head=3).show()
    >>> plots.save_html(plots.attention_viewer(cache, str_tokens), "attention.html")
"""

from __future__ import annotations

from .attention import attention_grid, attention_heatmap, attention_viewer
from .circuits import circuit_graph, circuit_page, faithfulness_plot
from .common import ATTENTION_COLORS as ATTENTION_COLORS
from .common import DIVERGING_COLORS as DIVERGING_COLORS
from .common import SCORE_COLORS as SCORE_COLORS
from .common import token_labels
from .layers import (
    accumulated_resid_plot,
    answer_lens_plot,
    dla_bar,
    head_patching_heatmap,
    head_scores_heatmap,
    logit_lens_heatmap,
    patching_heatmap,
    resid_norm_heatmap,
)
from .page import save_html

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
    "circuit_graph",
    "faithfulness_plot",
    "circuit_page",
]
