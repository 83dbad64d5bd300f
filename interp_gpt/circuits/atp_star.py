"""AtP* edge scores (Kramár et al. 2024, "AtP*: An efficient and scalable method for localizing LLM
behaviour to components", arXiv 2403.00745): attribution patching with the paper's two fixes, on the
edges of `Graph(model.cfg)`. Each score estimates `metric(edge patched) - metric(clean)`, as `eap_scores`.

Phases, in the paper's order:

1. Clean and corrupted runs (`prepare`): every sender's difference `diff_s = corrupted_s - clean_s`.
2. Gradients: one forward and backward of copies of the clean run stacked on the batch. Without
   GradDrop one copy; with it, copy l drops layer l's contribution to the residual stream (its
   attention and MLP outputs) from the backward pass (the forward is unchanged). Kept: the metric's
   gradient at every receiver input and at every layer's attention pattern, and the clean q, k, scores.
3. AtP on the edges into v inputs, MLPs and the logits: `diff_s . grad_r`, summed over batch and
   positions (EAP).
4. The QK fix on the edges into q and k inputs. The head's new query (key) is recomputed exactly from
   the receiver input plus the sender's difference (`block.ln1` and `attn.project`; LayerNorm is
   recomputed, not linearised: it acts per position, so the exact value costs one LayerNorm per
   sender, the same as the projection after it). Then the attention logits and the exact softmax:
   on the query side the whole row of each query; on the key side one key position at a time (the
   paper's per-key recompute: the logit of key t alone changed, every other key clean), the effects
   summed over key positions. Score: `sum (pattern' - pattern) . d metric / d pattern`.
5. GradDrop: `score = 1/(L-1) * sum over l of |score_l|`, the paper's equation 11, where `score_l`
   is the AtP* estimate (phases 3-4) with the gradient of copy l. Dropping layer l zeroes the gradient
   at every receiver input of layer l, so for an edge into a head or an MLP one of the L terms is 0
   (hence L-1); an edge into the logits keeps all L (its gradient passes no layer), so its score is
   L/(L-1) times |AtP|. GradDrop scores are magnitudes (never negative): the paper ranks nodes by
   |effect|. The absolute value is taken of the whole batch's score (our metric is one number for
   the batch), not per prompt.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_callable, check_type, gradient_reached, zero_gradient_error
from ..model.gpt import GPT
from ..patching.generic import scalar_metric, user_hooked_points, warn_unbatched
from ._inputs import prepare
from ._run import BaseRun, Metric, attached, flags
from .graph import Graph

__all__ = ["atp_star_scores", "atp_star_layer_scores"]

# Token rows of one forward+backward (copies x batch x positions): with split q / k / v inputs each
# row costs about 3 * n_heads residual streams per layer, kept for the backward.
ROWS_PER_FORWARD = 512
# Floats one QK-fix step may hold ([copies, senders, batch, heads, q_pos, k_pos]): 2**25 = 128 MB in float32.
QK_FLOATS = 2**25
_HINT = " (one number for the batch, e.g. a mean over the prompts)"


def atp_star_scores(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    metric: Metric,
    *,
    grad_drop: bool = True,
    progress: bool = False,
) -> Tensor:
    """AtP* edge scores: EAP with the exact attention softmax for edges into queries and keys (the QK
    fix) and, with `grad_drop`, GradDrop's mean of per-layer-dropped magnitudes (see the module).

    Args:
        clean_tokens: `[batch, pos]` token ids (or strings).
        corrupted_tokens: token ids (or strings) of the same shape, or an ablation ("zero", "mean",
            "resample") as in `patch_edges`.
        metric: logits `[batch, pos, d_vocab]` -> a differentiable scalar tensor.
        grad_drop: GradDrop (the paper's AtP*): `1/(L-1) sum_l |score with layer l dropped|`, one
            backward per layer, non-negative scores; False: signed AtP + QK fix, one backward.

    Returns:
        float32 `[n_edges]` in `Graph(model.cfg)`'s edge order.

    Example:
        >>> scores = atp_star_scores(model, clean, corrupted, metric)
        >>> Graph.from_model(model).top_edges(scores, k=5)
    """
    caller = "atp_star_scores"
    grad_drop = check_type(grad_drop, bool, "grad_drop", "True or False", caller=caller)
    check_callable(metric, "metric", "a function of the logits", caller)
    n = model.cfg.n_layers if isinstance(model, GPT) else None
    if grad_drop and n == 1:
        raise ValueError(
            f"{caller}: grad_drop=True needs at least 2 layers (it averages over L-1 = {n - 1} layers); "
            "this model has 1: pass grad_drop=False"
        )
    if not grad_drop:
        return _scores(model, clean_tokens, corrupted_tokens, metric, [None], progress, caller)[0].float()
    layers = _scores(model, clean_tokens, corrupted_tokens, metric, list(range(n or 0)), progress, caller)
    return (layers.abs().sum(0) / (len(layers) - 1)).float()


def atp_star_layer_scores(
    model: GPT, clean_tokens: Any, corrupted_tokens: Any, metric: Metric, *, progress: bool = False
) -> Tensor:
    """GradDrop's terms: `[n_layers, n_edges]`, row l the signed AtP* estimate (AtP + QK fix) with
    layer l's attention and MLP outputs dropped from the backward pass. `atp_star_scores` with
    `grad_drop=True` is `rows.abs().sum(0) / (n_layers - 1)`.

    Example:
        >>> rows = atp_star_layer_scores(model, clean, corrupted, metric)   # [n_layers, n_edges]
    """
    caller = "atp_star_layer_scores"
    check_callable(metric, "metric", "a function of the logits", caller)
    n = model.cfg.n_layers if isinstance(model, GPT) else 0
    return _scores(model, clean_tokens, corrupted_tokens, metric, list(range(n)), progress, caller).float()


def _scores(
    model: Any,
    clean_tokens: Any,
    corrupted_tokens: Any,
    metric: Metric,
    drops: list[int | None],
    progress: Any,
    caller: str,
) -> Tensor:
    """`[len(drops), n_edges]` AtP + QK fix, row i with layer `drops[i]` dropped from the backward (None: none)."""
    progress = check_type(progress, bool, "progress", "True or False", caller=caller)
    # Phase 1: the clean and corrupted runs.
    model, graph, base, _, other = prepare(model, clean_tokens, corrupted_tokens, caller=caller, gradient=True)
    n_batch, n_pos = base.tokens.shape
    hooked = user_hooked_points(model)
    if hooked:
        warn_unbatched(hooked)
    per = 1 if hooked else max(1, ROWS_PER_FORWARD // (n_batch * n_pos))
    # Detached: a sender's output minus b_out carries the parameter's autograd graph.
    diff = (other.expand_as(base.senders) - base.senders).detach()  # [batch, pos, n_senders, d_model]
    rows = diff.permute(2, 0, 1, 3).reshape(diff.shape[2], -1)  # [n_senders, batch * pos * d_model]
    out = torch.zeros(len(drops), graph.n_edges, dtype=diff.dtype, device=diff.device)
    s_idx, r_idx = graph.edge_sender.to(diff.device), graph.edge_receiver.to(diff.device)
    reached = False
    bar = tqdm(total=len(drops), desc="AtP*", disable=not progress)
    try:
        for lo in range(0, len(drops), per):
            chunk = drops[lo : lo + per]
            # Phase 2: gradients, one copy per dropped layer.
            g = _gradients(model, graph, base, metric, chunk)
            reached |= g.reached
            matrix = torch.zeros(
                len(chunk), len(graph.senders), len(graph.receivers), dtype=diff.dtype, device=diff.device
            )
            with torch.no_grad():
                # Phase 3: AtP on the edges into v inputs, MLPs and the logits.
                _atp(graph, g, rows, matrix)
                # Phase 4: the QK fix on the edges into q and k inputs.
                for layer in range(graph.n_layers):
                    _qk_fix(model, graph, base, diff, g, layer, matrix)
            out[lo : lo + len(chunk)] = matrix[:, s_idx, r_idx]
            bar.update(len(chunk))
    finally:
        bar.close()
    if not reached:
        raise zero_gradient_error("metric", metric, caller, "receiver input and attention pattern")
    return out


class _Grads:
    """What one stacked forward+backward keeps: `grads[(layer, kind)]` the metric's gradient per copy
    (`[copies, batch, pos, (n_heads,) d_model]` at a receiver input, kind q / k / v / mlp / logits;
    `[copies, batch, n_heads, q_pos, k_pos]` at a pattern, kind "pattern"), and the clean q, k
    `[batch, pos, n_heads, d_head]` and scores `[batch, n_heads, q_pos, k_pos]` per layer."""

    def __init__(self) -> None:
        self.grads: dict[tuple[int, str], Tensor] = {}
        self.q: dict[int, Tensor] = {}
        self.k: dict[int, Tensor] = {}
        self.scores: dict[int, Tensor] = {}
        self.reached = False


def _gradients(model: GPT, graph: Graph, base: BaseRun, metric: Metric, drops: list[int | None]) -> _Grads:
    """One forward of `len(drops)` copies of the clean run stacked on the batch, copy i with layer
    `drops[i]`'s attention and MLP outputs detached (dropped from the backward; None: nothing
    dropped), and one backward of the sum of the copies' metrics."""
    n_batch, n_pos = base.tokens.shape
    n_copies = len(drops)
    has_mlp = bool(graph.mlps_per_layer)
    kept: dict[tuple[int, str], Tensor] = {}
    out = _Grads()

    def keep(key: tuple[int, str], clone: bool) -> Any:
        def fn(x: Tensor, hook: Any) -> Tensor:
            y = x.clone() if clone else x  # q, k and v inputs are one tensor: a copy each
            kept[key] = y
            return y

        return fn

    def clean_rows(store: dict[int, Tensor], layer: int) -> Any:
        def fn(x: Tensor, hook: Any) -> None:
            store[layer] = x[:n_batch].detach()  # every copy's forward is the clean run

        return fn

    def drop(rows: Tensor) -> Any:
        def fn(x: Tensor, hook: Any) -> Tensor:
            return torch.where(rows, x.detach(), x)  # the same values; no gradient through these rows

        return fn

    dev = base.resid[0].device
    copy_of_row = torch.arange(n_copies, device=dev).repeat_interleave(n_batch)
    hooks: list[Any] = []
    for layer, block in enumerate(model.blocks):
        attn: Any = block.attn
        hooks += [(getattr(block, f"hook_{c}_input"), keep((layer, c), True)) for c in "qkv"]
        hooks += [(attn.hook_pattern, keep((layer, "pattern"), False))]
        hooks += [(attn.hook_q, clean_rows(out.q, layer)), (attn.hook_k, clean_rows(out.k, layer))]
        hooks += [(attn.hook_attn_scores, clean_rows(out.scores, layer))]
        if has_mlp:
            hooks.append((block.hook_mlp_in, keep((layer, "mlp"), False)))
        dropped = torch.tensor([d == layer for d in drops], device=dev)[copy_of_row][:, None, None]
        if bool(dropped.any()):
            hooks.append((block.hook_attn_out, drop(dropped)))
            if has_mlp:
                hooks.append((block.hook_mlp_out, drop(dropped)))
    n = graph.n_layers
    hooks.append((model.blocks[n - 1].hook_resid_post, keep((n, "logits"), False)))
    with torch.enable_grad(), attached(hooks), flags(model, split=True, mlp_in=True if has_mlp else None):
        x = base.resid[0].repeat(n_copies, 1, 1).detach().requires_grad_(True)
        logits = model(x, start_at_layer=0)
        total = torch.stack(
            [scalar_metric(metric, logits[i * n_batch : (i + 1) * n_batch], "AtP*", _HINT) for i in range(n_copies)]
        ).sum()
        keys = list(kept)
        grads = torch.autograd.grad(total, [kept[k] for k in keys], allow_unused=True)
    out.reached = gradient_reached(grads)
    for key, g in zip(keys, grads, strict=True):
        g = torch.zeros_like(kept[key]) if g is None else g  # a receiver the metric does not reach: 0
        out.grads[key] = g.detach().reshape(n_copies, n_batch, *g.shape[1:])
    return out


def _atp(graph: Graph, g: _Grads, rows: Tensor, matrix: Tensor) -> None:
    """Phase 3: `matrix[copy, sender, receiver] = diff_s . grad_r` for the receivers other than q and k inputs."""
    n_copies = matrix.shape[0]
    for (layer, kind), grad in g.grads.items():
        if kind in ("q", "k", "pattern"):
            continue
        if kind == "logits":
            rs = [graph.logits_receiver]
        elif kind == "mlp":
            rs = [graph.mlp_receiver(layer)]
        else:
            rs = [graph.head_receiver(layer, h, kind) for h in range(graph.n_heads)]
        n_up = graph.receiver_n_senders[rs[0]]
        grad = grad if grad.ndim == 5 else grad[:, :, :, None]  # [copies, batch, pos, receivers, d_model]
        for c in range(n_copies):
            matrix[c, :n_up, rs] = rows[:n_up] @ grad[c].permute(0, 1, 3, 2).reshape(-1, grad.shape[3])


def _qk_fix(model: GPT, graph: Graph, base: BaseRun, diff: Tensor, g: _Grads, layer: int, matrix: Tensor) -> None:
    """Phase 4 for one layer: `matrix[copy, sender, receiver]` for the receivers q and k of its heads."""
    block: Any = model.blocks[layer]
    attn: Any = block.attn
    n_heads, d_head = graph.n_heads, model.cfg.d_head
    n_up = graph.receiver_n_senders[graph.head_receiver(layer, 0, "q")]
    n_copies, n_batch, n_pos = matrix.shape[0], *base.tokens.shape
    x = base.resid[layer]  # [batch, pos, d_model]: every head's q / k input in the clean run
    scores, q, k = g.scores[layer], g.q[layer], g.k[layer]  # [batch, head, q_pos, k_pos], [batch, pos, head, d_head]
    pattern = scores.softmax(-1)
    grad = g.grads[(layer, "pattern")]  # [copies, batch, head, q_pos, k_pos]
    allowed = torch.isfinite(scores)
    kfix = _KeySide(scores, grad, allowed)
    step = max(1, QK_FLOATS // (max(n_copies, 1) * n_batch * n_heads * n_pos * n_pos + n_batch * n_pos * x.shape[-1]))
    scale = math.sqrt(d_head)
    for lo in range(0, n_up, step):
        d = diff[:, :, lo : min(lo + step, n_up)].permute(2, 0, 1, 3)  # [senders, batch, pos, d_model]
        n_s = d.shape[0]
        new_in = block.ln1((x[None] + d).reshape(n_s * n_batch, n_pos, -1))
        old_in = block.ln1(x)
        for kind in "qk":
            W, b = getattr(attn, f"W_{kind.upper()}"), getattr(attn, f"b_{kind.upper()}")
            # The change of the head's q (k): shortformer positions and the bias cancel in the difference.
            change = attn.project(new_in, W, b).reshape(n_s, n_batch, n_pos, n_heads, d_head) - attn.project(
                old_in, W, b
            )
            if kind == "q":  # each query's whole row of logits changed; the exact softmax per row
                new_scores = scores + torch.einsum("sbqhe,bkhe->sbhqk", change, k) / scale
                moved = new_scores.softmax(-1) - pattern  # masked keys: -inf stays -inf, 0 stays 0
                value = torch.einsum("sbhqk,cbhqk->csh", moved, grad)
            else:  # the logit of one key at a time changed
                delta = torch.einsum("bqhe,sbkhe->sbhqk", q, change) / scale
                value = kfix.effect(delta)
            rs = [graph.head_receiver(layer, h, kind) for h in range(n_heads)]
            matrix[:, lo : lo + n_s, rs] = value


class _KeySide:
    """The key-side QK fix: for every query q and key t, the pattern row of q recomputed with the
    logit of key t alone changed by `delta[.., q, t]`, and the change of `pattern . grad` in that row.

    With one logit changed, row q's new `pattern . grad` is `(O + e g_t) / (N + e)`, where N and O
    sum `exp(s_j - M)` and `exp(s_j - M) g_j` over the other keys j != t and e = `exp(s_t + delta - M)`;
    M is the largest other logit, so N >= 1 and nothing overflows (for e > 1 the fraction is taken
    divided through by e). N and O do not depend on delta: one pass per layer, O(q_pos * k_pos)."""

    def __init__(self, scores: Tensor, grad: Tensor, allowed: Tensor):
        self.scores, self.grad, self.allowed = scores, grad, allowed  # [b,h,q,t], [c,b,h,q,t], [b,h,q,t]
        masked = scores.masked_fill(~allowed, float("-inf"))
        top2 = masked.topk(min(2, scores.shape[-1]), dim=-1)
        first = top2.values[..., :1]
        second = top2.values[..., 1:2] if scores.shape[-1] > 1 else torch.full_like(first, float("-inf"))
        is_top = torch.zeros_like(allowed).scatter_(-1, top2.indices[..., :1], True)
        # M: the largest logit among the other keys (the second largest for the largest key).
        self.m = torch.where(is_top, second, first)  # [b, h, q, t]
        single = torch.isinf(self.m)  # a query with one allowed key: its row cannot change
        m_safe = torch.where(single, torch.zeros_like(self.m), self.m)
        # Sums over the other keys, by the row's largest logit and (for the largest key) the second.
        e1 = torch.where(allowed, (masked - first).exp(), torch.zeros_like(masked))
        e2 = torch.where(allowed & ~is_top, (masked - torch.where(torch.isinf(second), first, second)).exp(), 0.0)
        n1 = e1.sum(-1, keepdim=True) - e1  # [b, h, q, t]: the largest term (1) is in every sum but its own
        o1 = (e1 * grad).sum(-1, keepdim=True) - e1 * grad  # [c, b, h, q, t]
        n2 = e2.sum(-1, keepdim=True).expand_as(e2)
        o2 = (e2 * grad).sum(-1, keepdim=True).expand_as(grad)
        self.n = torch.where(is_top, n2, n1)
        self.o = torch.where(is_top, o2, o1)
        self.single = single | ~allowed
        self.base = self._row(torch.where(allowed, masked - m_safe, torch.zeros_like(masked)))
        self.m_safe = m_safe

    def _row(self, ell: Tensor) -> Tensor:
        """Row q's `pattern . grad` with key t's logit minus M equal to `ell` (`[.., b, h, q, t]`)."""
        big = ell > 0
        w = torch.exp(torch.where(big, -ell, ell))  # <= 1
        n, o, g = (
            self.n,
            self.o[:, None] if ell.ndim == 5 else self.o,
            self.grad[:, None] if ell.ndim == 5 else self.grad,
        )
        value = torch.where(big, (o * w + g) / (n * w + 1), (o + w * g) / (n + w))
        return torch.where(self.single, torch.zeros_like(value), value)

    def effect(self, delta: Tensor) -> Tensor:
        """`[copies, senders, heads]`: the summed per-key effects of logit changes `delta` `[s, b, h, q, t]`."""
        ell = torch.where(self.allowed, self.scores - self.m_safe, torch.zeros_like(self.scores)) + delta
        change = self._row(ell) - self.base[:, None]  # [c, s, b, h, q, t]
        return change.sum((2, 4, 5))
