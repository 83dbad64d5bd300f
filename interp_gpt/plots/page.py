"""Saving a figure as one self-contained page that opens offline (the attention viewer's home)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from ..checks import check_type
from ..files import write_atomic

__all__ = ["save_html"]

# The saved page may load nothing from anywhere: scripts and styles are inline, images
# are the data: URLs plotly draws heatmaps with. A browser enforces it.
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; connect-src 'none'"
)


def save_html(fig: go.Figure, path: str | os.PathLike[str], config: Mapping[str, Any] | None = None) -> Path:
    """Write `fig` as one self-contained HTML page: plotly.js embedded, no CDN, no request
    to any server (a Content-Security-Policy forbids them), so it opens offline. Returns the path.
    The page is written whole or not at all: a failed write leaves the file that was there.

    `config`: plotly.js config options to add, e.g. `{"displayModeBar": False}`.

    Example:
        >>> save_html(attention_viewer(cache, model.to_str_tokens(tokens)), "attention.html")
        PosixPath('attention.html')
    """
    check_type(fig, go.Figure, "fig", "a plotly Figure", "save_html")
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
    page = page.replace(head, f'{head}<meta http-equiv="Content-Security-Policy" content="{CSP}">', 1)
    # Whole or not at all: a failed write leaves the old page as it was, and its error names the page.
    return write_atomic(path, page)
