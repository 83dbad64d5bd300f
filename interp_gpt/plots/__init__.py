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
    circuit_graph           a circuit's nodes and edges (interp_gpt.circuits), layers top to bottom
    faithfulness_plot       faithfulness against the number of edges kept
    circuit_page            both in one figure, for one offline page

Token text is escaped before plotly sees it (plotly reads `<b>`, `<br>` and `&...;` in
labels as markup), so a token such as `<script>` shows as text and runs nothing. Positions
are numbers on the axes, labelled with the tokens, so a repeated token keeps its own row.

The modules, by job: `attention.py` (the attention figures), `layers.py` (numbers per
layer: head scores, patching results, the residual stream), `page.py` (`save_html`), and
`common.py` (colours, token labels, axes and heatmap panels every figure uses).

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
