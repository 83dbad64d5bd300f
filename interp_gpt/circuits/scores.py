"""Edge scores: edge attribution patching (EAP), EAP with integrated gradients (EAP-IG), and exact
per-edge patching scores. Every score is `[n_edges]`, indexed like `Graph(model.cfg)`'s edges, and
estimates (or, exactly, measures) `metric(edge patched) - metric(clean)`.

EAP (Syed et al. 2023): `score(s -> r) = sum over batch, pos of (corrupted_s - clean_s) . d metric / d r_in`,
the gradient taken at the clean run, from one clean forward, one corrupted forward and one
backward for every edge (auto-circuit's scores are the negative of these).
EAP-IG (Hanna et al. 2024): the gradient averaged over `steps` runs whose input embeddings lie
between the corrupted and the clean ones, `corrupted + k/steps (clean - corrupted)` for k = 1..steps;
the steps run stacked along the batch. `steps=1` is EAP.
`modified_eap_scores`: EAP with extra forward hooks that change only the backward (RelP, GIM: rules.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_callable, check_int_in_range, gradient_reached, zero_gradient_error
from ..model.gpt import GPT
from ..patching.generic import metric_value, scalar_metric, user_hooked_points
from ..patching.generic import warn_unbatched as _warn_unbatched
from ._inputs import edge_sets_of, prepare
from ._run import BaseRun, Metric, attached, flags
from .graph import Graph
from .rules import Rules

__all__ = ["eap_scores", "eap_ig_scores", "modified_eap_scores", "exact_edge_scores"]

# Token rows of one EAP-IG forward+backward: the per-head q/k/v inputs make each row cost about
# 3 * n_heads residual streams per layer, kept for the backward.
IG_ROWS_PER_FORWARD = 512
# What a metric that is not a scalar is told.
_HINT = " (one number for the batch, e.g. a mean over the prompts)"


def eap_scores(
    model: GPT, clean_tokens: Any, corrupted_tokens: Any, metric: Metric, *, progress: bool = False
) -> Tensor:
    """Edge attribution patching: every edge's `(corrupted_s - clean_s) . d metric / d receiver input`,
    summed over batch and positions, from two forwards and one backward.

    Args:
        clean_tokens: `[batch, pos]` token ids (or strings).
        corrupted_tokens: token ids (or strings) of the same shape as `clean_tokens`, or an ablation
            ("zero", "mean", "resample") as in `patch_edges`.
        metric: logits `[batch, pos, d_vocab]` -> a scalar tensor, differentiable (e.g.
            `functools.partial(interp_gpt.metrics.logit_diff, answer_tokens=answers)`).

    Returns:
        float32 `[n_edges]` scores in `Graph(model.cfg)`'s edge order.

    Example:
        >>> scores = eap_scores(model, clean, corrupted, metric)
        >>> Graph.from_model(model).top_edges(scores, k=5)
    """
    return _eap_ig(model, clean_tokens, corrupted_tokens, metric, 1, None, progress, "eap_scores")


def eap_ig_scores(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    metric: Metric,
    steps: int = 5,
    *,
    batch_size: int | None = None,
    progress: bool = True,
) -> Tensor:
    """EAP with integrated gradients: EAP's gradient averaged over `steps` interpolations of the
    input embeddings from the corrupted to the clean ones (k/steps of the way, k = 1..steps).

    Args:
        steps: interpolation steps (1: EAP).
        batch_size: steps per forward+backward (default: about 512 token rows).

    Returns:
        float32 `[n_edges]` scores in `Graph(model.cfg)`'s edge order.

    Raises:
        ValueError: the metric's gradient is 0 at every receiver input (a step function such as
            sign or round): every score would be 0.

    Example:
        >>> scores = eap_ig_scores(model, clean, corrupted, metric, steps=5)
    """
    return _eap_ig(model, clean_tokens, corrupted_tokens, metric, steps, batch_size, progress, "eap_ig_scores")


def modified_eap_scores(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    metric: Metric,
    rules: Rules,
    *,
    progress: bool = False,
    caller: str = "modified_eap_scores",
) -> Tensor:
    """EAP with a modified backward pass: `eap_scores` with the forward hooks `rules(model)` attached
    during the gradient run (hooks that keep every forward value and change only the backward, as
    `interp_gpt.circuits.rules` makes them: RelP's, GIM's). `caller` names the function in errors.

    Example:
        >>> scores = modified_eap_scores(model, clean, corrupted, metric, relp_rules)
    """
    check_callable(rules, "rules", "a function model -> [(hook point, hook function)]", caller)
    return _eap_ig(model, clean_tokens, corrupted_tokens, metric, 1, None, progress, caller, rules)


def _eap_ig(
    model: Any,
    clean_tokens: Any,
    corrupted_tokens: Any,
    metric: Metric,
    steps: Any,
    batch_size: Any,
    progress: bool,
    caller: str,
    rules: Rules | None = None,
) -> Tensor:
    check_callable(metric, "metric", "a function of the logits", caller)
    steps = check_int_in_range(steps, "steps", 1, None, "interpolation steps", caller=caller)
    if batch_size is not None:
        check_int_in_range(batch_size, "batch_size", 1, None, "steps per forward", caller=caller)
    model, graph, base, other_of, other = prepare(model, clean_tokens, corrupted_tokens, caller=caller, gradient=True)
    n_batch, n_pos = base.tokens.shape
    hooked = user_hooked_points(model)
    if hooked:
        _warn_unbatched(hooked)
    per = 1 if hooked else batch_size or max(1, IG_ROWS_PER_FORWARD // (n_batch * n_pos))
    diff = other.expand_as(base.senders) - base.senders  # [batch, pos, n_senders, d_model]
    # The corrupted input embeddings: the input sender's other value (an ablation's, too).
    start_in = other[:, :, 0].expand_as(base.resid[0])
    matrix = torch.zeros(len(graph.senders), len(graph.receivers), dtype=diff.dtype, device=diff.device)
    # Sender-major rows [n_senders, batch * pos * d_model], copied once: each receiver group's scores are then
    # one matmul with a slice of contiguous rows (an einsum over diff's slice copied it for every group).
    diff = diff.permute(2, 0, 1, 3).reshape(diff.shape[2], -1)
    bar = tqdm(total=steps, desc="EAP-IG" if steps > 1 else "EAP", disable=not progress)
    reached = False  # a non-zero gradient at some receiver input, in some step
    try:
        for lo in range(1, steps + 1, per):
            ks = list(range(lo, min(lo + per, steps + 1)))
            reached |= _accumulate(model, graph, base, start_in, diff, [k / steps for k in ks], metric, matrix, rules)
            bar.update(len(ks))
    finally:
        bar.close()
    if not reached:
        raise zero_gradient_error("metric", metric, caller, "receiver input (in every step)")
    scores = matrix[graph.edge_sender.to(matrix.device), graph.edge_receiver.to(matrix.device)] / steps
    return scores.float()


def _accumulate(
    model: GPT,
    graph: Graph,
    base: BaseRun,
    start_in: Tensor,
    diff: Tensor,
    alphas: list[float],
    metric: Metric,
    matrix: Tensor,
    rules: Rules | None = None,
) -> bool:
    """Add `sum over copies, batch, pos of diff . grad` into `matrix [n_senders, n_receivers]` for one
    forward+backward of `len(alphas)` interpolated copies stacked along the batch (`diff`: the senders'
    differences as rows `[n_senders, batch * pos * d_model]`; `rules`: extra forward hooks that change
    the backward only). Returns whether the metric's gradient was non-zero at some receiver input."""
    n, n_heads = graph.n_layers, graph.n_heads
    n_batch, n_pos = base.tokens.shape
    n_copies = len(alphas)
    weights = torch.tensor(alphas, dtype=start_in.dtype, device=start_in.device)[:, None, None, None]
    # torch.lerp gives the clean input exactly at alpha = 1.
    inputs = torch.lerp(start_in[None], base.resid[0][None], weights).reshape(n_copies * n_batch, n_pos, -1)
    kept: dict[tuple[int, str], Tensor] = {}

    def keep(layer: int, kind: str, clone: bool) -> Any:
        def fn(x: Tensor, hook: Any) -> Tensor:
            y = x.clone() if clone else x  # q, k and v get the same tensor: a copy each
            kept[(layer, kind)] = y
            return y

        return fn

    hooks = []
    has_mlp = bool(graph.mlps_per_layer)
    for layer, block in enumerate(model.blocks):
        hooks += [(getattr(block, f"hook_{c}_input"), keep(layer, c, True)) for c in "qkv"]
        if has_mlp:
            hooks.append((block.hook_mlp_in, keep(layer, "mlp", False)))
    hooks.append((model.blocks[n - 1].hook_resid_post, keep(n, "logits", False)))
    if rules is not None:
        hooks += rules(model)
    with torch.enable_grad(), attached(hooks), flags(model, split=True, mlp_in=True if has_mlp else None):
        x = inputs.detach().requires_grad_(True)
        logits = model(x, start_at_layer=0)
        total = torch.stack(
            [
                scalar_metric(metric, logits[i * n_batch : (i + 1) * n_batch], "edge attribution", _HINT)
                for i in range(n_copies)
            ]
        ).sum()
        keys = list(kept)
        grads = torch.autograd.grad(total, [kept[k] for k in keys], allow_unused=True)
    reached = gradient_reached(grads)
    with torch.no_grad():
        for key, g in zip(keys, grads, strict=True):
            if g is None:
                continue
            layer, kind = key
            g = g.reshape(n_copies, n_batch, *g.shape[1:]).sum(0)  # [batch, pos, (n_heads,) d_model]
            if kind == "logits":
                r = [graph.logits_receiver]
                n_up = len(graph.senders)
            elif kind == "mlp":
                r = [graph.mlp_receiver(layer)]
                n_up = graph.receiver_n_senders[r[0]]
            else:
                r = [graph.head_receiver(layer, h, kind) for h in range(n_heads)]
                n_up = graph.receiver_n_senders[r[0]]
            g = g if g.ndim == 4 else g[:, :, None]  # [batch, pos, receivers, d_model]
            matrix[:n_up, r] += diff[:n_up] @ g.permute(0, 1, 3, 2).reshape(-1, g.shape[2])
    return reached


def exact_edge_scores(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    metric: Metric,
    edges: Any = None,
    *,
    batch_size: int | None = None,
    logit_positions: Any = None,
    progress: bool = True,
) -> Tensor:
    """The exact effect of patching each edge alone: `metric(edge patched) - metric(clean)`, batched.
    One patched run per edge: meant for small models or a subset `edges`.

    Args:
        edges: edge names, indices or a mask (default all); scores of the others are NaN.
        corrupted_tokens: tokens or an ablation ("zero", "mean", "resample").
        logit_positions: the positions the metric reads (see `patch_edges`): faster.

    Returns:
        float32 `[n_edges]` in `Graph(model.cfg)`'s edge order.

    Example:
        >>> exact = exact_edge_scores(model, clean, corrupted, metric)
        >>> torch.corrcoef(torch.stack([exact, eap_scores(model, clean, corrupted, metric)]))
    """
    check_callable(metric, "metric", "a function of the logits", "exact_edge_scores")
    prepared = prepare(model, clean_tokens, corrupted_tokens, caller="exact_edge_scores")
    graph = prepared.graph
    idx = torch.arange(graph.n_edges) if edges is None else graph.edge_indices(edges, caller="exact_edge_scores")
    sets = edge_sets_of(graph, [int(i) for i in idx])
    values = prepared.run(
        sets,
        metric,
        batch_size=batch_size,
        progress=progress,
        desc="exact edge scores",
        logit_positions=logit_positions,
    )
    out = torch.full((graph.n_edges,), float("nan"), device=values.device)
    out[idx.to(values.device)] = values - metric_value(metric, prepared.base.logits)
    return out
