"""Seeing one SAE feature: its top-activating contexts, its activation histogram, the tokens it promotes.

    >>> report = feature_report(model, sae, tokens, feature=42)        # tokens [n, pos]
    >>> print(format_feature(report))                                   # the terminal view
    >>> figs = feature_figures(report)                                  # plotly: "histogram", "logits"
    >>> feature_page(report, "feature42.html")                          # one offline page

The promoted / suppressed tokens are the largest / smallest entries of the feature's decoder direction
as the model writes it into the residual stream, read straight through the unembedding: `W_dec[f] @ W_U`
for an SAE on the residual stream (transformer-lens' and SAELens' dashboards, sae-dashboard's "logits
table"), `W_dec[f] @ W_O @ W_U` for one on `attn.hook_z` (the heads' output weights, flattened
[n_heads * d_head, d_model] as `reshape_activations="hook_z"` flattens z), `W_dec[f] @ W_out @ W_U` for one
on `mlp.hook_post`. Hooks whose activations reach the residual stream only through attention or a
nonlinearity (hook_q / hook_k / hook_v, mlp.hook_pre, ...) have no such direct effect: `feature_logits`
refuses them by name and `feature_report` leaves those lists empty, saying why. It leaves out the final
LayerNorm (its scale depends on the whole residual stream; its centring and weights are folded into W_U
in a processed model such as `from_pretrained`'s) and b_U (the same for every feature), so it is a
direction's direct effect per unit of the feature's activation, up to one positive factor per token
position (and the per-position scale of a normalising SAE).
"""

from __future__ import annotations

import html
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ...checks import check_index, check_int_in_range
from ...cli.common import add_data_argument
from .core import SAE
from .splice import check_sae_fits

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


# Hooks whose activation is the residual stream, a term added to it, or a copy of it (LayerNorm'd or one
# per head): a decoder row there is already a residual-stream direction.
_RESIDUAL = re.compile(
    r"hook_embed|hook_pos_embed|ln_final\.hook_normalized|unembed\.hook_in|blocks\.\d+\."
    r"(hook_resid_pre|hook_resid_mid|hook_resid_post|hook_attn_out|hook_mlp_out|hook_mlp_in|hook_attn_in"
    r"|hook_[qkv]_input|attn\.hook_result|ln[12]\.hook_normalized)"
)
# Hooks with a head axis: without reshape_activations="hook_z" the SAE reads each head on its own.
_PER_HEAD = re.compile(r"blocks\.\d+\.(attn\.hook_[qkvz]|attn\.hook_result|hook_[qkv]_input|hook_attn_in)")


def _head_index(model: Any, sae: SAE, hook: str, caller: str) -> int | None:
    """The head a per-head SAE (one that reads [..., d_head] or [..., d_model] of one head) was trained
    on, from `cfg.metadata.hook_head_index`; None for an SAE that reads a whole activation per token."""
    if not _PER_HEAD.fullmatch(hook) or sae.cfg.reshape_activations == "hook_z":
        return None
    head, n_heads = sae.cfg.metadata.get("hook_head_index"), int(model.cfg.n_heads)
    if head is None:
        raise ValueError(
            f"{caller}: sae reads {hook!r} one head at a time (d_in={sae.cfg.d_in}, reshape_activations='none'); "
            f"set sae.cfg.metadata.hook_head_index to the head it was trained on (0..{n_heads - 1}), or use an "
            "SAE with reshape_activations='hook_z' (all heads at once)"
        )
    return check_index(head, n_heads, "sae.cfg.metadata.hook_head_index", "heads")


def _no_direct_effect(hook: str) -> str | None:
    """Why an SAE at `hook` has no direct logit effect, or None where it has one."""
    if _RESIDUAL.fullmatch(hook) or re.fullmatch(r"blocks\.\d+\.(attn\.hook_z|mlp\.hook_post)", hook):
        return None
    if re.fullmatch(r"blocks\.\d+\.attn\.hook_[qkv]", hook):
        why = "queries, keys and values reach the residual stream only through the attention pattern"
    elif hook.endswith("mlp.hook_pre"):
        why = "the MLP's pre-activations reach the residual stream only through its nonlinearity"
    else:
        why = "that activation is not written into the residual stream by a linear map"
    return (
        f"sae reads {hook!r}: {why}, so its features have no direct logit effect. Direct logit effects are "
        "defined for SAEs on the residual stream (hook_resid_*, hook_attn_out, hook_mlp_out, ...), on "
        "attn.hook_z (through W_O) and on mlp.hook_post (through W_out)"
    )


def _direction(model: Any, sae: SAE, f: int, hook: str, caller: str) -> tuple[Tensor, str]:
    """Feature `f`'s decoder direction in the residual stream `[d_model]`, per unit of its activation,
    and the formula's name. Assumes `check_sae_fits` passed and `_no_direct_effect(hook)` is None."""
    row = sae.W_dec[f]  # [d_in]
    if sae.cfg.architecture == "topk" and sae.cfg.rescale_acts_by_decoder_norm:
        row = row / row.norm()  # decode divides the activation by |W_dec[f]| first
    layer = int(hook.split(".")[1]) if hook.startswith("blocks.") else -1
    if hook.endswith("attn.hook_z"):
        W_O = model.blocks[layer].attn.W_O  # [n_heads, d_head, d_model]
        head = _head_index(model, sae, hook, caller)
        if head is None:  # reshape_activations="hook_z": d_in = n_heads * d_head, head-major like z.flatten(-2)
            return row.to(W_O.dtype) @ W_O.flatten(0, 1), "W_dec @ W_O @ W_U"
        return row.to(W_O.dtype) @ W_O[head], f"W_dec @ W_O[{head}] @ W_U"
    if hook.endswith("mlp.hook_post"):
        W_out = model.blocks[layer].mlp.W_out  # [d_mlp, d_model]
        return row.to(W_out.dtype) @ W_out, "W_dec @ W_out @ W_U"
    return row, "W_dec @ W_U"


def _str_tokens(model: Any, ids: list[int]) -> list[str]:
    """The tokens' text; "#id" for a model without a tokenizer (a toy model)."""
    if getattr(model, "tokenizer", None) is None:
        return [f"#{i}" for i in ids]
    return [str(s) for s in model.to_str_tokens(torch.tensor(ids, dtype=torch.long), prepend_bos=False)]


def feature_logits(model: Any, sae: SAE, feature: int) -> Tensor:
    """The feature's direct effect on the logits `[d_vocab]` (no ln_final, no b_U): `W_dec[feature] @ W_U`
    for a residual-stream SAE, through `W_O` for one on `attn.hook_z`, through `W_out` for one on
    `mlp.hook_post` (see the module's docs); other hooks are refused by name.

    Example:
        >>> feature_logits(model, sae, 42).topk(5)
    """
    hook = check_sae_fits(model, sae)
    f = check_index(feature, sae.cfg.d_sae, "feature", "features")
    reason = _no_direct_effect(hook)
    if reason is not None:
        raise ValueError(f"feature_logits: {reason}")
    with torch.no_grad():
        direction, _ = _direction(model, sae, f, hook, "feature_logits")
        return direction.to(model.W_U.dtype) @ model.W_U


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
    hook = check_sae_fits(model, sae)  # the hook exists, d_in fits it, the model is the SAE's (or a warning)
    f = check_index(feature, sae.cfg.d_sae, "feature", "features")
    n_contexts = check_int_in_range(n_contexts, "n_contexts", 1, None)
    head = _head_index(model, sae, hook, "feature_report")
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
        x = cache[hook] if head is None else cache[hook][:, :, head]
        x = x.to(sae.device, sae.dtype)
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
                    "tokens": _str_tokens(model, tokens[row, lo:hi].tolist()),
                    "acts": a[row, lo:hi].tolist(),
                    "pos": pos - lo,
                    "max_act": value,
                    "window": (row, pos),
                }
            )
    reason = _no_direct_effect(hook)
    if reason is None:
        direction, via = _direction(model, sae, f, hook, "feature_report")
        logits = (direction.to(model.W_U.dtype) @ model.W_U).float().cpu()
    else:  # no direct effect to show: empty lists, and why
        via, logits = reason, torch.zeros(0)
    n = min(n_logits, logits.numel())
    up, down = logits.topk(n), (-logits).topk(n)

    def named(ids: list[int], values: list[float]) -> list[tuple[str, float]]:
        if not ids:
            return []
        return [(s, v) for s, v in zip(_str_tokens(model, ids), values, strict=True)]

    return FeatureReport(
        feature=f,
        hook_name=hook,
        contexts=contexts,
        activations=fired,
        n_tokens=flat.numel(),
        promoted=named(up.indices.tolist(), up.values.tolist()),
        suppressed=named(down.indices.tolist(), (-down.values).tolist()),
        extra={"logits_via": via} if reason is None else {"no_logits": reason},
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
    from ...plots.common import markup_safe, token_labels

    rows = list(reversed(report.suppressed)) + list(reversed(report.promoted))
    # Token text through the same markup escaping as every other figure: "<b>" shows as "<b>".
    shown = [markup_safe(t) for t in token_labels([t for t, _ in rows])]
    labels = [f"{i}: {t}" for i, t in enumerate(shown)]  # unique coordinates; the ticks show the tokens
    logits = go.Figure(
        go.Bar(
            x=[v for _, v in rows],
            y=labels,
            orientation="h",
            marker_color=["#1c7ed6" if v < 0 else "#d9480f" for _, v in rows],
        )
    )
    via = report.extra.get("logits_via", "W_dec @ W_U")
    what = (
        f"tokens it promotes / suppresses ({via.replace('W_dec', f'W_dec[{f}]', 1)})"
        if rows or "no_logits" not in report.extra
        else "no direct logit effect at this hook"
    )
    logits.update_layout(
        title=f"feature {f}: {markup_safe(what)}",
        height=28 * len(rows) + 80,
        margin={"l": 160, "r": 20, "t": 50, "b": 40},
        yaxis={"tickmode": "array", "tickvals": labels, "ticktext": shown},
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

    from ...files import write_atomic
    from ...plots.page import CSP

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
<html><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="{CSP}">
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
    if "no_logits" in report.extra:
        out += ["", f"no promoted / suppressed tokens: {report.extra['no_logits']}"]
    else:
        via = report.extra.get("logits_via", "W_dec @ W_U")
        for name, rows in (("promotes", report.promoted), ("suppresses", report.suppressed)):
            out += ["", f"{name} ({via}):"]
            out.append("  " + "  ".join(f"{tok!r} {v:+.2f}" for tok, v in rows))
    return "\n".join(out)


SHIPPED_NAMES = ("tiny-gpt2-sae", "tiny-gpt2-res")


def resolve_sae(name: str) -> SAE:
    """An SAE argument: the shipped SAE's name (`tiny-gpt2-sae` or `tiny-gpt2-res`), or a folder."""
    from ..training import SHIPPED_SAE_DIR

    return SAE.from_pretrained(SHIPPED_SAE_DIR if name in SHIPPED_NAMES else name)


def add_arguments(p: Any) -> None:
    """`interp-gpt features` options."""
    p.add_argument("model", metavar="MODEL", help="the model (tiny-gpt2 for the shipped SAE)")
    p.add_argument("sae", metavar="SAE", help="an SAE folder (cfg.json + sae_weights.safetensors) or tiny-gpt2-sae")
    p.add_argument("--feature", type=int, required=True, metavar="N", help="the feature to show")
    add_data_argument(p, "the text to read (a folder: the validation tail of its files, as train-sae splits them)")
    p.add_argument("--max-windows", type=int, default=256, metavar="N", help="128-token windows to read (default 256)")
    p.add_argument("--contexts", type=int, default=8, metavar="N", help="top contexts to show (default 8)")
    p.add_argument("--html", metavar="PAGE.html", help="also write the offline feature page (default: none)")


def run(args: Any) -> int:
    """`interp-gpt features MODEL SAE --feature N`: print the feature's report (and write --html)."""
    from ...loading import from_pretrained
    from ..training.data import held_out_texts, token_windows

    model = from_pretrained(args.model)
    sae = resolve_sae(args.sae)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:  # before any text is read: the SAE's hook and width against the model, one line if not
            check_sae_fits(model, sae)
        except (KeyError, ValueError) as e:  # KeyError: a hook the model lacks (a bad argument here)
            raise ValueError(f"SAE {args.sae}: {e.args[0]}") from None
    for w in caught:
        print(f"warning: {' '.join(str(w.message).split())}", file=sys.stderr)
    check_int_in_range(args.max_windows, "--max-windows", 1, None)
    texts = held_out_texts(args.data, "--data")
    ctx = min(128, int(model.cfg.n_ctx))
    tokens = token_windows(model, texts, ctx, args.max_windows)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r".*cfg\.metadata\.model_name")  # printed above already
        report = feature_report(model, sae, tokens, args.feature, n_contexts=args.contexts)
    print(format_feature(report))
    if args.html:
        print(f"\nwrote {feature_page(report, args.html)}")
    return 0
