"""Issue 36, third pass, the attribution tools: each defect class found by the outside reliability pass,
pinned by a test that fails without its fix (rows 6, 7, 8, 8d, 15, 21-27), and property tests of the
attribution edges and the interventions against brute force on random prompts."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from interp_gpt import GPT
from interp_gpt.attribution import attribute, feature_intervention, feature_intervention_generate, qk_attribution
from interp_gpt.sae.data import shipped_transcoders

PROMPT = "The cat sat on the mat"


@pytest.fixture(scope="module")
def tiny() -> GPT:
    return GPT.from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module")
def tcs(tiny: GPT) -> Any:
    return shipped_transcoders(tiny)


# ----------------------------------------------------------------------------------------------------
# row 6: a non-finite value tensor is refused as a non-finite number is
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_value_tensor_is_refused(tiny: GPT, tcs: Any, bad: float) -> None:
    for value in (torch.tensor(bad), torch.tensor([1.0, bad])):
        with pytest.raises(ValueError, match=r"feature_intervention: interventions\[1\]: value=.*non-finite"):
            feature_intervention(tiny, PROMPT, tcs, [(1, 3, 3, 1.0), (1, torch.tensor([2, 3]), 3, value)])
    with pytest.raises(ValueError, match=r"interventions\[0\]: value=.*non-finite"):
        feature_intervention_generate(tiny, PROMPT, tcs, [(1, 3, 3, torch.tensor(bad))], max_new_tokens=1)


# ----------------------------------------------------------------------------------------------------
# row 7: a target given twice is refused by name
# ----------------------------------------------------------------------------------------------------
def test_a_duplicate_target_is_refused(tiny: GPT, tcs: Any) -> None:
    for targets in ([5, 5, 7], torch.tensor([7, 5, 5]), [" the", "x", " the"]):
        with pytest.raises(
            ValueError, match=r"attribute: attribution_targets\[\d\] and attribution_targets\[\d\]: .*twice"
        ):
            attribute(tiny, PROMPT, tcs, attribution_targets=targets)
    graph = attribute(tiny, PROMPT, tcs, attribution_targets=[5, 7])
    assert [t.vocab_idx for t in graph.logit_targets] == [5, 7]


# ----------------------------------------------------------------------------------------------------
# row 8: qk_attribution splits the score the same way whatever the model's processing
# ----------------------------------------------------------------------------------------------------
def test_the_qk_split_does_not_depend_on_processing(tiny: GPT, tcs: Any) -> None:
    rand = torch.randint(100, 2000, (8,), generator=torch.Generator().manual_seed(0))
    tokens = torch.cat([rand, rand])
    models = [
        tiny,
        GPT.from_pretrained("tiny-gpt2", fold_ln=False),
        GPT.from_pretrained("tiny-gpt2", fold_ln=False, fold_value_biases=False),
    ]
    runs = [qk_attribution(m, tokens, tcs, layer=1, head=0, query_pos=12, key_pos=5) for m in models]
    ref = runs[0]
    for run in runs[1:]:
        assert run.score == pytest.approx(ref.score, rel=1e-5)
        for side in ("query", "key"):
            assert [t.label for t in getattr(run, f"{side}_terms")] == [t.label for t in getattr(ref, f"{side}_terms")]
            got, want = getattr(run, f"{side}_contributions"), getattr(ref, f"{side}_contributions")
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


# ----------------------------------------------------------------------------------------------------
# row 8d: without a tokenizer no BOS is put first, so position 0 (the prompt's first token) is kept
# ----------------------------------------------------------------------------------------------------
def test_without_a_tokenizer_position_0_is_a_real_token(tiny_model: GPT) -> None:
    from test_attribution import TOKENS, plts

    assert tiny_model.tokenizer is None
    tcs = plts(tiny_model.cfg.d_model, tiny_model.cfg.n_layers, skip=False)
    graph = attribute(tiny_model, TOKENS, tcs)
    assert torch.equal(graph.input_tokens, TOKENS)  # no BOS put first
    x0 = tiny_model.run_with_cache(TOKENS[None])[1]["blocks.0.ln2.hook_normalized"][0, 0]
    want = tcs[0].encode(x0).nonzero()[:, 0]
    at0 = graph.active_features[(graph.active_features[:, 0] == 0) & (graph.active_features[:, 1] == 0), 2]
    assert want.numel() > 0 and torch.equal(at0, want)  # the first token's layer-0 features are nodes
    error_0 = graph.n_features + 0 * graph.n_pos + 0  # the error node of layer 0 at position 0
    assert bool(graph.adjacency_matrix[:, error_0].ne(0).any())
    # the interventions read position 0 too: setting a feature there to its own reading changes nothing
    logits, acts = feature_intervention(tiny_model, TOKENS, tcs, [(0, 0, int(want[0]), 0.0)])
    assert acts is not None and float(acts[0, 0, want].abs().min()) > 0
    with torch.no_grad():
        clean = tiny_model(TOKENS[None])
    assert not torch.allclose(logits, clean, rtol=1e-4, atol=1e-4 * float(clean.abs().max()))


# ----------------------------------------------------------------------------------------------------
# row 15: the interventions take float32 transcoders on a float64 / bf16 model, as attribute does
# ----------------------------------------------------------------------------------------------------
def test_interventions_cast_the_transcoders_to_the_models_dtype(tiny: GPT, tcs: Any) -> None:
    ivs = [(1, -1, 3, 5.0), (0, 2, 7, 0.0)]
    want, want_acts = feature_intervention(tiny, PROMPT, tcs, ivs)
    m64 = GPT.from_pretrained("tiny-gpt2", dtype=torch.float64)
    got, acts = feature_intervention(m64, PROMPT, tcs, ivs)
    assert got.dtype == torch.float64 and all(tc.dtype == torch.float32 for tc in tcs)  # the caller's: unchanged
    scale = float(want.abs().max())
    torch.testing.assert_close(got.float(), want, rtol=1e-4, atol=1e-4 * scale)
    assert acts is not None and want_acts is not None
    torch.testing.assert_close(acts.float(), want_acts, rtol=1e-4, atol=1e-4 * float(want_acts.abs().max()))
    text, steps, _ = feature_intervention_generate(m64, PROMPT, tcs, ivs, max_new_tokens=2)
    assert steps.shape[0] == 2 and isinstance(text, str)
    bf16 = GPT.from_pretrained("tiny-gpt2", dtype=torch.bfloat16)
    low, _ = feature_intervention(bf16, PROMPT, tcs, ivs)
    assert low.dtype == torch.bfloat16 and bool(torch.isfinite(low).all())


# ----------------------------------------------------------------------------------------------------
# rows 21, 22: positions, features and values that do not pair up are refused by name, before any run
# ----------------------------------------------------------------------------------------------------
def test_positions_and_features_of_different_lengths_are_refused(tiny: GPT, tcs: Any) -> None:
    bad = (1, torch.tensor([2, 3]), torch.tensor([3, 4, 5]), 1.0)
    for run in (feature_intervention, feature_intervention_generate):
        kw = {"max_new_tokens": 1} if run is feature_intervention_generate else {}
        with pytest.raises(ValueError, match=r"interventions\[1\]: pos has 2 positions and .*feature 3 features"):
            run(tiny, PROMPT, tcs, [(1, 3, 3, 1.0), bad], **kw)
    # what does pair up still runs: equal lengths, one of length 1, a slice times features
    for pos, feat in ((torch.tensor([2, 3]), torch.tensor([4, 5])), (torch.tensor([2]), torch.tensor([4, 5])),
                      (slice(1, 4), torch.tensor([4, 5]))):  # fmt: skip
        feature_intervention(tiny, PROMPT, tcs, [(1, pos, feat, 2.0)])


@pytest.mark.parametrize(("pos", "feature"), [(2, 3), (torch.tensor([2, 3]), 3), (slice(1, 3), torch.tensor([4, 5]))])
def test_a_value_tensor_that_does_not_fit_its_places_is_refused(tiny: GPT, tcs: Any, pos: Any, feature: Any) -> None:
    value = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"interventions\[0\]: value=\[1.0, 2.0, 3.0\] has shape \(3,\); .*shape"):
        feature_intervention(tiny, PROMPT, tcs, [(1, pos, feature, value)])
    ok = torch.arange(1.0, 3.0) if isinstance(pos, Tensor) else torch.tensor(2.0)
    if isinstance(feature, Tensor):
        ok = torch.ones(2, 2)
    feature_intervention(tiny, PROMPT, tcs, [(1, pos, feature, ok)])


# ----------------------------------------------------------------------------------------------------
# row 23: a custom target's bad weight or direction is refused at attribute, by name
# ----------------------------------------------------------------------------------------------------
def test_a_custom_targets_bad_weight_or_direction_is_refused_up_front(tiny: GPT, tcs: Any) -> None:
    d = tiny.cfg.d_model
    good = ("good", 1.0, torch.randn(d, generator=torch.Generator().manual_seed(0)))
    for w in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match=r"attribute: attribution_targets\[1\]: weight=.*finite number >= 0"):
            attribute(tiny, PROMPT, tcs, attribution_targets=[good, ("x", w, torch.ones(d))])
    with pytest.raises(ValueError, match=r"attribute: attribution_targets\[1\]: direction holds a nan"):
        attribute(tiny, PROMPT, tcs, attribution_targets=[good, ("x", 1.0, torch.full((d,), float("nan")))])
    with pytest.raises(ValueError, match=r"attribute: attribution_targets: every weight is 0"):
        attribute(tiny, PROMPT, tcs, attribution_targets=[("x", 0.0, torch.ones(d))])
    graph = attribute(tiny, PROMPT, tcs, attribution_targets=[good, ("x", 0.0, torch.ones(d))])
    assert graph.logit_probabilities.tolist() == [1.0, 0.0]


# ----------------------------------------------------------------------------------------------------
# row 24: attribute runs under torch.inference_mode (and on token ids made in one): the same graph
# ----------------------------------------------------------------------------------------------------
def test_attribute_under_inference_mode_is_the_same_graph(tiny: GPT, tcs: Any) -> None:
    tokens = tiny.to_tokens(PROMPT)[0]
    want = attribute(tiny, tokens, tcs)
    with torch.inference_mode():
        inside = attribute(tiny, tokens, tcs)
        made_inside = tiny.to_tokens(PROMPT)[0]
    outside = attribute(tiny, made_inside, tcs)
    scale = float(want.adjacency_matrix.abs().max())
    for got in (inside, outside):
        assert torch.equal(got.active_features, want.active_features)
        torch.testing.assert_close(got.adjacency_matrix, want.adjacency_matrix, rtol=1e-6, atol=1e-6 * scale)
    assert attribute.__name__ == "attribute" and "attribution_targets" in attribute.__doc__


# ----------------------------------------------------------------------------------------------------
# rows 25, 27: generation with slice(n_prompt, None) steers the new tokens only; a per-prompt-position
# value on an open-ended slice is refused before generating
# ----------------------------------------------------------------------------------------------------
def steered_by_hooks(model: GPT, tcs: Any, tokens: torch.Tensor, layer: int, feature: int, value: float, start: int):
    """Plain hooks, no cache: the last position's logits of `tokens` with `feature` of layer `layer` set to
    `value` at every position >= `start` ((value - reading) x W_dec added to the MLP output, as the splice
    with its error term does)."""
    tc, xs = tcs[layer], {}

    def read(x, hook):  # type: ignore[no-untyped-def]
        xs["x"] = x

    def write(out, hook):  # type: ignore[no-untyped-def]
        reading = tc.encode(xs["x"])[0, start:, feature]
        out = out.clone()
        out[0, start:] += (value - reading)[:, None] * tc.W_dec[feature]
        return out

    hooks = [(tc.input_hook, read), (f"blocks.{layer}.hook_mlp_out", write)]
    with torch.no_grad():
        return model.run_with_hooks(tokens[None], fwd_hooks=hooks)[0, -1]


def test_generation_can_steer_only_the_new_tokens(tiny: GPT, tcs: Any) -> None:
    tokens = tiny.to_tokens(PROMPT)[0]
    n = tokens.shape[0]
    out, steps, _ = feature_intervention_generate(tiny, tokens, tcs, [(1, slice(n, None), 3, 8.0)], max_new_tokens=4)
    with torch.no_grad():
        clean = tiny(tokens[None])[0, -1]
    torch.testing.assert_close(
        steps[0], clean, rtol=1e-4, atol=1e-4 * float(clean.abs().max())
    )  # the prompt: untouched
    for s in range(1, 4):
        want = steered_by_hooks(tiny, tcs, out[0, : n + s], 1, 3, 8.0, n)
        torch.testing.assert_close(steps[s], want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))
    # from the second new token on: the first new token is not steered
    out2, steps2, _ = feature_intervention_generate(
        tiny, tokens, tcs, [(1, slice(n + 1, None), 3, 8.0)], max_new_tokens=3
    )
    with torch.no_grad():
        first = tiny(out2[:, : n + 1])[0, -1]
    torch.testing.assert_close(steps2[1], first, rtol=1e-4, atol=1e-4 * float(first.abs().max()))
    want = steered_by_hooks(tiny, tcs, out2[0, : n + 2], 1, 3, 8.0, n + 1)
    torch.testing.assert_close(steps2[2], want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))
    # a closed slice past the prompt still selects nothing: refused
    with pytest.raises(ValueError, match=r"interventions\[0\]: pos: slice\(.*selects none"):
        feature_intervention_generate(tiny, tokens, tcs, [(1, slice(n, n + 2), 3, 8.0)], max_new_tokens=2)


def test_a_per_position_value_on_an_open_ended_slice_is_refused_before_generating(tiny: GPT, tcs: Any) -> None:
    n = tiny.to_tokens(PROMPT).shape[1]
    value = torch.ones(n - 1)
    with pytest.raises(ValueError, match=r"interventions\[0\]: value has shape \(\d+,\); each new token's places"):
        feature_intervention_generate(tiny, PROMPT, tcs, [(1, slice(1, None), 3, value)], max_new_tokens=3)
    # a value per feature fits every new token: it runs
    feats = torch.tensor([3, 4])
    _, steps, _ = feature_intervention_generate(
        tiny, PROMPT, tcs, [(1, slice(1, None), feats, torch.tensor([2.0, 1.0]))], max_new_tokens=3
    )
    assert steps.shape[0] == 3


# ----------------------------------------------------------------------------------------------------
# row 26: qk_attribution on a model without LayerNorm (attribute runs on one)
# ----------------------------------------------------------------------------------------------------
def test_qk_attribution_on_a_model_without_layer_norm(tiny_cfg: Any) -> None:
    from test_attribution import plts

    tiny_cfg.normalization_type = None
    model = GPT(tiny_cfg)
    model.init_weights(seed=0)
    tcs = plts(tiny_cfg.d_model, tiny_cfg.n_layers, skip=True)
    for layer, tc in enumerate(tcs):
        tc.cfg.metadata["hook_name"] = f"blocks.{layer}.hook_resid_mid"
    tokens = torch.tensor([0, 5, 9, 17, 3, 42, 8, 61, 23, 7])
    attribute(model, tokens, tcs)  # runs
    qk = qk_attribution(model, tokens, tcs, layer=1, head=0, query_pos=8, key_pos=3)
    _, cache = model.run_with_cache(tokens[None])
    assert qk.score == pytest.approx(float(cache["blocks.1.attn.hook_attn_scores"][0, 0, 8, 3]), rel=1e-5)
    assert qk.total == pytest.approx(qk.score, rel=1e-4, abs=1e-4 * float(qk.matrix.abs().max()))


# ----------------------------------------------------------------------------------------------------
# the graph page opens at the logit end, and a redraw keeps the reader's scroll (headless Chromium)
# ----------------------------------------------------------------------------------------------------
LOGITS_IN_VIEW = (
    "(() => { const w = document.getElementById('graph-wrap').getBoundingClientRect();"
    " const xs = [...document.querySelectorAll('#graph .node.kind-logit')].map(g => g.getBoundingClientRect());"
    " return xs.length > 0 && xs.every(r => r.left >= w.left && r.right <= w.right); })()"
)


def slide(value: str) -> str:
    """JavaScript moving the node-threshold slider to `value`, as a person's input does."""
    return (
        f"(() => {{ const s = document.getElementById('node-threshold'); s.value = '{value}';"
        " s.dispatchEvent(new Event('input', {bubbles: true})); })()"
    )


def test_the_graph_page_opens_at_the_logit_end(tiny: GPT, tcs: Any, tmp_path: Any) -> None:
    from test_attribution_viewer_browser import open_page
    from test_viewer_browser import CHROMIUM, DevTools

    from interp_gpt.attribution import graph_page

    if CHROMIUM is None:
        pytest.skip("headless Chromium not found on PATH (Debian: apt-get install -y chromium)")
    prompt = "The quick brown fox jumps over the lazy dog, and then the dog chases the fox all the way back home again"
    page = graph_page(attribute(tiny, prompt, tcs), tmp_path / "graph.html", model=tiny)
    browser = DevTools(width=1400, height=1000)
    try:
        open_page(browser, page)
        wrap = "document.getElementById('graph-wrap')"
        width, view = browser.js(f"[{wrap}.scrollWidth, {wrap}.clientWidth]")
        assert width > view  # the graph is wider than the window: a scroll bar
        assert browser.js(f"{wrap}.scrollLeft") == pytest.approx(width - view, abs=2)  # at the logit end
        assert browser.js(LOGITS_IN_VIEW)
        # a redraw at the logit end stays there; scrolled elsewhere, it keeps its place
        browser.js(slide("0.7"))
        assert browser.js(LOGITS_IN_VIEW)
        browser.js(f"{wrap}.scrollLeft = 40")
        browser.js(slide("0.8"))
        assert browser.js(f"{wrap}.scrollLeft") == pytest.approx(40, abs=2)
    finally:
        browser.close()


# ----------------------------------------------------------------------------------------------------
# property tests on random prompts: every edge is the change in its target when its source is removed from
# the frozen replacement model (brute force); every intervention is what plain hooks give
# ----------------------------------------------------------------------------------------------------
def random_prompt(seed: int, d_vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(4, 14, (1,), generator=g))
    return torch.randint(0, d_vocab, (n,), generator=g)


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_edges_equal_brute_force_ablation_on_random_prompts(tiny_model: GPT, seed: int) -> None:
    from test_attribution import Frozen, a_clt, plts, target_rows

    d, n = tiny_model.cfg.d_model, tiny_model.cfg.n_layers
    tokens = random_prompt(seed, tiny_model.cfg.d_vocab)
    tcs = a_clt(d, n, skip=True) if seed % 2 else plts(d, n, skip=True, seed=seed)
    graph = attribute(tiny_model, tokens, tcs, batch_size=5)
    fz = Frozen(tiny_model, tokens, tcs)
    n_active, n_pos = graph.active_features.shape[0], graph.n_pos
    assert n_pos == tokens.shape[0] and n_active > 0
    clean = fz.targets(graph, *fz.run())
    rows = target_rows(graph)
    g = torch.Generator().manual_seed(seed)
    sources: list[tuple[int, dict]] = [
        (int(i), {"features": [tuple(graph.active_features[int(i)].tolist())]})
        for i in torch.randperm(n_active, generator=g)[:5]
    ]
    for _ in range(3):
        layer, pos = int(torch.randint(0, n, (1,), generator=g)), int(torch.randint(0, n_pos, (1,), generator=g))
        sources.append((n_active + layer * n_pos + pos, {"errors": [(layer, pos)]}))
    for pos in torch.randperm(n_pos, generator=g)[:3].tolist():
        sources.append((n_active + n * n_pos + pos, {"embeds": [pos]}))
    scale = float(graph.adjacency_matrix.abs().max())
    for node, removed in sources:
        brute = clean - fz.targets(graph, *fz.run(**removed))
        column = graph.adjacency_matrix[rows, node]
        torch.testing.assert_close(column, brute, rtol=1e-4, atol=1e-4 * scale, msg=f"source node {node}: {removed}")


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_interventions_equal_plain_hooks_on_random_prompts(tiny_model: GPT, seed: int, monkeypatch: Any) -> None:
    import test_attribution_intervention as reference_module
    from test_attribution import a_clt, plts

    d, n = tiny_model.cfg.d_model, tiny_model.cfg.n_layers
    tokens = random_prompt(seed, tiny_model.cfg.d_vocab)
    monkeypatch.setattr(reference_module, "TOKENS", tokens)  # the reference reads its prompt from there
    tcs = a_clt(d, n, skip=True) if seed % 2 else plts(d, n, skip=False, seed=seed)
    g = torch.Generator().manual_seed(seed)
    n_pos, d_sae = tokens.shape[0], 30
    ivs = []
    for _ in range(4):
        layer, pos = int(torch.randint(0, n, (1,), generator=g)), int(torch.randint(0, n_pos, (1,), generator=g))
        ivs.append(
            (layer, pos, int(torch.randint(0, d_sae, (1,), generator=g)), float(torch.randn(1, generator=g)) * 3)
        )
    ivs.append((1, slice(int(torch.randint(0, n_pos, (1,), generator=g)), None), 4, 0.0))
    for freeze in (True, False):
        want_logits, want_acts = reference_module.reference(tiny_model, tcs, ivs, freeze)
        logits, acts = feature_intervention(tiny_model, tokens, tcs, ivs, freeze_attention=freeze)
        assert acts is not None
        torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5 * float(want_logits.abs().max()))
        torch.testing.assert_close(acts, want_acts, rtol=1e-5, atol=1e-5 * float(want_acts.abs().max()))
