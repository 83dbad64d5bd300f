"""ARENA's toy configurations: attn_only, normalization_type None / "LNPre", shortformer positions.

Against transformer-lens 3.9's HookedTransformer (only in the .venv-tl3 venv; CI runs both venvs):
a random TL model's state dict loads into ours with strict=True and every hook TL caches matches,
name for name. Against transformer-lens 4.3 (the main venv): its native bridge (`boot_native`)
builds the attn_only / LNPre / normalization-free models with standard positions, and refuses
shortformer ones. The rest checks the configurations' own promises without TL, in both venvs.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.checkpoints.convert import config_from_transformer_lens
from interp_gpt.checkpoints.sources import CheckpointError
from interp_gpt.compare import transformer_lens_major

TL_MAJOR = transformer_lens_major()
needs_tl3 = pytest.mark.skipif(
    TL_MAJOR != 3, reason="transformer-lens 3.9's HookedTransformer lives in .venv-tl3 (CI runs it there)"
)
needs_tl4 = pytest.mark.skipif(
    TL_MAJOR < 4, reason="transformer-lens 4.x's native bridge lives in the main venv (CI runs it there)"
)

SMALL = dict(n_layers=2, d_model=32, n_heads=4, d_head=8, d_vocab=61, n_ctx=24)
ATOL = 1e-10  # both models in float64
# (attn_only, normalization_type, positional_embedding_type, extra flags)
CASES = [
    (True, None, "shortformer", {"use_attn_result": True}),  # ARENA 1.2's induction model
    (True, None, "standard", {}),
    (True, "LN", "shortformer", {"use_split_qkv_input": True}),
    (True, "LNPre", "standard", {"use_attn_in": True}),
    (False, None, "shortformer", {"use_hook_mlp_in": True}),
    (False, "LN", "shortformer", {}),
    (False, "LNPre", "shortformer", {"use_attn_result": True}),
    (False, None, "standard", {}),
]
IDS = [f"{'attn_only' if a else 'mlp'}-{n}-{p}" + "".join(f"-{k}" for k in x) for a, n, p, x in CASES]
OPT_IN = ("hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input", "hook_mlp_in", "hook_result", "hook_tokens")


def tl_model(attn_only, norm, pos, extra):  # type: ignore[no-untyped-def]
    """A random TL 3.9 HookedTransformer (float64) with every parameter, biases and LN weights too, random."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    mlp = {} if attn_only else {"d_mlp": 48, "act_fn": "gelu_new"}
    cfg = HookedTransformerConfig(
        **SMALL,
        **mlp,
        **extra,
        attn_only=attn_only,
        normalization_type=norm,
        positional_embedding_type=pos,
        seed=398,
        dtype=torch.float64,
        device="cpu",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3 + (1.0 if p.ndim == 1 else 0.0) * 0.1)
    return model.eval()


def ours_from_tl(tl) -> GPT:  # type: ignore[no-untyped-def]
    model = GPT(config_from_transformer_lens(tl.cfg)).to(torch.float64)
    model.load_state_dict(tl.state_dict(), strict=True)  # TL's IGNORE / mask buffers included
    return model.eval()


def tokens() -> torch.Tensor:
    return torch.randint(0, SMALL["d_vocab"], (3, 11), generator=torch.Generator().manual_seed(5))


def assert_caches_match(ours: GPT, tl, toks: torch.Tensor, float32: bool = False) -> None:  # type: ignore[no-untyped-def]
    """`float32`: TL processed the weights in float32 (whatever their dtype), so compare to float32's
    precision, scaled by each tensor's size (without a LayerNorm, activations grow layer by layer)."""
    ref_logits, ref = tl.run_with_cache(toks)
    logits, cache = ours.run_with_cache(toks)
    assert sorted(cache.keys()) == sorted(ref.keys())
    for name, want in list(ref.items()) + [("logits", ref_logits), ("logits (fused attention)", ref_logits)]:
        got = logits if name == "logits" else ours(toks) if name.startswith("logits") else cache[name]
        assert got.shape == want.shape, name
        atol = 1e-5 * max(1.0, want.abs().max().item()) if float32 else ATOL
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-5 if float32 else 1e-9, msg=name)


# ----------------------------------------------------------------------------
# Against transformer-lens 3.9
# ----------------------------------------------------------------------------
@needs_tl3
@pytest.mark.parametrize("attn_only, norm, pos, extra", CASES, ids=IDS)
def test_a_tl_toy_state_dict_loads_strictly_and_every_hook_matches(attn_only, norm, pos, extra):
    tl = tl_model(attn_only, norm, pos, extra)
    ours = ours_from_tl(tl)
    assert_caches_match(ours, tl, tokens())
    # TL's hook list, but for the opt-in hook points that are off (hidden here until switched on)
    # and two that TL declares and never calls: hook_mlp_out of an attn_only block, and the
    # shortformer attention's hook_attn_input. A hook on those would silently never fire.
    dead = {n for n in tl.hook_dict if n.endswith("attn.hook_attn_input") or (attn_only and n.endswith("hook_mlp_out"))}
    off = {n for n in tl.hook_dict if n.rsplit(".", 1)[-1] in OPT_IN and n in set(tl.hook_dict) - set(ours.hook_dict)}
    assert sorted(ours.hook_dict) == sorted(set(tl.hook_dict) - dead - off)
    _, ref = tl.run_with_cache(tokens())
    assert not dead & set(ref.keys())


@needs_tl3
def test_arenas_induction_model_config_converts_as_is():
    from transformer_lens import HookedTransformerConfig

    tl_cfg = HookedTransformerConfig(
        d_model=768,
        d_head=64,
        n_heads=12,
        n_layers=2,
        n_ctx=2048,
        d_vocab=50278,
        attn_only=True,
        tokenizer_name="EleutherAI/gpt-neox-20b",
        seed=398,
        use_attn_result=True,
        normalization_type=None,
        positional_embedding_type="shortformer",
    )
    cfg = config_from_transformer_lens(tl_cfg)
    assert (cfg.attn_only, cfg.normalization_type, cfg.positional_embedding_type) == (True, None, "shortformer")
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_ctx, cfg.d_vocab) == (2, 768, 12, 64, 2048, 50278)
    assert cfg.use_attn_result and cfg.n_params == tl_cfg.n_params and cfg.tokenizer_name == "EleutherAI/gpt-neox-20b"


@needs_tl3
@pytest.mark.parametrize("attn_only, norm, pos, extra", CASES[:3] + CASES[5:6], ids=IDS[:3] + IDS[5:6])
def test_the_processed_load_matches_transformer_lens_processing(attn_only, norm, pos, extra):
    tl = tl_model(attn_only, norm, pos, extra)
    # What TL's from_pretrained does: for a shortformer model it turns fold_ln, center_writing_weights
    # and center_unembed off; with normalization_type=None its weight processing skips fold_ln and
    # center_writing_weights.
    short = pos == "shortformer"
    flags = dict(fold_ln=not short, center_writing_weights=not short, center_unembed=not short)
    sd = {k: v.clone() for k, v in tl.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tl.load_and_process_state_dict(sd, fold_value_biases=True, **flags)
    skips = short or norm is None
    with pytest.warns(UserWarning, match="skipped") if skips else warnings.catch_warnings():
        ours = GPT.from_pretrained(tl, tokenizer=None, dtype=torch.float64)  # every flag on, as by default
    assert ours.cfg.normalization_type == tl.cfg.normalization_type
    assert_caches_match(ours, tl, tokens(), float32=True)


@needs_tl3
def test_from_pretrained_takes_a_tl_state_dict_with_its_tl_config():
    tl = tl_model(*CASES[0])
    with pytest.raises(CheckpointError, match="pass config="):
        GPT.from_pretrained_no_processing(tl.state_dict(), tokenizer=None)
    ours = GPT.from_pretrained_no_processing(tl.state_dict(), config=tl.cfg, tokenizer=None, dtype=torch.float64)
    assert_caches_match(ours, tl, tokens())


@needs_tl3
def test_tl_config_fields_with_no_equivalent_are_refused_by_name():
    from transformer_lens import HookedTransformerConfig

    for bad, match in [
        (dict(positional_embedding_type="rotary", rotary_dim=8), "positional_embedding_type='rotary'"),
        (dict(normalization_type="RMS"), "normalization_type='RMS'"),
        (dict(gated_mlp=True, d_mlp=48, act_fn="gelu_new"), "gated_mlp=True"),
    ]:
        tl_cfg = HookedTransformerConfig(**SMALL, **({"attn_only": True} | bad))
        with pytest.raises(CheckpointError, match=match):
            config_from_transformer_lens(tl_cfg)


# ----------------------------------------------------------------------------
# Against transformer-lens 4.3's native bridge
# ----------------------------------------------------------------------------
def native_bridge(**kw):  # type: ignore[no-untyped-def]
    import transformer_lens.model_bridge.sources  # noqa: F401 (attaches TransformerBridge.boot_native)
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    cfg = TransformerBridgeConfig(**SMALL, d_mlp=48, act_fn="gelu_new", seed=1, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_native(cfg, dtype=torch.float64)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in bridge.parameters():  # biases too
                p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        bridge.enable_compatibility_mode(no_processing=True)
    return bridge


@needs_tl4
@pytest.mark.parametrize("attn_only, norm", [(True, None), (True, "LNPre"), (True, "LN"), (False, None)])
def test_a_tl4_native_toy_bridge_loads_and_every_shared_hook_matches(attn_only, norm):
    bridge = native_bridge(attn_only=attn_only, normalization_type=norm)
    ours = GPT.from_pretrained_no_processing(bridge, tokenizer=None, dtype=torch.float64)
    assert (ours.cfg.attn_only, ours.cfg.normalization_type) == (attn_only, norm)
    toks = tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_logits, ref = bridge.run_with_cache(toks)
    logits, cache = ours.run_with_cache(toks)
    assert set(cache.keys()) <= set(ref.keys())  # every hook of ours has a bridge twin
    # 4.3's native bridge puts the softmaxed pattern on hook_attn_scores as well (its bug; the 3.9 test
    # above checks our scores), so the scores are compared through the pattern they give.
    for name in cache.keys():
        want = ref[name.replace("hook_attn_scores", "hook_pattern")]
        got = cache[name].softmax(-1) if name.endswith("hook_attn_scores") else cache[name]
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-9, msg=name)
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=1e-9)


@needs_tl4
def test_tl4s_native_bridge_cannot_build_a_shortformer_model():
    with pytest.raises(ValueError, match="shortformer"):
        native_bridge(attn_only=True, normalization_type=None, positional_embedding_type="shortformer")


# ----------------------------------------------------------------------------
# Without transformer-lens (both venvs)
# ----------------------------------------------------------------------------
def toy(**kw) -> GPT:  # type: ignore[no-untyped-def]
    model = GPT(Config(**SMALL, **kw))
    model.init_weights(seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.split(".")[-1].startswith("W_"):
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return model.eval()


def test_attn_only_blocks_have_no_mlp_ln2_or_resid_mid():
    model = toy(attn_only=True)
    assert not [k for k in model.state_dict() if ".mlp." in k or ".ln2." in k]
    assert not [k for k in model.hook_dict if "mlp" in k or "ln2" in k or "resid_mid" in k]
    assert model.cfg.n_params == 2 * 4 * 32 * 8 * 4
    _, cache = model.run_with_cache(tokens())
    for L in range(2):  # resid_post = resid_pre + attn_out, nothing else
        torch.testing.assert_close(cache["resid_post", L], cache["resid_pre", L] + cache["attn_out", L])
    with pytest.raises(KeyError, match="attn_only=True"):
        model.add_hook("blocks.0.hook_mlp_out", lambda t, hook: t)
    with pytest.raises(ValueError, match="attn_only=True"):
        model.set_use_hook_mlp_in(True)


def test_normalization_none_has_no_layernorm_parameters_or_hooks_and_is_the_identity():
    model = toy(normalization_type=None)
    assert not [k for k in list(model.state_dict()) + list(model.hook_dict) if ".ln" in k or k.startswith("ln_")]
    x = torch.randn(2, 5, 32)
    assert torch.equal(model.blocks[0].ln1(x), x) and torch.equal(model.ln_final(x), x)
    logits, cache = model.run_with_cache(tokens())
    torch.testing.assert_close(logits, model.unembed(cache["resid_post", 1]))  # no final LayerNorm
    with pytest.raises(KeyError, match="normalization_type=None"):
        model.add_hook("ln_final.hook_scale", lambda t, hook: t)


@pytest.mark.parametrize("norm", ["LN", None])
def test_shortformer_positions_reach_queries_and_keys_only(norm):
    model = toy(positional_embedding_type="shortformer", normalization_type=norm)
    toks = tokens()
    logits, cache = model.run_with_cache(toks)
    # The residual stream carries no position: it starts as the token embedding alone.
    torch.testing.assert_close(cache["resid_pre", 0], cache["hook_embed"])
    assert cache["hook_pos_embed"].abs().max() > 0
    # Values ignore position: changing W_pos changes the queries and keys of layer 0, not its values.
    moved = toy(positional_embedding_type="shortformer", normalization_type=norm)
    with torch.no_grad():
        moved.pos_embed.W_pos.add_(1.0)
    _, moved_cache = moved.run_with_cache(toks)
    torch.testing.assert_close(moved_cache["v", 0], cache["v", 0])
    assert not torch.allclose(moved_cache["q", 0], cache["q", 0]) and not torch.allclose(
        moved_cache["k", 0], cache["k", 0]
    )
    # q = (ln1(resid) + pos_embed) W_Q + b_Q, by hand.
    ln = cache["blocks.0.ln1.hook_normalized"] * model.blocks[0].ln1.w if norm else cache["resid_pre", 0]
    ln = ln + model.blocks[0].ln1.b if norm else ln
    q = torch.einsum("bpd,hde->bphe", ln + cache["hook_pos_embed"], model.blocks[0].attn.W_Q) + model.blocks[0].attn.b_Q
    torch.testing.assert_close(cache["q", 0], q)
    # Starting at a layer recomputes the positions (TL would need them passed in).
    torch.testing.assert_close(model(cache["resid_pre", 1], start_at_layer=1), logits)


def test_shortformer_generation_with_the_kv_cache_matches_the_full_forward():
    model = toy(positional_embedding_type="shortformer", normalization_type=None, attn_only=True)
    toks = tokens()[:1]
    kw = dict(max_new_tokens=5, do_sample=False, verbose=False, stop_at_eos=False)
    out = model.generate(toks, use_past_kv_cache=True, **kw)
    again = model.generate(toks, use_past_kv_cache=False, **kw)
    assert torch.equal(out, again)


def test_cache_decompositions_of_an_attention_only_shortformer_model_sum_to_the_stream():
    model = toy(attn_only=True, normalization_type=None, positional_embedding_type="shortformer", use_attn_result=True)
    _, cache = model.run_with_cache(tokens())
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "0_attn_out", "1_attn_out"]  # no pos_embed: it never enters the stream
    torch.testing.assert_close(parts.sum(0), cache["resid_post", 1])
    acc, acc_labels = cache.accumulated_resid(return_labels=True, apply_ln=True)
    assert acc_labels == ["0_pre", "1_pre", "final_post"]
    torch.testing.assert_close(acc[-1], cache["resid_post", 1])  # no LayerNorm: apply_ln changes nothing
    full, full_labels = cache.get_full_resid_decomposition(return_labels=True)
    assert full_labels[-2:] == ["embed", "bias"] and len(full_labels) == 2 * 4 + 2
    torch.testing.assert_close(full.sum(0), cache["resid_post", 1])
    heads = cache.stack_head_results()
    torch.testing.assert_close(heads.sum(0) + cache["embed"] + model.accumulated_bias(2), cache["resid_post", 1])


def test_processing_refuses_or_skips_what_would_change_a_toy_model():
    from interp_gpt.checkpoints.processing import center_writing_weights, fold_layer_norm, process_weights

    for kw, match in [
        (dict(normalization_type=None), "normalization_type=None"),
        (dict(positional_embedding_type="shortformer"), "shortformer"),
    ]:
        model = toy(**kw)
        sd = {k: v.detach().clone() for k, v in model.named_parameters()}
        with pytest.raises(ValueError, match=match):
            center_writing_weights(sd, model.cfg)
        cfg = dataclasses.replace(model.cfg)
        with pytest.warns(UserWarning, match="skipped fold_ln, center_writing_weights"):
            process_weights(sd, cfg)
    model = toy(positional_embedding_type="shortformer")
    with pytest.raises(ValueError, match="shortformer"):
        fold_layer_norm({k: v.detach().clone() for k, v in model.named_parameters()}, model.cfg)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(normalization_type="RMS"), "normalization_type='RMS'"),
        (dict(positional_embedding_type="rotary"), "positional_embedding_type='rotary'"),
        (dict(attn_only="yes"), "attn_only must be True or False"),
        (dict(attn_only=True, use_hook_mlp_in=True), "use_hook_mlp_in=True with attn_only=True"),
    ],
)
def test_bad_toy_config_values_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**SMALL, **kw)


def test_a_toy_model_cannot_be_saved_in_or_read_as_hugging_faces_gpt2_layout():
    from interp_gpt.checkpoints.convert import convert_to_hf_gpt2_state_dict

    with pytest.raises(CheckpointError, match="attn_only=True"):
        convert_to_hf_gpt2_state_dict(toy(attn_only=True))


def test_direct_logit_attribution_and_attention_patching_work_on_arenas_toy_model():
    from interp_gpt import patching
    from interp_gpt.inspect import direct_logit_attribution

    model = toy(attn_only=True, normalization_type=None, positional_embedding_type="shortformer")
    toks = tokens()
    logits, cache = model.run_with_cache(toks)
    attrs, labels = direct_logit_attribution(cache, 3, 4, pos=-1, batch=0)
    assert labels[:2] == ["embed", "L0H0"] and not [x for x in labels if "MLP" in x or x == "pos_embed"]
    torch.testing.assert_close(attrs.sum(), logits[0, -1, 3] - logits[0, -1, 4])
    corrupted = toks.flip(-1)

    def metric(lg: torch.Tensor) -> torch.Tensor:
        return lg[:, -1, 3].mean()

    heads = patching.get_act_patch_attn_head_out_all_pos(model, corrupted, cache, metric)

    def patch_z(z: torch.Tensor, hook) -> torch.Tensor:  # type: ignore[no-untyped-def]
        z[:, :, 2] = cache["z", 1][:, :, 2]
        return z

    by_hand = metric(model.run_with_hooks(corrupted, fwd_hooks=[("blocks.1.attn.hook_z", patch_z)]))
    assert heads.shape == (2, 4) and torch.allclose(heads[1, 2], by_hand, atol=1e-5)
    resid = patching.get_act_patch_resid_pre(model, corrupted, cache, metric)
    assert resid.shape == (2, toks.shape[1])

    # Patching resid_pre 0 at the last position: the last token's embedding alone is clean.
    def patch_last(r: torch.Tensor, hook) -> torch.Tensor:  # type: ignore[no-untyped-def]
        r[:, -1] = cache["resid_pre", 0][:, -1]
        return r

    by_hand = metric(model.run_with_hooks(corrupted, fwd_hooks=[("blocks.0.hook_resid_pre", patch_last)]))
    assert torch.allclose(resid[0, -1], by_hand, atol=1e-5)
    with pytest.raises(KeyError, match="attn_only=True"):
        patching.get_act_patch_mlp_out(model, corrupted, cache, metric)


@pytest.mark.parametrize("attn_only, norm, pos, extra", CASES, ids=IDS)
def test_the_loader_expects_the_shapes_model_py_declares_for_toy_models(attn_only, norm, pos, extra):
    from interp_gpt.checkpoints.convert import _expected_shapes

    model = GPT(Config(**SMALL, attn_only=attn_only, normalization_type=norm, positional_embedding_type=pos))
    assert _expected_shapes(model.cfg) == {k: tuple(p.shape) for k, p in model.named_parameters()}


def test_what_an_attention_only_model_lacks_is_refused_by_name():
    model = toy(attn_only=True, normalization_type=None)
    _, cache = model.run_with_cache(tokens())
    with pytest.raises(ValueError, match="W_in: this model has attn_only=True"):
        model.W_in  # noqa: B018
    with pytest.raises(ValueError, match="incl_mid=True: this model has attn_only=True"):
        cache.accumulated_resid(incl_mid=True)
    with pytest.raises(ValueError, match="mlp_input=True: this model has attn_only=True"):
        cache.decompose_resid(layer=1, mlp_input=True)
    with pytest.raises(KeyError, match="attn_only=True"):
        cache["mlp_out", 0]
    # logit_attrs needs no LayerNorm scale here: the attributions sum to the logit minus b_U.
    parts = cache.decompose_resid(pos_slice=-1)
    attrs = cache.logit_attrs(parts, tokens=3, pos_slice=-1)
    logits = model(tokens())
    torch.testing.assert_close(attrs.sum(0), logits[:, -1, 3] - model.unembed.b_U[3])
