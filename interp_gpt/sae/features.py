"""Seeing one SAE feature: its top-activating contexts, its activation histogram, the tokens it promotes.

    >>> report = feature_report(model, sae, tokens, feature=42)        # tokens [n, pos]
    >>> print(format_feature(report))                                   # the terminal view
    >>> figs = feature_figures(report)                                  # plotly: "histogram", "logits"
    >>> feature_page(report, "feature42.html")                          # one offline page

The promoted / suppressed tokens are the largest / smallest entries of `W_dec[f] @ W_U`: the feature's
decoder direction read straight through the unembedding, as transformer-lens' and SAELens' dashboards
(sae-dashboard's "logits table") do. It leaves out the final LayerNorm (its scale depends on the whole
residual stream; its centring and weights are folded into W_U in a processed model such as
`from_pretrained`'s) and b_U (the same for every feature), so it is a direction's direct effect, up to
one positive factor per token position.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_index, check_int_in_range
from .core import SAE

__all__ = ["FeatureReport", "feature_report", "feature_logits", "feature_figures", "feature_page", "format_feature"]


@dataclass
class FeatureReport:
    """What `feature_report` found for one feature (see its docstring)."""

    feature: int
    hook_name: str
    contexts: list[dict[str, Any]]  # each: tokens (str), acts (float), pos (of the max), max_act, window
    activations: Tensor  # every non-zero activation of the feature on the tokens (for the histogram)
    n_tokens: int
    promoted: list[tuple[str, float]]
    suppressed: list[tuple[str, float]]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def frac_active(self) -> float:
        """The share of tokens on which the feature fires."""
        return self.activations.numel() / max(self.n_tokens, 1)


def feature_logits(model: Any, sae: SAE, feature: int) -> Tensor:
    """`W_dec[feature] @ W_U` `[d_vocab]`: the feature's direct effect on the logits (no ln_final, no b_U).

    Example:
        >>> feature_logits(model, sae, 42).topk(5)
    """
    f = check_index(feature, sae.cfg.d_sae, "feature", "features")
    if sae.cfg.d_in != model.cfg.d_model:
        raise ValueError(
            f"sae: d_in={sae.cfg.d_in} is not the model's d_model={model.cfg.d_model}; the logit effect "
            "W_dec @ W_U needs a residual-stream SAE"
        )
    with torch.no_grad():
        return sae.W_dec[f].to(model.W_U.dtype) @ model.W_U


@torch.no_grad()
def feature_report(
    model: Any,
    sae: SAE,
    tokens: Tensor,
    feature: int,
    n_contexts: int = 8,
    before: int = 10,
    after: int = 4,
    n_logits: int = 10,
    batch_size: int = 32,
    progress: bool = False,
) -> FeatureReport:
    """Run `tokens` `[n, pos]` through the model, encode the activations at the SAE's hook and collect,
    for `feature`: the `n_contexts` tokens where it fires most (each with `before` tokens before it and
    `after` after it, and the feature's activation on each), all its non-zero activations, and the
    `n_logits` tokens it promotes and suppresses most (`feature_logits`).

    Example:
        >>> report = feature_report(model, sae, token_windows(model, texts), feature=42)
        >>> report.contexts[0]["max_act"], report.promoted[:3]
    """
    f = check_index(feature, sae.cfg.d_sae, "feature", "features")
    n_contexts = check_int_in_range(n_contexts, "n_contexts", 1, None)
    hook = sae.cfg.hook_name
    if not isinstance(hook, str):
        raise ValueError("sae: its cfg.metadata.hook_name is not set; the report needs the hook it reads")
    model.hook_points([hook], arg="sae.cfg.metadata.hook_name")
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        raise ValueError(
            f"tokens: expected a tensor [batch, pos] of token ids, got {getattr(tokens, 'shape', tokens)!r}"
        )
    stop = int(m.group(1)) + 1 if (m := re.match(r"blocks\.(\d+)\.", hook)) else None
    acts = []
    for i in tqdm(range(0, tokens.shape[0], batch_size), desc=f"feature {f}", disable=not progress):
        t = tokens[i : i + batch_size].to(model.W_E.device)
        kwargs: dict[str, Any] = {"stop_at_layer": stop} if stop is not None else {"return_type": None}
        _, cache = model.run_with_cache(t, names_filter=[hook], **kwargs)
        x = cache[hook].to(sae.device, sae.dtype)
        acts.append(sae.encode(x)[..., f].float().cpu())
    a = torch.cat(acts)  # [n, pos]
    flat = a.flatten()
    fired = flat[flat > 0]
    top = flat.topk(min(n_contexts, int((flat > 0).sum()))) if fired.numel() else None
    contexts = []
    if top is not None:
        for value, idx in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            row, pos = divmod(idx, a.shape[1])
            lo, hi = max(0, pos - before), min(a.shape[1], pos + after + 1)
            contexts.append(
                {
                    "tokens": [str(s) for s in model.to_str_tokens(tokens[row, lo:hi], prepend_bos=False)],
                    "acts": a[row, lo:hi].tolist(),
                    "pos": pos - lo,
                    "max_act": value,
                    "window": (row, pos),
                }
            )
    logits = feature_logits(model, sae, f).float().cpu()
    n = min(n_logits, logits.numel())
    up, down = logits.topk(n), (-logits).topk(n)

    def named(ids: list[int], values: list[float]) -> list[tuple[str, float]]:
        return [
            (str(s), v) for s, v in zip(model.to_str_tokens(torch.tensor(ids), prepend_bos=False), values, strict=True)
        ]

    return FeatureReport(
        feature=f,
        hook_name=hook,
        contexts=contexts,
        activations=fired,
        n_tokens=flat.numel(),
        promoted=named(up.indices.tolist(), up.values.tolist()),
        suppressed=named(down.indices.tolist(), (-down.values).tolist()),
    )


# ----------------------------------------------------------------------------
# figures and the page
# ----------------------------------------------------------------------------
def feature_figures(report: FeatureReport, bins: int = 40) -> dict[str, Any]:
    """Plotly figures: "histogram" (the feature's non-zero activations) and "logits" (the promoted and
    suppressed tokens as bars).

    Example:
        >>> feature_figures(report)["histogram"].show()
    """
    import plotly.graph_objects as go

    f = report.feature
    hist = go.Figure(go.Histogram(x=report.activations.tolist(), nbinsx=bins, marker_color="#d9480f"))
    hist.update_layout(
        title=f"feature {f}: activations where it fires ({report.frac_active:.2%} of {report.n_tokens} tokens)",
        xaxis_title="activation",
        yaxis_title="tokens",
        height=320,
        margin={"l": 50, "r": 20, "t": 50, "b": 40},
    )
    rows = list(reversed(report.suppressed)) + list(reversed(report.promoted))
    labels = [f"{i}: {_visible(t)}" for i, (t, _) in enumerate(rows)]  # unique labels, token text as text
    logits = go.Figure(
        go.Bar(
            x=[v for _, v in rows],
            y=labels,
            orientation="h",
            marker_color=["#1c7ed6" if v < 0 else "#d9480f" for _, v in rows],
        )
    )
    logits.update_layout(
        title=f"feature {f}: tokens it promotes / suppresses (W_dec[{f}] @ W_U)",
        height=28 * len(rows) + 80,
        margin={"l": 160, "r": 20, "t": 50, "b": 40},
        yaxis={"tickmode": "array", "tickvals": labels, "ticktext": [_visible(t) for t, _ in rows]},
    )
    return {"histogram": hist, "logits": logits}


def _visible(token: str) -> str:
    """A token's text with its spaces and newlines visible (␣, ↵)."""
    return token.replace(" ", "␣").replace("\n", "↵")


def _context_html(ctx: dict[str, Any], vmax: float) -> str:
    spans = []
    for i, (tok, act) in enumerate(zip(ctx["tokens"], ctx["acts"], strict=True)):
        alpha = 0.0 if act <= 0 else min(1.0, act / vmax)
        border = "outline:2px solid #222;" if i == ctx["pos"] else ""
        spans.append(
            f'<span class="tok" style="background:rgba(217,72,15,{alpha:.3f});{border}" '
            f'title="{html.escape(repr(tok), quote=True)}: {act:.3f}">{html.escape(_visible(tok))}</span>'
        )
    return f'<div class="ctx"><span class="act">{ctx["max_act"]:.3f}</span> {"".join(spans)}</div>'


def feature_page(report: FeatureReport, path: str | os.PathLike[str]) -> Path:
    """One self-contained HTML page for the feature: its contexts (tokens shaded by activation, the
    top token outlined, the value on hover), the histogram and the logit bars. plotly.js is inlined and
    a Content-Security-Policy forbids every request, so it opens offline; token text is escaped.
    Written whole or not at all. Returns the path.

    Example:
        >>> feature_page(feature_report(model, sae, tokens, 42), "feature42.html")
    """
    import plotly.offline

    from ..files import write_atomic
    from ..plots.page import _CSP

    if not isinstance(report, FeatureReport):
        raise TypeError(f"report: expected a FeatureReport (from feature_report), got {type(report).__name__}")
    figs = feature_figures(report)
    vmax = max((c["max_act"] for c in report.contexts), default=1.0) or 1.0
    contexts = "\n".join(_context_html(c, vmax) for c in report.contexts) or "<p>The feature never fires here.</p>"
    plots = "\n".join(
        f'<div id="{name}">'
        + fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False, "showSendToCloud": False})
        + "</div>"
        for name, fig in figs.items()
    )
    title = f"SAE feature {report.feature} at {html.escape(report.hook_name)}"
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="{_CSP}">
<title>{title}</title>
<style>body{{font-family:sans-serif;margin:20px;max-width:1000px}} .ctx{{font-family:monospace;margin:4px 0;
white-space:pre}} .tok{{padding:1px 0}} .act{{display:inline-block;width:60px;color:#555}}</style>
<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script></head>
<body><h2>{title}</h2>
<p>fires on {report.frac_active:.2%} of {report.n_tokens} tokens; top activation
{vmax:.3f}</p>
<h3>Top-activating contexts</h3>
<div id="contexts">
{contexts}
</div>
{plots}
</body></html>
"""
    return write_atomic(path, page)


# ----------------------------------------------------------------------------
# the terminal view and `interp-gpt features`
# ----------------------------------------------------------------------------
def format_feature(report: FeatureReport, width: int = 40, bins: int = 12) -> str:
    """The report as text: the contexts with the top token in [[ ]] (and each firing token's value),
    a text histogram, and the promoted / suppressed tokens.

    Example:
        >>> print(format_feature(report))
    """
    out = [
        f"feature {report.feature} at {report.hook_name}: fires on {report.frac_active:.2%} "
        f"of {report.n_tokens} tokens",
        "",
        "top-activating contexts ([[token]] is the top one; token{activation} where it fires):",
    ]
    for c in report.contexts:
        parts = []
        for i, (tok, act) in enumerate(zip(c["tokens"], c["acts"], strict=True)):
            t = repr(tok)[1:-1]
            t = f"[[{t}]]" if i == c["pos"] else t
            parts.append(f"{t}{{{act:.2f}}}" if act > 0 else t)
        out.append(f"  {c['max_act']:7.3f}  " + "".join(parts))
    acts = report.activations
    if acts.numel():
        out += ["", "activation histogram (where it fires):"]
        counts = torch.histc(acts, bins=bins, min=0.0, max=float(acts.max()))
        edges = torch.linspace(0.0, float(acts.max()), bins + 1)
        top = float(counts.max()) or 1.0
        for lo, hi, n in zip(edges[:-1].tolist(), edges[1:].tolist(), counts.tolist(), strict=True):
            out.append(f"  {lo:6.2f}-{hi:6.2f} {'#' * round(width * n / top):<{width}} {int(n)}")
    for name, rows in (("promotes", report.promoted), ("suppresses", report.suppressed)):
        out += ["", f"{name} (W_dec @ W_U):"]
        out.append("  " + "  ".join(f"{tok!r} {v:+.2f}" for tok, v in rows))
    return "\n".join(out)


SHIPPED_NAMES = ("tiny-gpt2-sae", "tiny-gpt2-res")


def resolve_sae(name: str) -> SAE:
    """An SAE argument: the shipped SAE's name (`tiny-gpt2-sae` or `tiny-gpt2-res`), or a folder."""
    from .training import SHIPPED_SAE_DIR

    return SAE.from_pretrained(SHIPPED_SAE_DIR if name in SHIPPED_NAMES else name)


def add_arguments(p: Any) -> None:
    """`interp-gpt features` options."""
    p.add_argument("model", metavar="MODEL", help="the model (tiny-gpt2 for the shipped SAE)")
    p.add_argument("sae", metavar="SAE", help="an SAE folder (cfg.json + sae_weights.safetensors) or tiny-gpt2-sae")
    p.add_argument("--feature", type=int, required=True, metavar="N", help="the feature to show")
    p.add_argument(
        "--data", default="data/corpus", metavar="PATH",
        help="a .txt file, or a folder of them (its validation tail, as the SAE trainer splits it)",
    )  # fmt: skip
    p.add_argument("--max-windows", type=int, default=256, metavar="N", help="128-token windows to read (default 256)")
    p.add_argument("--contexts", type=int, default=8, metavar="N", help="top contexts to show (default 8)")
    p.add_argument("--html", metavar="PAGE.html", help="also write the offline feature page")


def run(args: Any) -> int:
    """`interp-gpt features MODEL SAE --feature N`: print the feature's report (and write --html)."""
    from ..loading import from_pretrained
    from .training import split_corpus, token_windows

    model = from_pretrained(args.model)
    sae = resolve_sae(args.sae)
    check_int_in_range(args.max_windows, "--max-windows", 1, None)
    data = Path(args.data)
    if data.is_dir():
        texts = split_corpus(data)[1]
    elif data.is_file():
        texts = [data.read_text(encoding="utf-8")]
    else:
        raise FileNotFoundError(f"--data {str(data)!r}: no such file or folder")
    ctx = min(128, int(model.cfg.n_ctx))
    tokens = token_windows(model, texts, ctx, args.max_windows)
    report = feature_report(model, sae, tokens, args.feature, n_contexts=args.contexts)
    print(format_feature(report))
    if args.html:
        print(f"\nwrote {feature_page(report, args.html)}")
    return 0
