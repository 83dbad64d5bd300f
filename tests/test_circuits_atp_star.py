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
        diff = (theirs[s] - ours[s]).detach()  # [batch, pos, d_model] (an MLP sender minus b_out carries a graph)
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
TOYS: dict[str, dict[str, Any]] = {
    "gpt2": {},
    # no MLPs, and the positions added to q and k after ln1 (the residual stream starts as the embedding)
    "attn-only-shortformer": dict(attn_only=True, positional_embedding_type="shortformer"),
    "no-norm": dict(normalization_type=None),
}


@pytest.mark.parametrize("toy", sorted(TOYS))
def test_atp_star_equals_the_brute_force_reference_edge_by_edge(toy):
    cfg = dataclasses.replace(TWO, **TOYS[toy])
    model = random_model(cfg, seed=5)
    if toy == "no-norm":  # with no LayerNorm the small embeddings leave every pattern near uniform
        with torch.no_grad():
            model.embed.W_E.mul_(8.0)
            model.pos_embed.W_pos.mul_(8.0)
    clean, corrupted = tokens(cfg, 3), tokens(cfg, 4)
    qk = qk_edges(Graph(cfg))
    # The model runs in float64; the scores come back float32 (rounding: relative 6e-8). The key side's
    # closed form (one logit changed: (O + e g_t) / (N + e)) and the model's own softmax agree to float64
    # rounding, so relative 1e-6 is the float32 result's margin, not the method's.
    want = reference(model, clean, corrupted, None)
    got = atp_star_scores(model, clean, corrupted, metric, grad_drop=False)
    assert got.dtype == torch.float32 and got.shape == (Graph(cfg).n_edges,) and not got.requires_grad
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-9)
    # The q / k edges carry something: the check can fail.
    assert (want[qk].abs() > 1e-3 * want.abs().max()).float().mean() > 0.5
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


def test_atp_star_is_eap_off_the_queries_and_keys_and_its_first_order_on_them():
    model = random_model(TWO, seed=7)
    clean, corrupted = tokens(TWO, 5), tokens(TWO, 6)
    qk = qk_edges(Graph(TWO))
    star = atp_star_scores(model, clean, corrupted, metric, grad_drop=False)
    eap = eap_scores(model, clean, corrupted, metric)
    # Edges into v inputs, MLPs and the logits: AtP* without GradDrop is EAP.
    torch.testing.assert_close(star[~qk], eap[~qk], rtol=1e-6, atol=1e-9)
    # The ablations as in eap_scores: the same estimate off q / k.
    for ablation in ("zero", "mean"):
        star = atp_star_scores(model, clean, ablation, metric, grad_drop=False)
        torch.testing.assert_close(star[~qk], eap_scores(model, clean, ablation, metric)[~qk], rtol=1e-6, atol=1e-9)
    star = atp_star_scores(model, clean, corrupted, metric, grad_drop=False)
    # On q / k edges the exact softmax (and LayerNorm) differs from EAP's linearisation at this corruption...
    gap = (star[qk] - eap[qk]).abs().max() / eap[qk].abs().max()
    assert gap > 1e-2
    # ...and agrees with it to first order: corrupt a token into one whose embedding is eps away, so every
    # sender's difference is O(eps) and the QK fix's departure from EAP O(eps^2), relative O(eps).
    eps = 1e-5
    with torch.no_grad():
        model.embed.W_E[9] = model.embed.W_E[8] + eps * torch.randn(
            TWO.d_model, generator=torch.Generator().manual_seed(1)
        )
    near = clean.clone()
    near[:, 2] = 8
    moved = near.clone()
    moved[:, 2] = 9
    star = atp_star_scores(model, near, moved, metric, grad_drop=False)
    eap = eap_scores(model, near, moved, metric)
    assert eap[qk].abs().max() > 1e-7  # the small change still reaches the queries and keys
    assert (star[qk] - eap[qk]).abs().max() / eap[qk].abs().max() < 1e-3


def test_the_key_side_is_stable_on_saturated_heads_in_float32():
    # Large query and key weights saturate the softmax (a pattern row near one-hot): the key side's
    # closed form must still give the exact recompute, in float32 as the float64 reference.
    model = random_model(TWO, seed=2)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.mul_(20.0)
            block.attn.W_K.mul_(20.0)
    clean, corrupted = tokens(TWO, 7), tokens(TWO, 8)
    want = reference(model, clean, corrupted, None)
    patterns = _gradients(model, clean, None)[1]
    top = torch.stack([p[:, :, 1:].max(-1).values.flatten() for p, _ in patterns.values()])
    assert (top > 1 - 1e-7).float().mean() > 0.5  # saturated: most rows put all but 1e-7 on one key
    got = atp_star_scores(model.float(), clean, corrupted, metric, grad_drop=False)
    qk = qk_edges(Graph(TWO))
    scale = want[qk].abs().max()
    assert scale > 1e-3
    torch.testing.assert_close(got[qk].double(), want[qk], rtol=0, atol=1e-4 * float(scale))


def test_grad_drop_with_one_layer_and_bad_input():
    cfg = dataclasses.replace(TWO, n_layers=1)
    model = random_model(cfg, seed=3)
    clean, corrupted = tokens(cfg, 1), tokens(cfg, 2)
    g = Graph(cfg)
    plain = atp_star_scores(model, clean, corrupted, metric, grad_drop=False)
    rows = atp_star_layer_scores(model, clean, corrupted, metric)
    assert rows.shape == (1, g.n_edges) and rows.dtype == torch.float32
    into_logits = g.edge_receiver == g.logits_receiver
    # Dropping the one layer cuts every head and MLP input off from the metric; the logits' edges pass no layer.
    assert rows[0, ~into_logits].abs().max() == 0 and plain[~into_logits].abs().max() > 0
    torch.testing.assert_close(rows[0, into_logits], plain[into_logits])
    with pytest.raises(ValueError, match="grad_drop=True needs at least 2 layers"):
        atp_star_scores(model, clean, corrupted, metric)
    with pytest.raises(TypeError, match="grad_drop"):
        atp_star_scores(model, clean, corrupted, metric, grad_drop="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="progress"):
        atp_star_scores(model, clean, corrupted, metric, grad_drop=False, progress=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metric"):
        atp_star_scores(model, clean, corrupted, "logit_diff", grad_drop=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="corrupted_tokens"):
        atp_star_scores(model, clean, corrupted[:, :3], metric, grad_drop=False)
    with pytest.raises(ValueError, match="zero gradient"):
        atp_star_scores(model, clean, corrupted, lambda logits: logits.sum() * 0, grad_drop=False)
