"""What the graph page (`viewer.py`) shows about each feature node beyond the graph itself: the tokens its
decoder row promotes and suppresses through the unembedding, and the contexts where it fires most.

Promoted / suppressed: the feature's decoder row summed over the layers it writes (one for a per-layer
transcoder, layers l..n-1 for a cross-layer one), times `W_U`: its direct effect on the logits per unit of
activation, without ln_final and b_U, as `interp_gpt.sae.features` reads an SAE feature's.

Contexts: the model runs over token windows `[n, pos]`; each layer's transcoder input is encoded (the
whole layer: TopK needs every feature) and, for the features on the page, the `n_contexts` positions
where each fires most are kept with `_BEFORE` tokens before and `_AFTER` after. Position 0 (the BOS) is
left out, as `attribute` leaves it out. Memory: one float per window position per feature on the page.

Example:
    >>> details = feature_details(graph, records, model, tcs, windows, 8, 5, "graph_page")
    >>> details[(1, 42)]["promoted"][:2], details[(1, 42)]["contexts"][0]["max"]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import check_token_ids
from ._inputs import check_transcoders
from .graph import AttributionGraph
from .replacement import Readers

__all__ = ["feature_details"]

_BEFORE, _AFTER, _BATCH = 8, 3, 16


def _text(model: Any, ids: list[int]) -> list[str]:
    tok = getattr(model, "tokenizer", None)
    return [f"#{i}" for i in ids] if tok is None else [str(s) for s in tok.decode_each(ids)]


def _short(x: float) -> float:
    return float(f"{x:.4g}")


def feature_details(
    graph: AttributionGraph,
    records: list[dict[str, Any]],
    model: Any,
    transcoders: Any,
    contexts: Tensor | None,
    n_tokens: int,
    n_contexts: int,
    caller: str,
) -> dict[tuple[int, int], dict[str, Any]]:
    """(layer, feature) -> {"promoted", "suppressed"[, "contexts"]} for the feature records among
    `records` (`graph_json`'s node records); {} without `transcoders`."""
    if transcoders is None:
        if contexts is not None:
            raise ValueError(f"{caller}: contexts needs transcoders (and model) to find where each feature fires")
        return {}
    if model is None:
        raise ValueError(f"{caller}: transcoders needs model (its unembedding reads the decoder rows); pass model=")
    readers = check_transcoders(model, transcoders, caller)
    features: dict[int, list[int]] = {}
    for r in records:
        if r["feature_type"] == "cross layer transcoder":
            features.setdefault(int(r["layer"]), []).append(int(r["node_id"].split("_")[1]))
    by_layer = {layer: torch.tensor(sorted(set(f))) for layer, f in sorted(features.items())}
    for layer, f in by_layer.items():
        d_sae = int(readers.encoder(layer).shape[1])
        if int(f.max()) >= d_sae:
            raise ValueError(
                f"{caller}: the graph has feature {int(f.max())} at layer {layer} but transcoders has {d_sae} "
                "features there: pass the transcoders the graph was made with"
            )
    out = _promoted(model, readers, by_layer, n_tokens)
    if contexts is not None:
        _check_contexts(model, contexts, caller)
        for key, found in _contexts(model, readers, contexts, by_layer, n_contexts).items():
            out[key]["contexts"] = found
    return out


@torch.no_grad()
def _promoted(model: Any, readers: Readers, by_layer: dict[int, Tensor], n: int) -> dict[tuple[int, int], dict]:
    """Each feature's top and bottom `n` tokens of its decoder rows (summed) times W_U."""
    out: dict[tuple[int, int], dict] = {}
    W_U = model.W_U  # [d_model, d_vocab]
    n = min(n, int(W_U.shape[1]))
    for layer, feats in by_layer.items():
        rows, _ = readers.decoder_rows(layer, feats.to(readers.encoder(layer).device))  # [f, n_out, d_model]
        logits = (rows.sum(1).to(W_U) @ W_U).float().cpu()  # [f, d_vocab]
        up, down = logits.topk(n, dim=1), (-logits).topk(n, dim=1)
        for j, f in enumerate(feats.tolist()):
            out[(layer, f)] = {
                "promoted": [[t, _short(v)] for t, v in zip(_text(model, up.indices[j].tolist()), up.values[j].tolist(), strict=True)],
                "suppressed": [[t, _short(-v)] for t, v in zip(_text(model, down.indices[j].tolist()), down.values[j].tolist(), strict=True)],
            }  # fmt: skip
    return out


def _check_contexts(model: Any, contexts: Any, caller: str) -> None:
    if (
        not isinstance(contexts, Tensor)
        or contexts.ndim != 2
        or contexts.is_floating_point()
        or contexts.dtype == torch.bool
    ):
        what = (
            f"a {contexts.dtype} tensor of shape {tuple(contexts.shape)}"
            if isinstance(contexts, Tensor)
            else type(contexts).__name__
        )
        raise TypeError(
            f"{caller}: contexts: expected token ids [n_windows, pos] (e.g. token_windows(...)), got {what}"
        )
    n, pos = contexts.shape
    if n == 0 or pos < 2 or pos > model.cfg.n_ctx:
        raise ValueError(
            f"{caller}: contexts has shape {(n, pos)}: expected at least one window of 2..{model.cfg.n_ctx} tokens"
        )
    check_token_ids(contexts, model.cfg.d_vocab, "contexts", caller=caller, axes="window, pos")


@torch.no_grad()
def _contexts(
    model: Any, readers: Readers, windows: Tensor, by_layer: dict[int, Tensor], k: int
) -> dict[tuple[int, int], list[dict]]:
    """Each feature's `k` top-activating positions in `windows`, with the tokens around them."""
    if not by_layer:
        return {}
    hooks = {layer: readers.input_hook(layer) for layer in by_layer}
    acts: dict[int, list[Tensor]] = {layer: [] for layer in by_layer}
    device = model.W_E.device
    for start in range(0, windows.shape[0], _BATCH):
        batch = windows[start : start + _BATCH].to(device)
        _, cache = model.run_with_cache(batch, names_filter=list(hooks.values()), return_type=None)
        for layer, feats in by_layer.items():
            a = readers.encode(layer, cache[hooks[layer]])[..., feats.to(device)].float().cpu()  # [b, pos, f]
            a[:, 0] = 0  # the BOS: no node's value
            acts[layer].append(a)
    n_pos = windows.shape[1]
    out: dict[tuple[int, int], list[dict]] = {}
    for layer, feats in by_layer.items():
        a = torch.cat(acts[layer])  # [n, pos, f]
        flat = a.flatten(0, 1)  # [n * pos, f]
        top = flat.topk(min(k, flat.shape[0]), dim=0)
        for j, f in enumerate(feats.tolist()):
            found = []
            for value, idx in zip(top.values[:, j].tolist(), top.indices[:, j].tolist(), strict=True):
                if value <= 0:
                    break
                row, pos = divmod(idx, n_pos)
                lo, hi = max(1, pos - _BEFORE), min(n_pos, pos + _AFTER + 1)
                found.append({
                    "tokens": _text(model, windows[row, lo:hi].tolist()),
                    "acts": [_short(v) for v in a[row, lo:hi, j].tolist()],
                    "pos": pos - lo, "max": _short(value),
                })  # fmt: skip
            out[(layer, f)] = found
    return out
