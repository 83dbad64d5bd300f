"""interp_gpt.plots: every figure's data checked against the cache, axes labelled with the
tokens, token text escaped, bad input refused clearly. (The viewer page in a real browser:
tests/test_viewer_browser.py.)"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import pytest
import torch

from interp_gpt import GPT, plots
from interp_gpt import inspect as ins
from interp_gpt.tokenizer import gpt2_tokenizer

# Seven tokens for tiny_tokens' seven positions: whitespace, duplicates and markup.
STR_TOKENS = ["<|endoftext|>", " the", "the", "\n", " the", "<b>x</b>", "$x$"]


@pytest.fixture
def cached(tiny_model: GPT, tiny_tokens: torch.Tensor) -> tuple[torch.Tensor, Any]:
    return tiny_model.run_with_cache(tiny_tokens)


def shown(labels: list[str]) -> list[str]:
    """What plotly displays for the escaped labels we give it."""
    return [html.unescape(x) for x in labels]


def axes(fig: go.Figure) -> dict[str, Any]:
    layout = fig.layout.to_plotly_json()
    return {k: v for k, v in layout.items() if k.startswith(("xaxis", "yaxis"))}


def assert_every_axis_titled(fig: go.Figure) -> None:
    for name, axis in axes(fig).items():
        assert axis.get("title", {}).get("text"), f"{name} has no title"


def positions(str_tokens: list[str]) -> list[str]:
    """The cells of a token axis: position and token, so repeats stay distinct."""
    return [f"{i}: {label}" for i, label in enumerate(plots.token_labels(str_tokens))]


def assert_token_axis(axis: dict[str, Any], str_tokens: list[str]) -> None:
    assert axis["type"] == "category"
    assert shown(axis["tickvals"]) == positions(str_tokens)
    assert shown(axis["ticktext"]) == plots.token_labels(str_tokens)


def values(z: Any) -> torch.Tensor:
    return torch.tensor([[float("nan") if v is None else v for v in row] for row in z], dtype=torch.float64)


# ----------------------------------------------------------------------------
# token labels
# ----------------------------------------------------------------------------
def test_token_labels_keep_whitespace_and_duplicates_distinct() -> None:
    labels = plots.token_labels([" the", "the", "\n", "\n\n", "\t", " ", "", "a\x00", "\u200b", " the", "\r\n"])
    assert labels == ["␣the", "the", "↵", "↵↵", "⇥", "␣", "∅", "a\\x00", "\\u200b", "␣the", "␍↵"]
    assert labels[0] != labels[1] and labels.count("␣the") == 2  # a repeat keeps its own entry
    with pytest.raises(TypeError, match="str_tokens must be a list of strings"):
        plots.token_labels("the cat")
    with pytest.raises(TypeError, match=r"str_tokens\[1\] must be a str, got int"):
        plots.token_labels(["a", 3])


def test_token_labels_of_real_gpt2_tokens(gpt2_vocab_dir: Path) -> None:
    tok = gpt2_tokenizer(gpt2_vocab_dir)
    str_tokens = tok.decode_each(tok.encode("The cat\n\tthe cat"))
    assert str_tokens == ["The", " cat", "\n", "\t", "the", " cat"]
    assert plots.token_labels(str_tokens) == ["The", "␣cat", "↵", "⇥", "the", "␣cat"]


# ----------------------------------------------------------------------------
# attention
# ----------------------------------------------------------------------------
def test_attention_heatmap_matches_the_cache(cached: tuple[torch.Tensor, Any]) -> None:
    _, cache = cached
    fig = plots.attention_heatmap(cache, STR_TOKENS, layer=1, head=2, batch=1)
    (trace,) = fig.data
    torch.testing.assert_close(values(trace.z), cache["pattern", 1][1, 2].double())
    assert shown(trace.x) == positions(STR_TOKENS) and shown(trace.y) == positions(STR_TOKENS)
    assert_token_axis(axes(fig)["xaxis"], STR_TOKENS)
    assert_token_axis(axes(fig)["yaxis"], STR_TOKENS)
    assert_every_axis_titled(fig)
    assert "layer 1, head 2" in fig.layout.title.text
    assert (trace.zmin, trace.zmax) == (0.0, 1.0)
    # hover: both cells (position and token), and the probability
    assert trace.hovertemplate.startswith("query %{y}<br>key %{x}<br>attention %{z:.3f}")
    # the same picture from the pattern tensor, at every rank it comes in
    pattern = cache["pattern", 1]
    for source, kw in [(pattern, dict(batch=1, head=2)), (pattern[1], dict(head=2)), (pattern[1, 2], {})]:
        again = plots.attention_heatmap(source, STR_TOKENS, **kw)
        torch.testing.assert_close(values(again.data[0].z), pattern[1, 2].double())


def test_markup_in_tokens_is_escaped(cached: tuple[torch.Tensor, Any]) -> None:
    _, cache = cached
    fig = plots.attention_heatmap(cache, STR_TOKENS, layer=0, head=0)
    ticktext = list(fig.layout.xaxis.ticktext)
    assert ticktext[5] == "&lt;b&gt;x&lt;/b&gt;"  # shown as "<b>x</b>", never bold
    assert ticktext[6] == "&#36;x&#36;"  # never typeset as TeX
    assert all("<" not in t for t in ticktext)


def test_attention_grid_has_every_head(cached: tuple[torch.Tensor, Any], tiny_model: GPT) -> None:
    _, cache = cached
    fig = plots.attention_grid(cache, STR_TOKENS, layer=0)
    assert len(fig.data) == tiny_model.cfg.n_heads
    for h, trace in enumerate(fig.data):
        torch.testing.assert_close(values(trace.z), cache["pattern", 0][0, h].double())
    assert len(axes(fig)) == 2 * tiny_model.cfg.n_heads
    for axis in axes(fig).values():
        assert_token_axis(axis, STR_TOKENS)
    assert_every_axis_titled(fig)
    assert [a.text for a in fig.layout.annotations] == [f"head {h}" for h in range(4)]


def test_attention_viewer_holds_every_head_and_its_menus(cached: tuple[torch.Tensor, Any], tiny_model: GPT) -> None:
    _, cache = cached
    n_layers, n_heads = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads
    fig = plots.attention_viewer(cache, STR_TOKENS, batch=1, layer=1, head=3)
    assert [t.name for t in fig.data] == [f"L{L}H{h}" for L in range(n_layers) for h in range(n_heads)]
    for i, trace in enumerate(fig.data):
        L, h = divmod(i, n_heads)
        torch.testing.assert_close(values(trace.z), cache["pattern", L][1, h].double())
        assert trace.visible == (L == 1) and trace.opacity == (1.0 if h == 3 else 0.0)
    layer_menu, head_menu = fig.layout.updatemenus
    assert (layer_menu.active, head_menu.active) == (1, 3)
    assert [b.label for b in layer_menu.buttons] == ["layer 0", "layer 1"]
    assert [b.label for b in head_menu.buttons] == [f"head {h}" for h in range(n_heads)]
    # "layer 0" shows layer 0's traces; "head 2" makes head 2 of every layer the opaque one
    assert layer_menu.buttons[0].args[0]["visible"] == [i < n_heads for i in range(n_layers * n_heads)]
    assert head_menu.buttons[2].args[0]["opacity"] == [
        1.0 if i % n_heads == 2 else 0.0 for i in range(n_layers * n_heads)
    ]
    assert_token_axis(axes(fig)["xaxis"], STR_TOKENS)
    assert_token_axis(axes(fig)["yaxis"], STR_TOKENS)
    assert_every_axis_titled(fig)
    # the same from a stack of patterns [layer, batch, head, q, k]
    again = plots.attention_viewer(ins.stack_patterns(cache), STR_TOKENS, batch=1)
    torch.testing.assert_close(values(again.data[5].z), cache["pattern", 1][1, 1].double())


def test_saved_page_is_self_contained(cached: tuple[torch.Tensor, Any], tmp_path: Path) -> None:
    """plotly.js is inside, nothing is fetched, tokens are escaped (the browser test opens it)."""
    _, cache = cached
    hostile = ["<script>alert(1)</script>", " the", "the", "\n", " the", "<img src=x onerror=alert(2)>", "x"]
    page = plots.save_html(plots.attention_viewer(cache, hostile), tmp_path / "viewer.html")
    text = page.read_text(encoding="utf-8")
    assert "Plotly.newPlot" in text and len(text) > 1_000_000  # plotly.js itself is embedded
    assert "<script src" not in text.lower() and "<link" not in text.lower()
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert hostile[0] not in text and hostile[5] not in text
    with pytest.raises(TypeError, match="fig must be a plotly Figure"):
        plots.save_html({"data": []}, tmp_path / "x.html")


def test_attention_bad_input(cached: tuple[torch.Tensor, Any]) -> None:
    _, cache = cached
    with pytest.raises(ValueError, match=r"layer=2 is out of range: layers of this 2-layer model are 0..1"):
        plots.attention_heatmap(cache, STR_TOKENS, layer=2, head=0)
    with pytest.raises(ValueError, match=r"head=4 is out of range: the 4 heads are 0..3"):
        plots.attention_heatmap(cache, STR_TOKENS, layer=0, head=4)
    with pytest.raises(ValueError, match=r"head=-5 is out of range"):
        plots.attention_viewer(cache, STR_TOKENS, head=-5)
    with pytest.raises(ValueError, match=r"the pattern has 4 heads; pass head=0..3"):
        plots.attention_heatmap(cache, STR_TOKENS, layer=0)
    with pytest.raises(ValueError, match=r"layer is required with a cache"):
        plots.attention_grid(cache, STR_TOKENS)
    with pytest.raises(ValueError, match=r"pattern must have rank 2, 3 or 4 .* got rank 5 \(shape \(2, 2, 4, 7, 7\)\)"):
        plots.attention_heatmap(torch.rand(2, 2, 4, 7, 7), STR_TOKENS, head=0)
    with pytest.raises(ValueError, match=r"patterns must have rank 3, 4 or 5 .* got rank 2"):
        plots.attention_viewer(torch.rand(7, 7), STR_TOKENS)
    with pytest.raises(ValueError, match=r"as many keys as queries, got shape \(4, 7, 6\)"):
        plots.attention_heatmap(torch.rand(4, 7, 6), STR_TOKENS, head=0)
    with pytest.raises(
        ValueError, match=r"str_tokens has 6 tokens, but the pattern \(shape \(7, 7\)\) has 7 positions"
    ):
        plots.attention_heatmap(cache, STR_TOKENS[:6], layer=0, head=0)
    with pytest.raises(ValueError, match=r"str_tokens has 8 tokens, but the patterns .* has 7 positions"):
        plots.attention_viewer(cache, STR_TOKENS + ["x"])
    with pytest.raises(TypeError, match="str_tokens must be a list of strings"):
        plots.attention_grid(cache, "the cat", layer=0)
    with pytest.raises(ValueError, match=r"batch=2 is out of range: the 2 prompts are 0..1"):
        plots.attention_grid(cache, STR_TOKENS, layer=0, batch=2)
    with pytest.raises(TypeError, match="expected an ActivationCache or an attention-pattern tensor, got list"):
        plots.attention_heatmap([[1.0]], ["a"])


# ----------------------------------------------------------------------------
# head scores and patching
# ----------------------------------------------------------------------------
def test_head_scores_heatmap() -> None:
    model = ins.planted_heads_model()
    scores = ins.head_scores(model, seq_len=8, batch_size=2)
    fig = plots.head_scores_heatmap(scores)
    assert [a.text for a in fig.layout.annotations] == list(scores)
    for trace, s in zip(fig.data, scores.values(), strict=True):
        torch.testing.assert_close(values(trace.z), s.double())
        assert trace.texttemplate == "%{z:.2f}"  # the values are written in the cells
    for name, axis in axes(fig).items():
        assert axis["title"]["text"] == ("head" if name.startswith("x") else "layer")
        assert axis["ticktext"] == [str(i) for i in range(len(axis["tickvals"]))]
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (0.0, 1.0)
    one = plots.head_scores_heatmap(scores["induction"], title="Induction")
    assert len(one.data) == 1 and one.layout.title.text == "Induction"
    with pytest.raises(
        ValueError, match=r"scores must have rank 2 or 3 \(\[n_layers, n_heads\].*got rank 1 \(shape \(5,\)\)"
    ):
        plots.head_scores_heatmap(torch.rand(5))
    with pytest.raises(ValueError, match="same \\[n_layers, n_heads\\] shape"):
        plots.head_scores_heatmap({"a": torch.rand(2, 4), "b": torch.rand(3, 4)})


def test_patching_heatmaps(cached: tuple[torch.Tensor, Any]) -> None:
    results = torch.randn(2, 7, generator=torch.Generator().manual_seed(0))
    fig = plots.patching_heatmap(results, STR_TOKENS, value_label="logit diff recovered")
    torch.testing.assert_close(values(fig.data[0].z), results.double())
    assert_token_axis(axes(fig)["xaxis"], STR_TOKENS)
    assert axes(fig)["yaxis"]["title"]["text"] == "layer"
    assert fig.layout.coloraxis.cmid == 0.0 and fig.layout.coloraxis.cmax == pytest.approx(float(results.abs().max()))
    assert fig.layout.coloraxis.colorbar.title.text == "logit diff recovered"
    stack = torch.randn(3, 2, 7)
    three = plots.patching_heatmap(stack, STR_TOKENS, titles=["resid_pre", "attn_out", "mlp_out"])
    assert [a.text for a in three.layout.annotations] == ["resid_pre", "attn_out", "mlp_out"]
    for i, trace in enumerate(three.data):
        torch.testing.assert_close(values(trace.z), stack[i].double())
    assert_every_axis_titled(three)

    heads = torch.randn(2, 4)
    fig = plots.head_patching_heatmap(heads)
    torch.testing.assert_close(values(fig.data[0].z), heads.double())
    assert [axes(fig)[k]["title"]["text"] for k in ("xaxis", "yaxis")] == ["head", "layer"]
    with pytest.raises(ValueError, match=r"str_tokens has 7 tokens, but results \(shape \(2, 6\)\) has 6 positions"):
        plots.patching_heatmap(torch.randn(2, 6), STR_TOKENS)
    with pytest.raises(ValueError, match=r"titles has 2 entries for 3 panels"):
        plots.patching_heatmap(stack, STR_TOKENS, titles=["a", "b"])
    with pytest.raises(
        ValueError, match=r"results must have rank 2 or 3 \(\[n_layers, n_heads\].*got rank 4 \(shape \(1, 2, 3, 4\)\)"
    ):
        plots.head_patching_heatmap(torch.randn(1, 2, 3, 4))


# ----------------------------------------------------------------------------
# the residual stream
# ----------------------------------------------------------------------------
def test_logit_lens_heatmap(cached: tuple[torch.Tensor, Any]) -> None:
    _, cache = cached
    fig = plots.logit_lens_heatmap(cache, STR_TOKENS, batch=1)
    lens, labels = ins.logit_lens(cache, batch=1)
    top_probs, top_ids = lens.softmax(-1).max(-1)
    (trace,) = fig.data
    torch.testing.assert_close(values(trace.z), top_probs.double())
    assert [list(row) for row in trace.text] == [[f"#{i}" for i in row] for row in top_ids.tolist()]  # no tokenizer
    assert_token_axis(axes(fig)["xaxis"], STR_TOKENS)
    assert list(axes(fig)["yaxis"]["ticktext"]) == labels
    assert_every_axis_titled(fig)


def test_logit_lens_heatmap_through_a_tuned_lens(cached: tuple[torch.Tensor, Any], tiny_tokens: torch.Tensor) -> None:
    """Each resid_pre row read through the lens's translator, the last row the model's own output; a lens
    at zero (its initial state) draws the logit lens exactly."""
    from interp_gpt.lenses import TunedLens

    _, cache = cached
    tokens = tiny_tokens
    lens = TunedLens.from_model(cache.model)
    plain = plots.logit_lens_heatmap(cache, STR_TOKENS, batch=1)
    torch.testing.assert_close(
        values(plots.logit_lens_heatmap(cache, STR_TOKENS, batch=1, lens=lens).data[0].z), values(plain.data[0].z)
    )
    with torch.no_grad():
        for layer in lens:
            layer.weight.normal_(0, 0.2)
            layer.bias.normal_(0, 0.5)
    fig = plots.logit_lens_heatmap(cache, STR_TOKENS, batch=1, lens=lens)
    with torch.no_grad():
        expected = torch.cat([lens.forward_all(tokens)[:, 1], ins.logit_lens(cache, batch=1)[0][-1:]])
    top_probs, top_ids = expected.softmax(-1).max(-1)
    torch.testing.assert_close(values(fig.data[0].z), top_probs.double())
    assert [list(row) for row in fig.data[0].text] == [[f"#{i}" for i in row] for row in top_ids.tolist()]
    assert not torch.allclose(values(fig.data[0].z), values(plain.data[0].z))  # the translators moved it
    assert fig.layout.title.text.startswith("Tuned lens")
    with pytest.raises(ValueError, match=r"logit_lens_heatmap: incl_mid=True with a lens"):
        plots.logit_lens_heatmap(cache, STR_TOKENS, incl_mid=True, lens=lens)
    with pytest.raises(TypeError, match=r"lens=str: expected a TunedLens for this model's 2 layers"):
        plots.logit_lens_heatmap(cache, STR_TOKENS, lens="tuned")


def test_logit_lens_heatmap_names_tokens_with_a_tokenizer() -> None:
    model = ins.planted_heads_model()
    tokens = torch.tensor([[15, 0, 1, 2, 0, 1, 2]])
    _, cache = model.run_with_cache(tokens)
    fig = plots.logit_lens_heatmap(cache, model.to_str_tokens(tokens))
    assert list(fig.data[0].text[-1])[4:6] == ["b", "c"]  # the induction head predicts the repeat
    assert list(fig.data[0].customdata[-1])[0] == "&lt;|endoftext|&gt;"  # full names on hover, escaped


def test_answer_lens_and_norm_plots(cached: tuple[torch.Tensor, Any]) -> None:
    _, cache = cached
    fig = plots.answer_lens_plot(cache, 42, pos=3, batch=1)
    logits, probs, labels = ins.answer_lens(cache, 42, pos=3, batch=1)
    prob_trace, logit_trace = fig.data
    assert list(prob_trace.x) == labels
    torch.testing.assert_close(torch.tensor(prob_trace.y, dtype=torch.float64), probs.double())
    torch.testing.assert_close(torch.tensor(logit_trace.y, dtype=torch.float64), logits.double())
    assert_every_axis_titled(fig)

    fig = plots.resid_norm_heatmap(cache, STR_TOKENS, incl_mid=True)
    norms, labels = ins.resid_norms(cache, incl_mid=True)
    torch.testing.assert_close(values(fig.data[0].z), norms.double())
    assert list(axes(fig)["yaxis"]["ticktext"]) == labels
    assert_token_axis(axes(fig)["xaxis"], STR_TOKENS)
    assert_every_axis_titled(fig)


def test_dla_bar_and_accumulated_resid_plot(cached: tuple[torch.Tensor, Any]) -> None:
    logits, cache = cached
    logits = logits.detach()
    fig = plots.dla_bar(cache, 3, 7, batch=1)
    attrs, labels = ins.direct_logit_attribution(cache, 3, 7, batch=1)
    (bars,) = fig.data
    assert list(bars.x) == labels
    torch.testing.assert_close(torch.tensor(bars.y, dtype=torch.float64), attrs.double())
    assert sum(bars.y) == pytest.approx((logits[1, -1, 3] - logits[1, -1, 7]).item(), abs=1e-4)
    assert "logit(#3) - logit(#7)" in fig.layout.title.text
    assert_every_axis_titled(fig)

    fig = plots.accumulated_resid_plot(cache, 3, 7, prompt_labels=["first", "second"])
    diffs, labels = ins.accumulated_logit_diff(cache, 3, 7)
    assert [t.name for t in fig.data] == ["first", "second", "mean"]
    for b in range(2):
        assert list(fig.data[b].x) == labels
        torch.testing.assert_close(torch.tensor(fig.data[b].y, dtype=torch.float64), diffs[:, b].double())
    torch.testing.assert_close(torch.tensor(fig.data[2].y, dtype=torch.float64), diffs.mean(1).double())
    assert_every_axis_titled(fig)
    with pytest.raises(ValueError, match="prompt_labels has 1 entries for 2 prompts"):
        plots.accumulated_resid_plot(cache, 3, 7, prompt_labels=["only one"])
    with pytest.raises(TypeError, match=r"prompt_labels must be a list of strings.*got str"):
        plots.accumulated_resid_plot(cache, 3, 7, prompt_labels="first")


def test_patching_heatmaps_draw_the_patching_modules_results(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    patching = pytest.importorskip("interp_gpt.patching")
    clean, corrupted = tiny_tokens[:1], tiny_tokens[1:]
    _, clean_cache = tiny_model.run_with_cache(clean)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1, 3].mean() - logits[:, -1, 7].mean()

    by_pos = patching.get_act_patch_resid_pre(tiny_model, corrupted, clean_cache, metric, progress=False)
    fig = plots.patching_heatmap(by_pos, STR_TOKENS, value_label="logit(3) - logit(7)")
    torch.testing.assert_close(values(fig.data[0].z), by_pos.double())
    assert_token_axis(axes(fig)["xaxis"], STR_TOKENS)
    by_head = patching.get_act_patch_attn_head_out_all_pos(tiny_model, corrupted, clean_cache, metric, progress=False)
    fig = plots.head_patching_heatmap(by_head)
    torch.testing.assert_close(values(fig.data[0].z), by_head.double())
    assert len(axes(fig)["yaxis"]["tickvals"]) == tiny_model.cfg.n_layers
    assert len(axes(fig)["xaxis"]["tickvals"]) == tiny_model.cfg.n_heads
