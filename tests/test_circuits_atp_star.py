"""interp_gpt.circuits.atp_star_scores (AtP*, Kramár et al. 2024) against references written here with
plain hooks: every edge into a head's q or k input by brute force (the pattern recomputed by the model
itself with the edge's difference patched in, one key position at a time on the key side), every other
edge as diff . gradient, and GradDrop's per-layer terms with the backward through one layer's
attention and MLP outputs cut by detaching them."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from interp_gpt import Config
from interp_gpt.circuits import Graph, atp_star_layer_scores, atp_star_scores, eap_scores

sys.path.insert(0, str(Path(__file__).resolve().parent))
from circuit_refs import all_flags, parse, random_model, sender_values  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TWO = Config(n_layers=2, d_model=24, n_heads=2, d_vocab=40, n_ctx=16, d_mlp=48)


def tokens(cfg: Config, seed: int, shape: tuple[int, int] = (2, 5)) -> torch.Tensor:
    return torch.randint(0, cfg.d_vocab, shape, generator=torch.Generator().manual_seed(seed))


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3].mean() - logits[:, -1, 5].mean() + 0.1 * logits[:, :, 7].mean()


# ----------------------------------------------------------------------------
# the references
# ----------------------------------------------------------------------------
def _dropping(model: Any, drop: int | None) -> list[tuple[str, Callable[..., Any]]]:
    """Hooks that cut layer `drop`'s attention and MLP outputs out of the backward (values unchanged)."""
    if drop is None:
        return []
    names = [f"blocks.{drop}.hook_attn_out"] + ([] if model.cfg.attn_only else [f"blocks.{drop}.hook_mlp_out"])
    return [(name, lambda x, hook: x.detach()) for name in names]


def _gradients(model: Any, clean: torch.Tensor, drop: int | None) -> tuple[dict[str, torch.Tensor], dict[int, Any]]:
    """d metric / d every receiver input (by receiver name, [batch, pos, d_model]) and, per layer, the
    clean pattern and d metric / d pattern [batch, head, q, k], from one run of the clean tokens."""
    cfg, n = model.cfg, model.cfg.n_layers
    kept: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[..., torch.Tensor]:
        def fn(x: torch.Tensor, hook: Any) -> torch.Tensor:
            y = x.clone()
            kept[name] = y
            return y

        return fn

    hooks = [(f"blocks.{ell}.hook_{c}_input", keep(f"{ell}{c}")) for ell in range(n) for c in "qkv"]
    hooks += [(f"blocks.{ell}.attn.hook_pattern", keep(f"{ell}p")) for ell in range(n)]
    if not cfg.attn_only:
        hooks += [(f"blocks.{ell}.hook_mlp_in", keep(f"m{ell}")) for ell in range(n)]
    hooks += [(f"blocks.{n - 1}.hook_resid_post", keep("logits"))] + _dropping(model, drop)
    with all_flags(model), torch.enable_grad():
        logits = model.run_with_hooks(clean, fwd_hooks=hooks)
        names = list(kept)
        found = torch.autograd.grad(metric(logits), [kept[k] for k in names], allow_unused=True)
    # A receiver of the dropped layer is cut off from the metric: its gradient is 0.
    grads = {k: torch.zeros_like(kept[k]) if g is None else g for k, g in zip(names, found, strict=True)}
    out = {"logits": grads["logits"]}
    for ell in range(n):
        for c in "qkv":
            for h in range(cfg.n_heads):
                out[f"a{ell}.h{h}<{c}>"] = grads[f"{ell}{c}"][:, :, h]
        if not cfg.attn_only:
            out[f"m{ell}"] = grads[f"m{ell}"]
    return out, {ell: (kept[f"{ell}p"].detach(), grads[f"{ell}p"]) for ell in range(n)}


def _patched_pattern(model: Any, clean: torch.Tensor, layer: int, head: int, kind: str, add: torch.Tensor) -> Any:
    """Layer `layer`'s pattern when `add` [batch, pos, d_model] is added to head `head`'s `kind` input."""
    seen = {}

    def patch(x: torch.Tensor, hook: Any) -> torch.Tensor:
        x = x.clone()
        x[:, :, head] += add
        return x

    def read(x: torch.Tensor, hook: Any) -> None:
        seen["p"] = x

    hooks = [(f"blocks.{layer}.hook_{kind}_input", patch), (f"blocks.{layer}.attn.hook_pattern", read)]
    with all_flags(model), torch.no_grad():
        model.run_with_hooks(clean, fwd_hooks=hooks, stop_at_layer=layer + 1)
    return seen["p"]


def reference(model: Any, clean: torch.Tensor, corrupted: torch.Tensor, drop: int | None) -> torch.Tensor:
    """Every edge's AtP* term: q / k edges by the exact pattern change (one key position at a time on the key
    side, every query position at once on the query side) times d metric / d pattern; every other edge
    diff . d metric / d receiver input; the gradients with layer `drop` cut from the backward."""
    graph = Graph(model.cfg)
    grads, patterns = _gradients(model, clean, drop)
    ours, theirs = sender_values(model, clean), sender_values(model, corrupted)
    out = torch.zeros(graph.n_edges, dtype=torch.float64)
    for i, name in enumerate(graph.edge_names):
        s, r = parse(name)
        diff = theirs[s] - ours[s]  # [batch, pos, d_model]
        if not (r.endswith("<q>") or r.endswith("<k>")):
            out[i] = (diff * grads[r]).sum()
            continue
        layer, head, kind = int(r[1 : r.index(".")]), int(r[r.index(".h") + 2 : r.index("<")]), r[-2]
        pattern, grad = patterns[layer]
        if kind == "q":  # every query position patched: each query's row recomputed exactly
            moved = [_patched_pattern(model, clean, layer, head, "q", diff) - pattern]
        else:  # one key position at a time
            moved = []
            for t in range(clean.shape[1]):
                one = torch.zeros_like(diff)
                one[:, t] = diff[:, t]
                moved.append(_patched_pattern(model, clean, layer, head, "k", one) - pattern)
        out[i] = sum((m[:, head] * grad[:, head]).sum() for m in moved)
    return out


def qk_edges(graph: Graph) -> torch.Tensor:
    return torch.tensor([graph.receivers[int(r)].kind in ("q", "k") for r in graph.edge_receiver])


# ----------------------------------------------------------------------------
# the QK fix and GradDrop against the references
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("toy", [None, "attn-only-shortformer"])
def test_atp_star_equals_the_brute_force_reference_edge_by_edge(toy):
    extra = dict(attn_only=True, positional_embedding_type="shortformer") if toy else {}
    cfg = dataclasses.replace(TWO, **extra)
    model = random_model(cfg, seed=5)
    clean, corrupted = tokens(cfg, 3), tokens(cfg, 4)
    qk = qk_edges(Graph(cfg))
    # The model runs in float64; the scores come back float32 (rounding: relative 6e-8). The key side's
    # closed form (one logit changed: (O + e g_t) / (N + e)) and the model's own softmax agree to float64
    # rounding, so relative 1e-6 is the float32 result's margin, not the method's.
    want = reference(model, clean, corrupted, None)
    got = atp_star_scores(model, clean, corrupted, metric, grad_drop=False)
    assert got.dtype == torch.float32 and got.shape == (Graph(cfg).n_edges,)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-9)
    assert (want[qk].abs() > 1e-3).float().mean() > 0.5  # the q / k edges carry something: the check can fail
    # GradDrop's terms: row l with layer l's attention and MLP outputs cut from the backward.
    rows = atp_star_layer_scores(model, clean, corrupted, metric)
    assert rows.shape == (cfg.n_layers, Graph(cfg).n_edges)
    want_rows = torch.stack([reference(model, clean, corrupted, layer) for layer in range(cfg.n_layers)])
    torch.testing.assert_close(rows.double(), want_rows, rtol=1e-6, atol=1e-9)
    assert not torch.allclose(want_rows[0], want)  # dropping a layer changes the gradients: the check can fail
    # AtP*: the paper's 1/(L-1) sum over layers of |term|.
    torch.testing.assert_close(
        atp_star_scores(model, clean, corrupted, metric).double(),
        want_rows.abs().sum(0) / (cfg.n_layers - 1),
        rtol=1e-6,
        atol=1e-9,
    )
