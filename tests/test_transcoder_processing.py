"""Raw vs processed weights: a transcoder made for one kind of model, used on the other, computes the
same numbers (converted exactly: spliced, `converted_to`, `load_transcoders(path, model)`) or is refused
by name. The reference is always the raw model with the raw transcoder through plain hooks: read the
activation (the MLP's input through a torch pre-hook on the MLP module), overwrite hook_mlp_out."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import Tensor

from interp_gpt import GPT
from interp_gpt.sae import (
    CLTConfig,
    CrossLayerTranscoder,
    Transcoder,
    TranscoderConfig,
    load_clt,
    load_transcoders,
    model_processing,
    save_clt,
    save_transcoders,
)

TOKENS = torch.tensor([[5, 17, 3, 42, 9, 61, 2], [7, 7, 8, 12, 64, 3, 99]])
RAW = {"fold_ln": False, "center_writing_weights": False}
PROCESSED = {"fold_ln": True, "center_writing_weights": True}


@pytest.fixture(scope="module")
def tiny_pair() -> tuple[GPT, GPT]:
    """tiny-gpt2 raw and processed (transformer-lens' defaults), in float64."""
    raw = GPT.from_pretrained_no_processing("tiny-gpt2", dtype=torch.float64)
    return raw, GPT.from_pretrained("tiny-gpt2", dtype=torch.float64)


@pytest.fixture
def random_pair(tiny_model: GPT) -> tuple[GPT, GPT]:
    """conftest's random GPT-2 (non-trivial LayerNorm weights and biases) raw, and processed in place."""
    raw = tiny_model.to(torch.float64)
    processed = copy.deepcopy(raw)
    processed.process_weights_()
    return raw, processed


def make(
    model: GPT, layer: int, hook_in: str, arch: str = "jumprelu", skip: bool = True, processing: Any = "raw"
) -> Transcoder:
    d = model.cfg.d_model
    fields: dict[str, Any] = dict(architecture=arch, skip=skip)
    if arch == "topk":
        fields["k"] = 6
    if arch != "relu":
        fields["nonnegative_acts"] = False
    meta = {"hook_name": f"blocks.{layer}.{hook_in}", "hook_name_out": f"blocks.{layer}.hook_mlp_out"}
    cfg = TranscoderConfig(
        d_in=d, d_sae=48, d_out=d, dtype="float64", metadata={**meta, "model_processing": processing}, **fields
    )
    tc = Transcoder(cfg)
    gen = torch.Generator().manual_seed(100 + layer)
    with torch.no_grad():
        for name, p in tc.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (0.3 if name.startswith("W_") else 0.2))
        if arch == "jumprelu":
            tc.threshold.abs_()  # a form both file formats hold exactly
    return tc


def _mlp_input(model: GPT, layer: int) -> Any:
    """A torch forward pre-hook on the MLP module: what it is called with (the MLP's own input)."""
    return model.blocks[layer].mlp


def reference(model: GPT, tcs: list[Transcoder]) -> Tensor:
    """Log-probs of `model` with each MLP output replaced by tc(its input), by plain hooks."""
    seen: dict[int, Tensor] = {}
    handles = []
    hooks = []
    for tc in tcs:
        layer, rel = tc.layer, tc.input_hook.split(".", 2)[-1]  # type: ignore[union-attr]
        assert layer is not None
        if rel == "mlp.hook_in":
            handles.append(
                _mlp_input(model, layer).register_forward_pre_hook(lambda m, a, L=layer: seen.update({L: a[0]}))
            )
        else:
            hooks.append((tc.input_hook, lambda x, hook, L=layer: seen.update({L: x})))
        hooks.append((tc.output_hook, lambda out, hook, tc=tc, L=layer: tc(seen[L])))
    try:
        with torch.no_grad():
            return model.run_with_hooks(TOKENS, fwd_hooks=hooks).log_softmax(-1)
    finally:
        for h in handles:
            h.remove()


def spliced(model: GPT, tcs: list[Any], **kw: Any) -> Tensor:
    with torch.no_grad(), model.transcoders(tcs, **kw):
        return model(TOKENS).log_softmax(-1)


# ------------------------------------------------------------------------------------------
# What a model is, what it records
# ------------------------------------------------------------------------------------------
def test_a_processed_model_records_the_layer_norm_weights_fold_ln_took(tiny_pair: tuple[GPT, GPT]) -> None:
    raw, processed = tiny_pair
    assert not hasattr(raw, "folded_layer_norms")
    for L in range(raw.cfg.n_layers):
        for ln in ("ln1", "ln2"):
            for p in ("w", "b"):
                want = getattr(getattr(raw.blocks[L], ln), p).float()
                assert torch.equal(processed.folded_layer_norms[f"blocks.{L}.{ln}.{p}"], want)
    assert model_processing(raw, 1) == RAW and model_processing(processed, 1) == PROCESSED
    half = GPT.from_pretrained("tiny-gpt2", center_writing_weights=False, center_unembed=False)
    assert model_processing(half, 0) == {"fold_ln": True, "center_writing_weights": False}
    # read from the weights to their dtype's rounding, bfloat16 too
    assert model_processing(GPT.from_pretrained("tiny-gpt2", dtype=torch.bfloat16), 1) == PROCESSED
    assert model_processing(GPT.from_pretrained_no_processing("tiny-gpt2", dtype=torch.bfloat16), 1) == RAW


def test_the_hooks_a_transcoder_reads_and_writes_relate_as_the_conversion_assumes(tiny_pair: tuple[GPT, GPT]) -> None:
    """ln2.hook_normalized is x_hat on both (before w and b); hook_mlp_out and hook_resid_mid lose their
    mean over d_model; the MLP's input is x_hat * w + b on raw weights, x_hat on processed ones."""
    raw, processed = tiny_pair
    _, r = raw.run_with_cache(TOKENS)
    _, p = processed.run_with_cache(TOKENS)
    for L in range(2):
        torch.testing.assert_close(p[f"blocks.{L}.ln2.hook_normalized"], r[f"blocks.{L}.ln2.hook_normalized"])
        for name in (f"blocks.{L}.hook_mlp_out", f"blocks.{L}.hook_resid_mid"):
            torch.testing.assert_close(p[name], r[name] - r[name].mean(-1, keepdim=True))


# ------------------------------------------------------------------------------------------
# Raw -> processed: converted exactly (spliced, converted_to, load_transcoders)
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hook_in", ["mlp.hook_in", "ln2.hook_normalized"])
@pytest.mark.parametrize("arch,skip", [("relu", False), ("jumprelu", True), ("topk", True)])
@pytest.mark.parametrize("pair", ["tiny_pair", "random_pair"])
def test_a_raw_transcoder_on_the_processed_model_gives_the_raw_models_log_probs(
    pair: str, arch: str, skip: bool, hook_in: str, request: pytest.FixtureRequest
) -> None:
    raw, processed = request.getfixturevalue(pair)
    tcs = [make(raw, L, hook_in, arch, skip) for L in range(raw.cfg.n_layers)]
    want = reference(raw, tcs)
    unspliced = raw(TOKENS).log_softmax(-1)
    assert (want - unspliced).abs().max() > 1e-2  # the transcoders do change the model
    torch.testing.assert_close(spliced(raw, tcs), want, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(spliced(processed, tcs), want, atol=1e-9, rtol=1e-9)  # converted as spliced
    # what each writes: the raw prediction less its mean over d_model, as hook_mlp_out is on processed weights
    with torch.no_grad(), raw.transcoders(tcs):
        _, raw_cache = raw.run_with_cache(TOKENS)
    with torch.no_grad(), processed.transcoders(tcs):
        _, cache = processed.run_with_cache(TOKENS)
    for L in range(raw.cfg.n_layers):
        out = raw_cache[f"blocks.{L}.hook_mlp_out.hook_sae_output"]  # what flows downstream
        assert out.mean(-1).abs().max() > 1e-3  # (so the centring is seen)
        got = cache[f"blocks.{L}.hook_mlp_out.hook_sae_output"]
        torch.testing.assert_close(got, out - out.mean(-1, keepdim=True), atol=1e-9, rtol=1e-9)
    converted = [tc.converted_to(processed) for tc in tcs]
    assert all(c.cfg.processing == PROCESSED and c.input_hook.endswith("ln2.hook_normalized") for c in converted)
    torch.testing.assert_close(reference(processed, converted), want, atol=1e-9, rtol=1e-9)
    with torch.no_grad(), processed.transcoders(converted):
        _, conv_cache = processed.run_with_cache(TOKENS)
    for name in (f"blocks.{L}.hook_mlp_out.hook_sae_output" for L in range(raw.cfg.n_layers)):
        torch.testing.assert_close(conv_cache[name], cache[name], atol=1e-9, rtol=1e-9)
    # with the error term the model's own output, features readable
    with torch.no_grad(), processed.transcoders(tcs, use_error_term=True):
        got, cache = processed.run_with_cache(TOKENS)
    torch.testing.assert_close(got.log_softmax(-1), processed(TOKENS).log_softmax(-1), atol=1e-9, rtol=1e-9)
    _, raw_cache = raw.run_with_cache(TOKENS)
    x = raw_cache["blocks.1.ln2.hook_normalized"]
    if hook_in == "mlp.hook_in":
        x = x * raw.blocks[1].ln2.w + raw.blocks[1].ln2.b
    torch.testing.assert_close(
        cache["blocks.1.hook_mlp_out.hook_sae_acts_post"], tcs[1].encode(x), atol=1e-9, rtol=1e-9
    )


def test_float32_tiny_gpt2_agrees_to_1e_5() -> None:
    raw, processed = GPT.from_pretrained_no_processing("tiny-gpt2"), GPT.from_pretrained("tiny-gpt2")
    tcs = [make(raw, L, "mlp.hook_in").to_dtype("float32") for L in range(2)]
    torch.testing.assert_close(spliced(processed, tcs), reference(raw, tcs), atol=1e-5, rtol=1e-5)


def test_load_transcoders_with_a_model_converts_both_formats(tmp_path: Path, tiny_pair: tuple[GPT, GPT]) -> None:
    raw, processed = tiny_pair
    tcs = [make(raw, L, "mlp.hook_in", "jumprelu", True) for L in range(2)]
    want = reference(raw, tcs)
    for fmt in ("circuit-tracer", "saelens"):
        save_transcoders(tcs, tmp_path / fmt, format=fmt)
        back = load_transcoders(tmp_path / fmt)
        assert [t.cfg.processing for t in back] == [RAW, RAW] and back[0].input_hook == "blocks.0.mlp.hook_in"
        on_processed = load_transcoders(tmp_path / fmt, processed)
        assert [t.cfg.processing for t in on_processed] == [PROCESSED, PROCESSED]
        assert on_processed[1].input_hook == "blocks.1.ln2.hook_normalized"
        torch.testing.assert_close(spliced(processed, on_processed), want, atol=1e-9, rtol=1e-9)
        assert load_transcoders(tmp_path / fmt, raw)[0].cfg.processing == RAW
    config = yaml.safe_load((tmp_path / "circuit-tracer" / "config.yaml").read_text())
    assert config["model_processing"] == RAW and config["feature_input_hook"] == "mlp.hook_in"


def test_a_circuit_tracer_set_that_does_not_say_is_for_raw_weights(tmp_path: Path, tiny_pair: tuple[GPT, GPT]) -> None:
    raw, processed = tiny_pair
    tcs = [make(raw, L, "mlp.hook_in", "relu", False) for L in range(2)]
    save_transcoders(tcs, tmp_path / "ct", format="circuit-tracer")
    config = yaml.safe_load((tmp_path / "ct" / "config.yaml").read_text())
    del config["model_processing"]
    (tmp_path / "ct" / "config.yaml").write_text(yaml.safe_dump(config))
    back = load_transcoders(tmp_path / "ct")
    assert back[0].cfg.processing == RAW and back[0].input_hook == "blocks.0.mlp.hook_in"
    torch.testing.assert_close(spliced(processed, back), reference(raw, tcs), atol=1e-9, rtol=1e-9)
    # a set for folded weights reads the MLP's input where the model has it
    config["model_processing"] = PROCESSED
    (tmp_path / "ct" / "config.yaml").write_text(yaml.safe_dump(config))
    assert load_transcoders(tmp_path / "ct")[0].input_hook == "blocks.0.ln2.hook_normalized"


# ------------------------------------------------------------------------------------------
# hook_resid_mid and hook_mlp_out: what converts, what is refused
# ------------------------------------------------------------------------------------------
def test_a_raw_resid_mid_transcoder_converts_only_if_it_ignores_the_mean(tiny_pair: tuple[GPT, GPT]) -> None:
    raw, processed = tiny_pair
    tcs = [make(raw, L, "hook_resid_mid") for L in range(2)]
    with pytest.raises(
        ValueError, match=r"blocks\.0\.hook_resid_mid: .*raw weights.*its encoder \(W_enc's columns\) reads that mean"
    ):
        spliced(processed, tcs)
    with pytest.raises(ValueError, match=r"converted_to: the transcoder of layer 0: blocks\.0\.hook_resid_mid"):
        tcs[0].converted_to(processed)
    assert processed.acts_to_saes == {}
    with torch.no_grad():
        for tc in tcs:
            tc.W_enc.sub_(tc.W_enc.mean(0, keepdim=True))  # blind to the all-ones direction
    with pytest.raises(ValueError, match=r"its skip \(W_skip's rows\) reads that mean"):
        spliced(processed, tcs)
    with torch.no_grad():
        for tc in tcs:
            tc.W_skip.sub_(tc.W_skip.mean(1, keepdim=True))
    want = reference(raw, tcs)
    torch.testing.assert_close(spliced(processed, tcs), want, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(
        spliced(processed, [tc.converted_to(processed) for tc in tcs]), want, atol=1e-9, rtol=1e-9
    )


def test_a_processed_resid_mid_transcoder_reads_an_uncentred_stream_through_the_centring(
    tiny_pair: tuple[GPT, GPT],
) -> None:
    """A processed model whose embedding writes a mean again (every output unchanged: LayerNorm removes
    it) has an uncentred resid_mid but a centred hook_mlp_out: the transcoder reads it through C."""
    _, processed = tiny_pair
    shifted = copy.deepcopy(processed)
    with torch.no_grad():
        shifted.embed.W_E.add_(
            torch.randn(shifted.cfg.d_vocab, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        )
    tcs = [make(processed, L, "hook_resid_mid", processing="processed") for L in range(2)]
    with torch.no_grad():  # it predicts what hook_mlp_out holds on the processed model: mean 0
        for tc in tcs:
            for t, dim in ((tc.W_dec, -1), (tc.b_dec, -1), (tc.W_skip, 0)):
                t.sub_(t.mean(dim, keepdim=True))
    want = reference(processed, tcs)
    _, cache = shifted.run_with_cache(TOKENS)
    assert cache["blocks.0.hook_resid_mid"].mean(-1).abs().max() > 0.1
    torch.testing.assert_close(spliced(shifted, tcs), want, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(reference(shifted, [tc.converted_to(shifted) for tc in tcs]), want, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("hook_in", ["mlp.hook_in", "ln2.hook_normalized", "hook_resid_mid"])
def test_a_processed_transcoder_on_raw_weights_is_refused_naming_hook_mlp_out(
    hook_in: str, tiny_pair: tuple[GPT, GPT], tmp_path: Path
) -> None:
    raw, _ = tiny_pair
    tcs = [make(raw, L, hook_in, processing="processed") for L in range(2)]
    why = r"blocks\.0\.hook_mlp_out: the transcoder was made for centred writing weights .* nothing the transcoder predicts"
    with pytest.raises(ValueError, match=why):
        spliced(raw, tcs)
    assert raw.acts_to_saes == {}
    with pytest.raises(ValueError, match=why):
        tcs[0].converted_to(raw)
    save_transcoders(tcs, tmp_path / "set")
    with pytest.raises(ValueError, match=r"load_transcoders: the transcoder of layer 0: " + why):
        load_transcoders(tmp_path / "set", raw)


def test_a_raw_mlp_input_transcoder_on_a_folded_model_that_kept_no_weights_is_refused(
    tiny_pair: tuple[GPT, GPT],
) -> None:
    raw, processed = tiny_pair
    bare = copy.deepcopy(processed)
    del bare.folded_layer_norms
    tc = make(raw, 1, "mlp.hook_in")
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp\.hook_in: .*does not record .*model\.folded_layer_norms"):
        spliced(bare, [tc])
    spliced(bare, [make(raw, 1, "ln2.hook_normalized")])  # x_hat on any weights: nothing to convert


# ------------------------------------------------------------------------------------------
# Cross-layer transcoders: the same maths, layer by layer
# ------------------------------------------------------------------------------------------
def test_a_raw_clt_converts_to_the_processed_model_layer_by_layer(tiny_pair: tuple[GPT, GPT], tmp_path: Path) -> None:
    raw, processed = tiny_pair
    d = raw.cfg.d_model
    clt = CrossLayerTranscoder(
        CLTConfig(n_layers=2, d_in=d, d_sae=32, d_out=d, architecture="jumprelu", skip=True, nonnegative_acts=False,
                  dtype="float64", metadata={"hook_name": "mlp.hook_in", "hook_name_out": "hook_mlp_out"})
    )  # fmt: skip
    with torch.no_grad():
        gen = torch.Generator().manual_seed(7)
        for p in clt.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.2)
    seen: dict[int, Tensor] = {}
    handles = [raw.blocks[L].mlp.register_forward_pre_hook(lambda m, a, L=L: seen.update({L: a[0]})) for L in range(2)]
    with torch.no_grad():
        raw(TOKENS)
    for h in handles:
        h.remove()
    xs = torch.stack([seen[0], seen[1]])
    want = clt(xs)
    want = want - want.mean(-1, keepdim=True)  # what the processed model's hook_mlp_out holds
    _, cache = processed.run_with_cache(TOKENS)
    for conv in (clt.converted_to(processed), None):
        if conv is None:  # through the files: the processing is recorded and read back
            save_clt(clt, tmp_path / "clt")
            back = load_clt(tmp_path / "clt")
            assert back.cfg.processing == RAW
            conv = back.converted_to(processed)
        assert conv.cfg.processing == PROCESSED and conv.cfg.input_hook(1) == "blocks.1.ln2.hook_normalized"
        xs_p = torch.stack([cache[conv.cfg.input_hook(L)] for L in range(2)])
        torch.testing.assert_close(conv.encode(xs_p), clt.encode(xs), atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(conv(xs_p), want, atol=1e-9, rtol=1e-9)
    with pytest.raises(ValueError, match=r"CLT's layer 0: blocks\.0\.hook_mlp_out: .*centred writing weights"):
        conv.converted_to(raw)


def test_a_refused_second_splice_leaves_the_first_models_conversion_alone(tiny_pair: tuple[GPT, GPT]) -> None:
    raw, processed = tiny_pair
    tcs = [make(raw, L, "mlp.hook_in") for L in range(2)]
    want = reference(raw, tcs)
    name = "blocks.1.hook_mlp_out.hook_sae_output"  # raw: the prediction as it is, mean and all
    with torch.no_grad(), raw.transcoders(tcs):
        before = raw.run_with_cache(TOKENS, names_filter=[name])[1][name]
        with pytest.raises(ValueError, match=r"already spliced in at 'blocks.0.hook_mlp_out'"):
            with processed.transcoders(tcs):
                pass
        torch.testing.assert_close(raw.run_with_cache(TOKENS, names_filter=[name])[1][name], before, atol=0, rtol=0)
        torch.testing.assert_close(raw(TOKENS).log_softmax(-1), want, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(spliced(processed, tcs), want, atol=1e-9, rtol=1e-9)


def test_converted_to_without_a_copy_is_the_same_transcoder_only_where_nothing_converts(
    tiny_pair: tuple[GPT, GPT],
) -> None:
    """`copy=False` (what attribute uses: 1.8 GB less at GPT-2-small widths) hands back the transcoder
    itself on the weights it was made for, and the converted one everywhere else."""
    raw, processed = tiny_pair
    tc = make(raw, 1, "ln2.hook_normalized")
    assert tc.converted_to(raw, copy=False) is tc
    assert tc.converted_to(raw) is not tc
    conv = tc.converted_to(processed, copy=False)
    assert conv is not tc
    for name, p in tc.converted_to(processed).state_dict().items():
        assert torch.equal(conv.state_dict()[name], p)
    assert not torch.equal(conv.W_dec, tc.W_dec)  # centred: the processed model's hook_mlp_out has mean 0
    mlp_in = make(raw, 1, "mlp.hook_in")  # read where the model has it: a new transcoder, renamed
    assert mlp_in.converted_to(raw, copy=False) is not mlp_in
    d = raw.cfg.d_model
    clt = CrossLayerTranscoder(
        CLTConfig(n_layers=2, d_in=d, d_sae=8, d_out=d, dtype="float64", metadata={
            "hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out", "model_processing": "raw"})
    )  # fmt: skip
    assert clt.converted_to(raw, copy=False) is clt
    assert clt.converted_to(processed, copy=False) is not clt
