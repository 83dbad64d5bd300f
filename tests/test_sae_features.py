"""Feature reports: top contexts, histogram values and logit effects against independent computations;
the terminal view, the page's escaping, `interp-gpt features`, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from interp_gpt.cli import main
from interp_gpt.loading import from_pretrained
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.features import feature_figures, feature_logits, feature_page, feature_report, format_feature

HOOK = "blocks.1.hook_resid_pre"
HOSTILE = "<script>alert(1)</script> and <img src=x onerror=alert(2)> & <b>bold</b>"


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module")
def sae(model) -> SAE:  # type: ignore[no-untyped-def]
    s = SAE(SAEConfig(d_in=model.cfg.d_model, d_sae=64, metadata={"hook_name": HOOK}))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        s.W_enc.copy_(torch.randn(s.W_enc.shape, generator=g) * 0.3)
        s.W_dec.copy_(torch.randn(s.W_dec.shape, generator=g) * 0.3)
        s.b_enc.fill_(-0.5)
    return s


@pytest.fixture(scope="module")
def tokens(model) -> torch.Tensor:  # type: ignore[no-untyped-def]
    text = "The king and the queen walked out. " + HOSTILE + " Then the king said: to be, or not to be."
    ids = model.to_tokens(text)[0]
    return torch.stack([ids[:24], ids[-24:], ids[10:34]])


def test_report_matches_an_independent_computation(model, sae, tokens) -> None:  # type: ignore[no-untyped-def]
    f = 5
    report = feature_report(model, sae, tokens, f, n_contexts=4, before=3, after=2, n_logits=5, batch_size=2)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        x = cache[HOOK]
        acts = torch.relu((x - sae.b_dec) @ sae.W_enc[:, f] + sae.b_enc[f])  # [3, 24]
        logits = sae.W_dec[f] @ model.W_U
    assert (acts > 0).sum() >= 4, "the test SAE's feature should fire on a few tokens"
    assert sorted(report.activations.tolist()) == pytest.approx(sorted(acts[acts > 0].tolist()), rel=1e-5, abs=1e-5)
    assert report.n_tokens == tokens.numel()
    want = acts.flatten().topk(4)
    assert [c["max_act"] for c in report.contexts] == pytest.approx(want.values.tolist(), rel=1e-5, abs=1e-5)
    for c, idx in zip(report.contexts, want.indices.tolist(), strict=True):
        row, pos = divmod(idx, tokens.shape[1])
        assert c["window"] == (row, pos)
        lo = max(0, pos - 3)
        assert c["tokens"] == model.to_str_tokens(tokens[row, lo : pos + 3], prepend_bos=False)
        assert c["acts"][c["pos"]] == pytest.approx(c["max_act"])
        assert c["acts"] == pytest.approx(acts[row, lo : pos + 3].tolist(), rel=1e-5, abs=1e-5)
    assert [v for _, v in report.promoted] == pytest.approx(logits.topk(5).values.tolist(), rel=1e-5, abs=1e-5)
    assert [v for _, v in report.suppressed] == pytest.approx((-(-logits).topk(5).values).tolist(), rel=1e-5, abs=1e-5)
    top_id = int(logits.argmax())
    assert report.promoted[0][0] == model.to_str_tokens(torch.tensor([top_id]), prepend_bos=False)[0]
    torch.testing.assert_close(feature_logits(model, sae, f), logits)


def test_text_view_and_figures(model, sae, tokens) -> None:  # type: ignore[no-untyped-def]
    report = feature_report(model, sae, tokens, 5, n_contexts=3)
    text = format_feature(report)
    assert f"feature 5 at {HOOK}" in text
    assert text.count("]]{") == len(report.contexts) == 3
    assert "promotes (W_dec @ W_U)" in text and "suppresses" in text
    top = report.contexts[0]
    assert f"[[{repr(top['tokens'][top['pos']])[1:-1]}]]{{{top['max_act']:.2f}}}" in text
    figs = feature_figures(report)
    assert sorted(figs["histogram"].data[0].x) == pytest.approx(sorted(report.activations.tolist()))
    assert len(figs["logits"].data[0].x) == len(report.promoted) + len(report.suppressed)


def test_page_escapes_token_text_and_loads_nothing(model, sae, tokens, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    report = feature_report(model, sae, tokens, 5, n_contexts=8, before=30, after=30)
    # make sure markup-looking tokens are in the contexts: put the hostile text's tokens in them
    report.contexts[0]["tokens"] = ["<script>", "alert(1)", "</script>", "<b>", "&"]
    report.contexts[0]["acts"] = [0.0, 1.0, 0.0, 0.5, 0.0]
    report.contexts[0]["pos"] = 1
    page = feature_page(report, tmp_path / "f.html").read_text(encoding="utf-8")
    body = page.split("<body>", 1)[1]
    assert "<script>alert" not in body and "<b>" not in body.split('<div id="histogram">')[0]
    assert "&lt;script&gt;" in body and "&amp;" in body
    assert 'http-equiv="Content-Security-Policy"' in page and "default-src 'none'" in page
    assert not re.search(r"<script[^>]+src=", page)  # plotly.js inline, no CDN


def test_bad_input_is_refused_by_name(model, sae, tokens) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"feature=64 is out of range: features are 0\.\.63"):
        feature_report(model, sae, tokens, 64)
    with pytest.raises(ValueError, match="tokens"):
        feature_report(model, sae, tokens[0], 1)
    other = SAE(SAEConfig(d_in=model.cfg.d_model, d_sae=8, metadata={"hook_name": "blocks.9.hook_resid_pre"}))
    with pytest.raises(KeyError, match="blocks.9"):
        feature_report(model, other, tokens, 1)


def test_features_command(model, sae, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    sae.save_model(tmp_path / "sae")
    text = tmp_path / "t.txt"
    text.write_text(("The king and the queen walked out, and the king spoke. " * 40), encoding="utf-8")
    rc = main(["features", "tiny-gpt2", str(tmp_path / "sae"), "--feature", "5", "--data", str(text),
               "--html", str(tmp_path / "f.html")])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "feature 5 at blocks.1.hook_resid_pre" in out and "promotes" in out
    assert (tmp_path / "f.html").is_file()
    rc = main(["features", "tiny-gpt2", str(tmp_path / "sae"), "--feature", "99", "--data", str(text)])
    out, err = capsys.readouterr()
    assert rc == 2 and "feature=99 is out of range" in err and err.count("\n") == 1
    rc = main(["features", "tiny-gpt2", str(tmp_path / "nope"), "--feature", "1", "--data", str(text)])
    assert rc == 2 and "nope" in capsys.readouterr().err


# ----------------------------------------------------------------------------
# The logit effect at hooks off the residual stream (issue 25, item 6): against the change one unit of
# the feature makes to what the layer writes into the residual stream, read by plain hooks
# ----------------------------------------------------------------------------
LOGIT_CASES = {
    # name: (hook, where the layer's output is read, SAE config, head of a per-head SAE)
    "hook_z, all heads": ("blocks.1.attn.hook_z", "blocks.1.hook_attn_out", dict(d_in=64, reshape_activations="hook_z"), None),
    "hook_z, head 2": ("blocks.0.attn.hook_z", "blocks.0.hook_attn_out", dict(d_in=16), 2),
    "mlp.hook_post": ("blocks.0.mlp.hook_post", "blocks.0.hook_mlp_out", dict(d_in=256), None),
    "resid, topk rescaled": (
        "blocks.1.hook_resid_mid",
        "blocks.1.hook_resid_mid.hook_sae_output",
        dict(d_in=64, architecture="topk", k=4, rescale_acts_by_decoder_norm=True),
        None,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def toy():  # type: ignore[no-untyped-def]
    from interp_gpt import GPT, Config

    torch.manual_seed(0)
    return GPT(Config(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=32)).eval()


def _logit_change_of_one_unit(model, sae, f: int, out_hook: str, head: int | None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """[batch, pos, d_vocab]: (what the layer writes with feature f's activation + 1) - (as is), @ W_U."""
    tokens = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))

    def bump(acts: torch.Tensor, hook) -> torch.Tensor:  # type: ignore[no-untyped-def]
        acts = acts.clone()
        if head is None:
            acts[..., f] += 1.0
        else:
            acts[..., head, f] += 1.0
        return acts

    with model.saes([sae], use_error_term=True), torch.no_grad():
        _, base = model.run_with_cache(tokens, names_filter=[out_hook])
        with model.hooks(fwd_hooks=[(f"{sae.cfg.hook_name}.hook_sae_acts_post", bump)]):
            _, bumped = model.run_with_cache(tokens, names_filter=[out_hook])
        return (bumped[out_hook] - base[out_hook]) @ model.W_U


@pytest.mark.parametrize("case", list(LOGIT_CASES))
def test_feature_logits_are_the_direct_effect_of_one_unit_of_the_feature(toy, case: str) -> None:  # type: ignore[no-untyped-def]
    hook, out_hook, kw, head = LOGIT_CASES[case]
    meta = {"hook_name": hook} | ({"hook_head_index": head} if head is not None else {})
    sae = SAE(SAEConfig(d_sae=32, metadata=meta, **kw))  # type: ignore[arg-type]
    sae.init_weights(seed=1)
    with torch.no_grad():
        sae.W_dec.mul_(3.0)  # rows of norm far from 1, so a missing rescale shows
    f = 5
    want = _logit_change_of_one_unit(toy, sae, f, out_hook, head)  # the same at every position
    got = feature_logits(toy, sae, f)
    for row in want.flatten(0, 1):
        torch.testing.assert_close(got, row, rtol=1e-4, atol=1e-4)
    tokens = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(4))
    report = feature_report(toy, sae, tokens, f, n_logits=5)
    assert [v for _, v in report.promoted] == pytest.approx(want[0, 0].topk(5).values.tolist(), rel=1e-4, abs=1e-4)


def test_hook_z_logits_by_hand(toy) -> None:  # type: ignore[no-untyped-def]
    """W_dec[f] as [n_heads, d_head], through each head's W_O, then W_U: einsum written out."""
    sae = SAE(
        SAEConfig(d_in=64, d_sae=32, reshape_activations="hook_z", metadata={"hook_name": "blocks.1.attn.hook_z"})
    )
    sae.init_weights(seed=2)
    with torch.no_grad():
        row = sae.W_dec[7].reshape(4, 16)  # [head, d_head], head-major as z.flatten(-2)
        want = torch.einsum("hd,hdm,mv->v", row, toy.blocks[1].attn.W_O, toy.W_U)
        wrong = sae.W_dec[7] @ toy.W_U  # the old answer: decoder rows read as residual directions
    torch.testing.assert_close(feature_logits(toy, sae, 7), want, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(want, wrong, atol=1e-3)


def test_a_normalising_hook_z_sae_writes_its_logits_direction_up_to_a_positive_factor(toy) -> None:  # type: ignore[no-untyped-def]
    sae = SAE(
        SAEConfig(
            d_in=64, d_sae=32, reshape_activations="hook_z", normalize_activations="layer_norm",
            metadata={"hook_name": "blocks.0.attn.hook_z"},
        )
    )  # fmt: skip
    sae.init_weights(seed=3)
    want = _logit_change_of_one_unit(toy, sae, 4, "blocks.0.hook_attn_out", None).flatten(0, 1)
    got = feature_logits(toy, sae, 4)
    cos = torch.nn.functional.cosine_similarity(want, got[None], dim=-1)
    assert torch.all(cos > 1 - 1e-5), cos
