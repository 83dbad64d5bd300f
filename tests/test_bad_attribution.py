"""Bad input to `attribute` is refused at the boundary, by name, before any pass runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.attribution import attribute
from interp_gpt.sae import SAE, CLTConfig, CrossLayerTranscoder, SAEConfig, Transcoder, TranscoderConfig

TOKENS = torch.tensor([0, 5, 9, 17, 3])


def tc(
    layer: int, d_in: int = 64, d_out: int = 64, out_hook: str = "hook_mlp_out", in_hook: str = "ln2.hook_normalized"
) -> Transcoder:
    return Transcoder(
        TranscoderConfig(
            d_in=d_in, d_sae=16, d_out=d_out,
            metadata={"hook_name": f"blocks.{layer}.{in_hook}", "hook_name_out": f"blocks.{layer}.{out_hook}"},
        )
    )  # fmt: skip


def tcs() -> list[Transcoder]:
    return [tc(0), tc(1)]


def test_a_transcoder_whose_width_does_not_fit(tiny_model: GPT) -> None:
    with pytest.raises(ValueError, match=r"attribute: .*transcoders\[1\].*d_in=32.*d_model=64"):
        attribute(tiny_model, TOKENS, [tc(0), tc(1, d_in=32)])
    with pytest.raises(ValueError, match=r"attribute: .*transcoders\[0\].*d_out=48.*64"):
        attribute(tiny_model, TOKENS, [tc(0, d_out=48), tc(1)])
    clt = CrossLayerTranscoder(
        CLTConfig(n_layers=3, d_in=64, d_sae=8, d_out=64, metadata={"hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out"})
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"attribute: transcoders: a CLT over 3 layers; the model has 2"):
        attribute(tiny_model, TOKENS, clt)


def test_transcoders_missing_for_some_layers(tiny_model: GPT) -> None:
    with pytest.raises(ValueError, match=r"attribute: transcoders: none for layers \[0\]"):
        attribute(tiny_model, TOKENS, [tc(1)])
    with pytest.raises(ValueError, match=r"attribute: transcoders: none for layers \[1\]"):
        attribute(tiny_model, TOKENS, tc(0))
    with pytest.raises(ValueError, match=r"attribute: transcoders\[1\]: a second transcoder for layer 0"):
        attribute(tiny_model, TOKENS, [tc(0), tc(0)])
    with pytest.raises(TypeError, match=r"attribute: transcoders: expected a list of Transcoder.*got dict"):
        attribute(tiny_model, TOKENS, {0: tc(0), 1: tc(1)})  # type: ignore[arg-type]


def test_transcoders_that_replace_no_mlp(tiny_model: GPT) -> None:
    with pytest.raises(ValueError, match=r"attribute: the transcoder of layer 1 writes 'blocks.1.hook_attn_out'"):
        attribute(tiny_model, TOKENS, [tc(0), tc(1, out_hook="hook_attn_out")])
    with pytest.raises(ValueError, match=r"attribute: the transcoder of layer 1 reads 'blocks.1.hook_resid_pre'"):
        attribute(tiny_model, TOKENS, [tc(0), tc(1, in_hook="hook_resid_pre")])


def test_an_empty_prompt(tiny_model: GPT) -> None:
    with pytest.raises(ValueError, match=r"attribute: prompt has no tokens"):
        attribute(tiny_model, torch.tensor([], dtype=torch.long), tcs())
    with pytest.raises(ValueError, match=r"attribute: prompt has no tokens"):
        attribute(tiny_model, [], tcs())
    with pytest.raises(ValueError, match=r"attribute: prompt is empty"):
        attribute(tiny_model, "", tcs())


def test_a_prompt_longer_than_the_context(tiny_model: GPT) -> None:
    n_ctx = tiny_model.cfg.n_ctx
    with pytest.raises(ValueError, match=rf"attribute: prompt is {n_ctx + 1} tokens .*context is {n_ctx}"):
        attribute(tiny_model, torch.zeros(n_ctx + 1, dtype=torch.long), tcs())


def test_bad_prompt_types_and_ids(tiny_model: GPT) -> None:
    with pytest.raises(TypeError, match=r"attribute: prompt: a torch.float32 tensor of shape \(5,\)"):
        attribute(tiny_model, TOKENS.float(), tcs())
    with pytest.raises(TypeError, match=r"attribute: prompt=3\.5"):
        attribute(tiny_model, 3.5, tcs())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"prompt.*100"):
        attribute(tiny_model, torch.tensor([0, 100]), tcs())
    with pytest.raises(ValueError, match=r"attribute: prompt=.* is text but the model has no tokenizer"):
        attribute(tiny_model, "hello", tcs())


def test_bad_targets(tiny_model: GPT) -> None:
    with pytest.raises(ValueError, match=r"attribute: attribution_targets: token ids \[100, -1\] are outside"):
        attribute(tiny_model, TOKENS, tcs(), attribution_targets=torch.tensor([3, 100, -1]))
    with pytest.raises(TypeError, match=r"attribute: attribution_targets: a torch.float32 tensor"):
        attribute(tiny_model, TOKENS, tcs(), attribution_targets=torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"attribute: attribution_targets is empty"):
        attribute(tiny_model, TOKENS, tcs(), attribution_targets=[])
    with pytest.raises(ValueError, match=r"attribute: attribution_targets is an empty tensor"):
        attribute(tiny_model, TOKENS, tcs(), attribution_targets=torch.tensor([], dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"attribute: attribution_targets\[0\]: direction has shape \(3,\); expected \(64,\)"
    ):
        attribute(tiny_model, TOKENS, tcs(), attribution_targets=[("x", 1.0, torch.ones(3))])
    with pytest.raises(TypeError, match=r"attribute: attribution_targets\[0\]=\('x', 'y'\)"):
        attribute(tiny_model, TOKENS, tcs(), attribution_targets=[("x", "y")])
    with pytest.raises(TypeError, match=r"attribute: attribution_targets=.*mixes kinds"):
        attribute(tiny_model, TOKENS, tcs(), attribution_targets=[3, "x"])
    with pytest.raises(TypeError, match=r"attribute: attribution_targets='x'"):
        attribute(tiny_model, TOKENS, tcs(), attribution_targets="x")
    with pytest.raises(
        ValueError, match=r"attribute: attribution_targets=\['a'\]: token strings need a model with a tokenizer"
    ):
        attribute(tiny_model, TOKENS, tcs(), attribution_targets=["a"])


def test_bad_numbers(tiny_model: GPT) -> None:
    with pytest.raises(ValueError, match=r"attribute: max_n_logits=0"):
        attribute(tiny_model, TOKENS, tcs(), max_n_logits=0)
    with pytest.raises(ValueError, match=r"attribute: desired_logit_prob=1\.5"):
        attribute(tiny_model, TOKENS, tcs(), desired_logit_prob=1.5)
    with pytest.raises(TypeError, match=r"attribute: desired_logit_prob='high'"):
        attribute(tiny_model, TOKENS, tcs(), desired_logit_prob="high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"attribute: max_feature_nodes=0"):
        attribute(tiny_model, TOKENS, tcs(), max_feature_nodes=0)
    with pytest.raises(TypeError, match=r"attribute: batch_size must be an int"):
        attribute(tiny_model, TOKENS, tcs(), batch_size=2.0)  # type: ignore[arg-type]


def test_a_tokenizer_prompt_gets_one_bos() -> None:
    model = GPT.from_pretrained("tiny-gpt2")
    from interp_gpt.sae.training import shipped_transcoders

    ts = shipped_transcoders(model)
    with_bos = model.to_tokens("Hello there")[0]
    g1 = attribute(model, "Hello there", ts, max_feature_nodes=2)
    g2 = attribute(model, with_bos, ts, max_feature_nodes=2)
    g3 = attribute(model, with_bos[1:].tolist(), ts, max_feature_nodes=2)
    assert torch.equal(g1.input_tokens, with_bos) and torch.equal(g2.input_tokens, with_bos)
    assert torch.equal(g3.input_tokens, with_bos)
    with pytest.raises(ValueError, match=r"attribute: attribution_targets: ' there you' is 2 tokens"):
        attribute(model, "Hello", ts, attribution_targets=[" there you"])


# qk_attribution (qk.py): the same prompt and transcoder checks, named for it, and the head and positions.
def test_qk_attribution_bad_head_and_positions(tiny_model: GPT) -> None:
    from interp_gpt.attribution import qk_attribution

    n = TOKENS.shape[0]
    with pytest.raises(ValueError, match=r"qk_attribution: layer=2 is out of range: layers are 0..1"):
        qk_attribution(tiny_model, TOKENS, tcs(), 2, 0, 3, 1)
    with pytest.raises(ValueError, match=r"qk_attribution: head=4 is out of range: heads are 0..3"):
        qk_attribution(tiny_model, TOKENS, tcs(), 1, 4, 3, 1)
    with pytest.raises(
        ValueError,
        match=rf"qk_attribution: query_pos=9 is out of range: positions of the {n}-token prompt \(BOS included\) are 0..{n - 1}",
    ):
        qk_attribution(tiny_model, TOKENS, tcs(), 1, 0, n + 4, 1)
    with pytest.raises(ValueError, match=r"qk_attribution: key_pos=-40 is out of range"):
        qk_attribution(tiny_model, TOKENS, tcs(), 1, 0, 3, -40)
    with pytest.raises(ValueError, match=r"qk_attribution: key_pos=4 is after query_pos=3"):
        qk_attribution(tiny_model, TOKENS, tcs(), 1, 0, 3, 4)
    with pytest.raises(TypeError, match=r"qk_attribution: head must be an int, got float \(1.0\)"):
        qk_attribution(tiny_model, TOKENS, tcs(), 1, 1.0, 3, 1)  # type: ignore[arg-type]


def test_qk_attribution_bad_prompt_transcoders_and_model(tiny_model: GPT) -> None:
    from interp_gpt import Config
    from interp_gpt.attribution import qk_attribution

    with pytest.raises(ValueError, match=r"qk_attribution: prompt is empty"):
        qk_attribution(tiny_model, "", tcs(), 1, 0, 3, 1)
    with pytest.raises(ValueError, match=r"qk_attribution: transcoders: none for layers \[1\]"):
        qk_attribution(tiny_model, TOKENS, [tc(0)], 1, 0, 3, 1)
    with pytest.raises(ValueError, match=r"qk_attribution: .*transcoders\[1\].*d_in=32.*d_model=64"):
        qk_attribution(tiny_model, TOKENS, [tc(0), tc(1, d_in=32)], 1, 0, 3, 1)
    short = GPT(Config(**{**tiny_model.cfg.__dict__, "positional_embedding_type": "shortformer"}))
    with pytest.raises(ValueError, match=r"qk_attribution: model.cfg.positional_embedding_type='shortformer'"):
        qk_attribution(short, TOKENS, tcs(), 1, 0, 3, 1)


# ----- feature_intervention / feature_intervention_generate --------------------------------------------
def test_bad_interventions_are_refused_by_name(tiny_model: GPT) -> None:
    from interp_gpt.attribution import feature_intervention, feature_intervention_generate

    fi = "feature_intervention"
    cases: list[tuple[type[Exception], str, object]] = [
        (ValueError, rf"{fi}: interventions\[0\]: layer=2 is out of range: the model has layers 0\.\.1", [(2, 1, 0, 1.0)]),
        (ValueError, rf"{fi}: interventions\[1\]: layer=-1 is out of range", [(0, 1, 0, 1.0), (-1, 1, 0, 1.0)]),
        (TypeError, rf"{fi}: interventions\[0\]: layer=1\.0: expected an int", [(1.0, 1, 0, 1.0)]),
        (ValueError, rf"{fi}: interventions\[0\]: feature=16 is out of range: there are 16 features", [(0, 1, 16, 1.0)]),
        (ValueError, rf"{fi}: interventions\[0\]: feature=99 is out of range", [(0, 1, torch.tensor([1, 99]), 1.0)]),
        (TypeError, rf"{fi}: interventions\[0\]: feature='a'", [(0, 1, "a", 1.0)]),
        (ValueError, rf"{fi}: interventions\[0\]: pos=5 is out of range: there are 5 positions", [(0, 5, 0, 1.0)]),
        (ValueError, rf"{fi}: interventions\[0\]: pos=-6 is out of range", [(0, -6, 0, 1.0)]),
        (ValueError, rf"{fi}: interventions\[0\]: pos: slice\(7, None, None\) selects none of the 5 positions", [(0, slice(7, None), 0, 1.0)]),
        (TypeError, rf"{fi}: interventions\[0\]: pos=1\.5: expected an int, a slice", [(0, 1.5, 0, 1.0)]),
        (TypeError, rf"{fi}: interventions\[0\]: value='big': expected a number", [(0, 1, 0, "big")]),
        (ValueError, rf"{fi}: interventions\[0\]: value=nan: expected a finite number", [(0, 1, 0, float("nan"))]),
        (TypeError, rf"{fi}: interventions\[0\]=\(0, 1, 0\): expected a \(layer, pos, feature, value\) tuple", [(0, 1, 0)]),
        (TypeError, rf"{fi}: interventions: expected a list of \(layer, pos, feature, value\), got dict", {0: 1}),
    ]  # fmt: skip
    for error, match, ivs in cases:
        with pytest.raises(error, match=match):
            feature_intervention(tiny_model, TOKENS, tcs(), ivs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"feature_intervention_generate: interventions\[0\]: layer=3 is out of range"):
        feature_intervention_generate(tiny_model, TOKENS, tcs(), [(3, 1, 0, 1.0)], max_new_tokens=2)
    with pytest.raises(TypeError, match=r"feature_intervention: freeze_attention='yes': expected True or False"):
        feature_intervention(tiny_model, TOKENS, tcs(), [], freeze_attention="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"feature_intervention: constrained_layers: layer 2 is out of range"):
        feature_intervention(tiny_model, TOKENS, tcs(), [], constrained_layers=range(3))
    with pytest.raises(TypeError, match=r"feature_intervention: constrained_layers=\(0, 'a'\): expected a range"):
        feature_intervention(tiny_model, TOKENS, tcs(), [], constrained_layers=(0, "a"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"feature_intervention_generate: use_past_kv_cache= is not taken"):
        feature_intervention_generate(tiny_model, TOKENS, tcs(), [], max_new_tokens=2, use_past_kv_cache=False)


def test_wrong_transcoders_for_an_intervention_are_refused_by_name(tiny_model: GPT) -> None:
    from interp_gpt.attribution import feature_intervention, feature_intervention_generate

    with pytest.raises(ValueError, match=r"feature_intervention: .*transcoders\[1\].*d_in=32.*d_model=64"):
        feature_intervention(tiny_model, TOKENS, [tc(0), tc(1, d_in=32)], [])
    with pytest.raises(ValueError, match=r"feature_intervention: transcoders: none for layers \[1\]"):
        feature_intervention(tiny_model, TOKENS, [tc(0)], [(0, 1, 0, 1.0)])
    with pytest.raises(TypeError, match=r"feature_intervention_generate: transcoders: expected a list of Transcoder"):
        feature_intervention_generate(tiny_model, TOKENS, "tcs", [], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"feature_intervention: prompt has no tokens"):
        feature_intervention(tiny_model, torch.tensor([], dtype=torch.long), tcs(), [])
    with pytest.raises(ValueError, match=r"feature_intervention_generate: max_new_tokens=-1"):
        feature_intervention_generate(tiny_model, TOKENS, tcs(), [], max_new_tokens=-1)
    n_ctx = tiny_model.cfg.n_ctx
    with pytest.raises(
        ValueError, match=rf"feature_intervention_generate: prompt is 5 tokens .*max_new_tokens={n_ctx}"
    ):
        feature_intervention_generate(tiny_model, TOKENS, tcs(), [], max_new_tokens=n_ctx)
    with pytest.raises(ValueError, match=r"feature_intervention: prompt is .* tokens .*the model's context is"):
        feature_intervention(tiny_model, torch.zeros(n_ctx + 1, dtype=torch.long), tcs(), [])


# ----- one way in: the model (interp_gpt.prepare.checked_model), for every entry point ---------------------
def _entry_points() -> list[tuple[str, Any]]:
    from interp_gpt.attribution import feature_intervention, feature_intervention_generate, qk_attribution

    return [
        ("attribute", lambda m: attribute(m, TOKENS, tcs())),
        ("qk_attribution", lambda m: qk_attribution(m, TOKENS, tcs(), 1, 0, 3, 1)),
        ("feature_intervention", lambda m: feature_intervention(m, TOKENS, tcs(), [(0, 1, 0, 1.0)])),
        ("feature_intervention_generate", lambda m: feature_intervention_generate(m, TOKENS, tcs(), [], max_new_tokens=1)),
    ]  # fmt: skip


def test_a_model_that_is_no_gpt_is_refused_by_name() -> None:
    for name, call in _entry_points():
        with pytest.raises(TypeError, match=rf"^{name}: model must be an interp_gpt GPT, got str"):
            call("gpt2")


@pytest.mark.parametrize("error_term", [False, True])
@pytest.mark.parametrize("what", ["sae", "transcoder"])
def test_a_model_with_a_module_spliced_in_is_refused(tiny_model: GPT, what: str, error_term: bool) -> None:
    """The replacement model is hooks on the unchanged model: with an SAE or a transcoder spliced in (even
    with its error term) `attribute` built a different graph without a word (gradients pass through the
    module's reconstruction only); every entry point now refuses by name, and leaves the splice in place."""
    ts = tcs()
    clean = attribute(tiny_model, TOKENS, ts).adjacency_matrix
    if what == "sae":
        module: Any = SAE(SAEConfig(d_in=64, d_sae=32, metadata={"hook_name": "blocks.1.hook_resid_pre"}))
        module.init_weights(seed=3)
        where, kind = "blocks.1.hook_resid_pre", r"an SAE \(standard, d_in=64, d_sae=32"
    else:
        module = tc(0)
        module.init_weights(seed=3)
        where, kind = "blocks.0.hook_mlp_out", r"a Transcoder \("
    tiny_model.add_sae(module, use_error_term=error_term)
    try:
        for name, call in _entry_points():
            with pytest.raises(
                ValueError, match=rf"^{name}: {kind}.*\) is spliced in at '{where}'; .*model.reset_saes\(\)"
            ):
                call(tiny_model)
        assert list(tiny_model.acts_to_saes) == [where]
    finally:
        tiny_model.reset_saes()
    torch.testing.assert_close(attribute(tiny_model, TOKENS, ts).adjacency_matrix, clean)
