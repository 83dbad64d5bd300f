"""`qk_attribution` against brute force: the split sums to the head's own score (`hook_attn_scores`); each
term's vector, rebuilt here from plain hooks and the transcoders' public API, sums to the residual stream
(`hook_resid_pre`); removing a term from the residual at the query (key) position, ln1's scale frozen,
changes the score by exactly that term's query-side (key-side) contribution; and on tiny-gpt2's induction
head what was measured holds.
"""

from __future__ import annotations

import doctest
import importlib
import math
from typing import Any

import pytest
import torch
from test_attribution import a_clt, plts

from interp_gpt import GPT, Config
from interp_gpt.attribution import QKAttribution, QKTerm, qk_attribution
from interp_gpt.sae import CrossLayerTranscoder

TOKENS = torch.tensor([0, 5, 9, 17, 3, 42, 8, 61, 23, 7])


def tiny_gpt2() -> tuple[GPT, Any]:
    from interp_gpt.sae.training import shipped_transcoders

    model = GPT.from_pretrained("tiny-gpt2")
    return model, shipped_transcoders(model)


def induction_tokens(seed: int = 0) -> torch.Tensor:
    rand = torch.randint(100, 2000, (8,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([rand, rand])  # a BOS is put first: positions 1..8, then 9..16


def clean(model: GPT, tokens: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    names = ["hook_embed", "hook_pos_embed", f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.ln1.hook_scale"]
    names.append(f"blocks.{layer}.attn.hook_attn_scores")
    for lay in range(model.cfg.n_layers):
        names += [f"blocks.{lay}.attn.hook_result", f"blocks.{lay}.hook_mlp_out", f"blocks.{lay}.ln2.hook_normalized"]
    model.set_use_attn_result(True)
    try:
        _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n in names)
    finally:
        model.set_use_attn_result(False)
    return {n: cache[n][0] for n in names}


def term_vector(model: GPT, tcs: Any, c: dict[str, torch.Tensor], term: QKTerm, pos: int, layer: int) -> torch.Tensor:
    """A term's vector at `pos` in the residual entering `layer`, from the cache and the transcoders' API."""
    kind, lay, i = term
    if kind in ("embed", "pos_embed"):
        return c[f"hook_{kind}"][pos]
    # The part of every value that is the same at every key (b_V, and ln1.b @ W_V with LayerNorm unfolded)
    # reaches z whole (the pattern sums to 1): it is counted with b_O, where fold_ln / fold_value_biases put it.
    attn, ln = model.blocks[lay].attn, model.blocks[lay].ln1
    const = attn.b_V + (torch.einsum("m,hmd->hd", ln.b, attn.W_V) if ln.has_params else 0)
    const_out = torch.einsum("hd,hdm->hm", const, attn.W_O).detach()  # [n_heads, d_model]
    if kind == "head":
        return c[f"blocks.{lay}.attn.hook_result"][pos, i] - const_out[i]
    if kind == "attn_bias":
        return attn.b_O.detach() + const_out.sum(0)
    if isinstance(tcs, CrossLayerTranscoder):
        xs = torch.stack([c[f"blocks.{j}.ln2.hook_normalized"][pos] for j in range(model.cfg.n_layers)])
        acts = tcs.encode(xs)  # [n_layers, d_sae]
        if kind == "feature":
            return acts[lay, i] * sum(tcs.W_dec[lay][i, out - lay] for out in range(lay, layer))
        skip = xs[lay] @ tcs.W_skip[lay].T if tcs.cfg.skip else torch.zeros_like(xs[lay])
        if kind == "skip":
            return skip
        if kind == "tc_bias":
            return tcs.b_dec[lay]
        recon = sum(acts[s] @ tcs.W_dec[s][:, lay - s] for s in range(lay + 1)) + tcs.b_dec[lay] + skip
        return c[f"blocks.{lay}.hook_mlp_out"][pos] - recon
    tc = tcs[lay]
    x = c[f"blocks.{lay}.ln2.hook_normalized"][pos]
    if kind == "feature":
        return tc.encode(x)[i] * tc.W_dec[i]
    skip = x @ tc.W_skip.T if tc.cfg.skip else torch.zeros_like(x)
    if kind == "skip":
        return skip
    if kind == "tc_bias":
        return tc.b_dec
    return c[f"blocks.{lay}.hook_mlp_out"][pos] - tc(x)


def score_without(model: GPT, tokens: torch.Tensor, layer: int, head: int, q: int, k: int, pos: int, v: torch.Tensor):  # type: ignore[no-untyped-def]
    """The head's score with `v` taken out of the residual entering `layer` at `pos`, ln1's scale frozen."""
    scale = clean(model, tokens, layer)[f"blocks.{layer}.ln1.hook_scale"]
    out: list[torch.Tensor] = []

    def remove(t, hook):  # type: ignore[no-untyped-def]
        t = t.clone()
        t[0, pos] -= v
        return t

    hooks = [
        (f"blocks.{layer}.hook_resid_pre", remove),
        (f"blocks.{layer}.ln1.hook_scale", lambda t, hook: scale[None]),
        (f"blocks.{layer}.attn.hook_attn_scores", lambda t, hook: out.append(t[0, head, q, k]) or t),
    ]
    with torch.no_grad():
        model.run_with_hooks(tokens[None], fwd_hooks=hooks)
    return float(out[0])


def check_split(model: GPT, tokens: torch.Tensor, tcs: Any, layer: int, head: int, q: int, k: int) -> QKAttribution:
    qk = qk_attribution(model, tokens, tcs, layer, head, q, k)
    full = qk.tokens
    c = clean(model, full, layer)
    assert qk.score == pytest.approx(float(c[f"blocks.{layer}.attn.hook_attn_scores"][head, q, k]), abs=1e-5)
    assert qk.total == pytest.approx(qk.score, abs=2e-4 * max(1.0, abs(qk.score)))
    # The terms rebuilt independently, and their sum: the residual stream itself.
    for side, pos in (("query", q), ("key", k)):
        terms, vectors = getattr(qk, f"{side}_terms"), getattr(qk, f"{side}_vectors")
        assert terms[-1] == QKTerm("bias", -1, -1)
        ref = torch.stack([term_vector(model, tcs, c, t, pos, layer) for t in terms[:-1]])
        torch.testing.assert_close(vectors[:-1], ref, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(ref.sum(0), c[f"blocks.{layer}.hook_resid_pre"][pos], atol=1e-4, rtol=1e-4)
    # The bias term by hand: ln1's b through W plus b, with the other side's sum.
    ln, attn = model.blocks[layer].ln1, model.blocks[layer].attn
    q_bias = (ln.b @ attn.W_Q[head] if ln.has_params else 0) + attn.b_Q[head]
    k_all = qk.key_parts.sum(0)
    assert float(qk.query_contributions[-1]) == pytest.approx(
        float((q_bias @ k_all).detach()) / math.sqrt(model.cfg.d_head), abs=1e-4
    )
    return qk


def check_removals(model: GPT, qk: QKAttribution, n: int = 6) -> None:
    """The `n` largest terms of each side (and the smallest), each removed alone, by brute force."""
    layer, head, q, k = qk.layer, qk.head, qk.query_pos, qk.key_pos
    assert q != k
    for side, pos in (("query", q), ("key", k)):
        contrib = getattr(qk, f"{side}_contributions")[:-1]
        vectors = getattr(qk, f"{side}_vectors")
        order = contrib.abs().argsort(descending=True).tolist()
        for i in order[:n] + order[-1:]:
            change = qk.score - score_without(model, qk.tokens, layer, head, q, k, pos, vectors[i])
            assert change == pytest.approx(float(contrib[i]), abs=2e-4 * max(1.0, abs(qk.score))), (side, i)


def test_tiny_gpt2_split_sums_to_the_heads_score_and_each_term_is_its_removal() -> None:
    model, tcs = tiny_gpt2()
    tokens = induction_tokens()
    for layer, head, q, k in [(1, 0, 12, 5), (1, 2, 16, 0), (0, 0, 7, 6), (1, 3, 9, 9)]:
        qk = check_split(model, tokens, tcs, layer, head, q, k)
        if q != k:
            check_removals(model, qk)


def test_tiny_gpt2_with_layer_norm_weights_unfolded() -> None:
    """ln1's w and b kept (fold_ln=False): the transcoders are converted exactly, and ln1's b is the bias term's.
    (Wholly raw weights have uncentred MLP outputs, which the shipped transcoders refuse.)"""
    from interp_gpt.sae.training import shipped_transcoders

    model = GPT.from_pretrained("tiny-gpt2", fold_ln=False)
    tcs = shipped_transcoders(model)
    assert model.blocks[1].ln1.has_params
    qk = check_split(model, induction_tokens(), tcs, 1, 0, 12, 5)
    check_removals(model, qk)


@pytest.mark.parametrize("norm", ["LN", "LNPre"])
@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_random_model_split_and_removals(tiny_model: GPT, norm: str, kind: str) -> None:
    cfg = tiny_model.cfg
    if norm != "LN":
        model = GPT(Config(**{**cfg.__dict__, "normalization_type": norm}))
        model.load_state_dict(tiny_model.state_dict(), strict=False)
        model.eval()
    else:
        model = tiny_model
    tcs = plts(cfg.d_model, cfg.n_layers, skip=True) if kind == "plt" else a_clt(cfg.d_model, cfg.n_layers, True)
    for head, q, k in [(1, 9, 3), (3, 5, 0)]:
        qk = check_split(model, TOKENS, tcs, 1, head, q, k)
        check_removals(model, qk, n=4)


def test_split_qkv_input_and_a_graph_as_the_prompt(tiny_cfg: Config, tiny_model: GPT) -> None:
    """With use_split_qkv_input ln1's scale is per head; an AttributionGraph gives its own tokens."""
    from interp_gpt.attribution import attribute

    tiny_cfg.use_split_qkv_input = True
    model = GPT(tiny_cfg)
    model.load_state_dict(tiny_model.state_dict())
    model.eval()
    tcs = plts(tiny_cfg.d_model, tiny_cfg.n_layers, skip=False)
    qk = check_split(model, TOKENS, tcs, 1, 2, 8, 4)
    check_removals(model, qk, n=3)
    graph = attribute(model, TOKENS, tcs, max_n_logits=1)
    again = qk_attribution(model, graph, tcs, 1, 2, 8, 4)
    torch.testing.assert_close(again.matrix, qk.matrix)


def test_induction_head_key_side_comes_from_layer_0() -> None:
    """Measured on tiny-gpt2 (seed 0: 8 random tokens twice): for every second occurrence (query 9..16), the
    induction head L1H0's score at the token after the first occurrence (key = query - 7) is 10..15, and
    the key side's layer-0 terms (previous-token head L0H0 and the other layer-0 heads, MLP-0's features,
    skip, bias and error) contribute at least 90% of it; that layer-0 contribution, and L0H0's alone, are
    larger there than at any other key of the same query."""
    model, tcs = tiny_gpt2()
    tokens = induction_tokens()
    for q in range(9, 17):
        layer0, prev_head = {}, {}
        for k in range(1, q + 1):
            qk = qk_attribution(model, tokens, tcs, 1, 0, q, k)
            kc = qk.key_contributions
            layer0[k] = float(sum(kc[i] for i, t in enumerate(qk.key_terms) if t.layer == 0))
            prev_head[k] = float(kc[qk.key_terms.index(QKTerm("head", 0, 0))])
            if k == q - 7:
                score = qk.score
        ind = q - 7
        assert score > 9 and layer0[ind] >= 0.9 * score, (q, score, layer0[ind])
        assert layer0[ind] > max(v for k, v in layer0.items() if k != ind), q
        assert prev_head[ind] > max(v for k, v in prev_head.items() if k != ind), q
        assert prev_head[ind] > 1.0


def test_the_docstring_example_runs() -> None:
    module = importlib.import_module("interp_gpt.attribution.qk")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = doctest.DocTestFinder(recurse=False).find(module)
    assert sum(len(t.examples) for t in tests) >= 7
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
