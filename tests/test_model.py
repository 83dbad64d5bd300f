"""The model itself: hook shapes, the forward pass against a plain-torch reference,
return types, partial runs, padding, opt-in hooks and bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from interp_gpt import GPT, Config

B, P = 2, 7  # the tiny_tokens batch


# ----------------------------------------------------------------------------
# A plain-torch GPT-2, written from the parameters (no einops, no hooks)
# ----------------------------------------------------------------------------
def reference_logits(model: GPT, tokens: torch.Tensor) -> torch.Tensor:
    """GPT-2's forward pass from the state dict, with torch.matmul and F.layer_norm."""
    cfg = model.cfg
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    d, eps = cfg.d_model, cfg.layer_norm_eps
    p = tokens.shape[1]
    x = sd["embed.W_E"][tokens] + sd["pos_embed.W_pos"][:p]  # [b, p, d]
    causal = torch.ones(p, p, dtype=torch.bool).tril()
    for L in range(cfg.n_layers):
        s = lambda name, L=L: sd[f"blocks.{L}.{name}"]  # noqa: E731
        h = F.layer_norm(x, (d,), s("ln1.w"), s("ln1.b"), eps)[:, None]  # [b, 1, p, d]
        q = torch.matmul(h, s("attn.W_Q")) + s("attn.b_Q")[:, None]  # [b, head, p, d_head]
        k = torch.matmul(h, s("attn.W_K")) + s("attn.b_K")[:, None]
        v = torch.matmul(h, s("attn.W_V")) + s("attn.b_V")[:, None]
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(cfg.d_head)  # [b, head, q, k]
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        z = torch.matmul(pattern, v)  # [b, head, p, d_head]
        x = x + torch.matmul(z, s("attn.W_O")).sum(1) + s("attn.b_O")
        h = F.layer_norm(x, (d,), s("ln2.w"), s("ln2.b"), eps)
        x = (
            x
            + torch.matmul(F.gelu(torch.matmul(h, s("mlp.W_in")) + s("mlp.b_in"), approximate="tanh"), s("mlp.W_out"))
            + s("mlp.b_out")
        )
    x = F.layer_norm(x, (d,), sd["ln_final.w"], sd["ln_final.b"], eps)
    return torch.matmul(x, sd["unembed.W_U"]) + sd["unembed.b_U"]


def expected_hook_shapes(cfg: Config, b: int, p: int) -> dict[str, tuple[int, ...]]:
    """DESIGN.md's list of default hook points and their shapes."""
    d, h, dh, dm, V = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.d_vocab
    shapes: dict[str, tuple[int, ...]] = {"hook_embed": (b, p, d), "hook_pos_embed": (b, p, d)}
    for L in range(cfg.n_layers):
        q = f"blocks.{L}."
        shapes |= {
            q + "hook_resid_pre": (b, p, d),
            q + "ln1.hook_scale": (b, p, 1),
            q + "ln1.hook_normalized": (b, p, d),
            q + "attn.hook_q": (b, p, h, dh),
            q + "attn.hook_k": (b, p, h, dh),
            q + "attn.hook_v": (b, p, h, dh),
            q + "attn.hook_attn_scores": (b, h, p, p),
            q + "attn.hook_pattern": (b, h, p, p),
            q + "attn.hook_z": (b, p, h, dh),
            q + "hook_attn_out": (b, p, d),
            q + "hook_resid_mid": (b, p, d),
            q + "ln2.hook_scale": (b, p, 1),
            q + "ln2.hook_normalized": (b, p, d),
            q + "mlp.hook_pre": (b, p, dm),
            q + "mlp.hook_post": (b, p, dm),
            q + "hook_mlp_out": (b, p, d),
            q + "hook_resid_post": (b, p, d),
        }
    shapes |= {
        "ln_final.hook_scale": (b, p, 1),
        "ln_final.hook_normalized": (b, p, d),
        "unembed.hook_in": (b, p, d),
        "unembed.hook_out": (b, p, V),
    }
    return shapes


# ----------------------------------------------------------------------------
# Hooks: names, shapes, attention internals
# ----------------------------------------------------------------------------
def test_every_default_hook_exists_with_design_shape(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    expected = expected_hook_shapes(tiny_model.cfg, B, P)
    assert set(cache) == set(expected)
    assert set(tiny_model.hook_dict) == set(expected)
    for name, shape in expected.items():
        assert tuple(cache[name].shape) == shape, name


def test_attn_scores_are_scaled_qk_below_diagonal_and_minus_inf_above(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    above = torch.ones(P, P, dtype=torch.bool).triu(1)
    for L in range(tiny_model.cfg.n_layers):
        q = cache[f"blocks.{L}.attn.hook_q"].transpose(1, 2)  # [b, head, p, d_head]
        k = cache[f"blocks.{L}.attn.hook_k"].transpose(1, 2)
        want = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(tiny_model.cfg.d_head)
        scores = cache[f"blocks.{L}.attn.hook_attn_scores"]
        assert torch.isneginf(scores[..., above]).all()
        torch.testing.assert_close(scores[..., ~above], want[..., ~above], atol=1e-5, rtol=1e-5)


def test_pattern_rows_sum_to_one_and_are_softmax_of_scores(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    for L in range(tiny_model.cfg.n_layers):
        pattern = cache["pattern", L]
        torch.testing.assert_close(pattern.sum(-1), torch.ones(B, 4, P), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(pattern, cache["attn_scores", L].softmax(-1))
        assert (pattern.triu(1) == 0).all()


def test_layernorm_hooks_scale_and_normalized_match_definition(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    x = cache["blocks.1.hook_resid_mid"]
    centred = x - x.mean(-1, keepdim=True)
    scale = (centred.pow(2).mean(-1, keepdim=True) + tiny_model.cfg.layer_norm_eps).sqrt()
    torch.testing.assert_close(cache["blocks.1.ln2.hook_scale"], scale)
    torch.testing.assert_close(cache["blocks.1.ln2.hook_normalized"], centred / scale)


def test_residual_stream_adds_up(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], cache["hook_embed"] + cache["hook_pos_embed"])
    for L in range(2):
        torch.testing.assert_close(cache["resid_mid", L], cache["resid_pre", L] + cache["attn_out", L])
        torch.testing.assert_close(cache["resid_post", L], cache["resid_mid", L] + cache["mlp_out", L])


# ----------------------------------------------------------------------------
# Forward pass against the reference
# ----------------------------------------------------------------------------
def test_logits_match_plain_torch_reference(tiny_model, tiny_tokens):
    logits = tiny_model(tiny_tokens)
    assert logits.shape == (B, P, 100)
    torch.testing.assert_close(logits, reference_logits(tiny_model, tiny_tokens), atol=1e-5, rtol=1e-5)


def test_one_dimensional_tokens_are_a_batch_of_one(tiny_model, tiny_tokens):
    torch.testing.assert_close(tiny_model(tiny_tokens[1]), tiny_model(tiny_tokens[1:2]))


@pytest.mark.parametrize("act_fn", ["gelu", "relu", "gelu_fast"])
def test_other_activation_functions_follow_their_definition(tiny_model, tiny_tokens, act_fn):
    reference = {"gelu": F.gelu, "relu": F.relu, "gelu_fast": lambda x: F.gelu(x, approximate="tanh")}[act_fn]
    model = GPT(Config(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=32, act_fn=act_fn))
    model.load_state_dict(tiny_model.state_dict())
    _, cache = model.run_with_cache(tiny_tokens)
    torch.testing.assert_close(cache["post", 0], reference(cache["pre", 0]), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------
# return_type and loss
# ----------------------------------------------------------------------------
def test_loss_is_cross_entropy_of_shifted_logits(tiny_model, tiny_tokens):
    logits = tiny_model(tiny_tokens)
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 100), tiny_tokens[:, 1:].reshape(-1))
    torch.testing.assert_close(tiny_model(tiny_tokens, return_type="loss"), want)


def test_loss_per_token_has_shape_batch_by_posn_minus_one(tiny_model, tiny_tokens):
    logits = tiny_model(tiny_tokens)
    per_token = tiny_model(tiny_tokens, return_type="loss", loss_per_token=True)
    assert per_token.shape == (B, P - 1)
    want = F.cross_entropy(logits[:, :-1].transpose(1, 2), tiny_tokens[:, 1:], reduction="none")
    torch.testing.assert_close(per_token, want)


def test_return_type_both_gives_logits_and_loss(tiny_model, tiny_tokens):
    out = tiny_model(tiny_tokens, return_type="both")
    assert isinstance(out, tuple) and len(out) == 2
    torch.testing.assert_close(out[0], tiny_model(tiny_tokens))
    torch.testing.assert_close(out[1], tiny_model(tiny_tokens, return_type="loss"))


def test_return_type_none_returns_none_but_runs_hooks(tiny_model, tiny_tokens):
    seen = []
    out = tiny_model.run_with_hooks(
        tiny_tokens, return_type=None, fwd_hooks=[("unembed.hook_out", lambda t, hook: seen.append(t.shape))]
    )
    assert out is None
    assert seen == [torch.Size([B, P, 100])]


# ----------------------------------------------------------------------------
# start_at_layer / stop_at_layer
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("stop", [0, 1])
def test_stop_at_layer_returns_that_layers_resid_pre(tiny_model, tiny_tokens, stop):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    torch.testing.assert_close(tiny_model(tiny_tokens, stop_at_layer=stop), cache[f"blocks.{stop}.hook_resid_pre"])


def test_negative_stop_at_layer_counts_from_the_end(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    torch.testing.assert_close(tiny_model(tiny_tokens, stop_at_layer=-1), cache["blocks.1.hook_resid_pre"])
    torch.testing.assert_close(tiny_model(tiny_tokens, stop_at_layer=-2), cache["blocks.0.hook_resid_pre"])


@pytest.mark.parametrize("start", [0, 1, -1])
def test_start_at_layer_from_cached_resid_reproduces_logits(tiny_model, tiny_tokens, start):
    logits, cache = tiny_model.run_with_cache(tiny_tokens)
    resid = cache["resid_pre", start]
    torch.testing.assert_close(tiny_model(resid, start_at_layer=start), logits, atol=1e-6, rtol=1e-6)


def test_start_at_layer_with_tokens_gives_the_same_loss(tiny_model, tiny_tokens):
    loss, cache = tiny_model.run_with_cache(tiny_tokens, return_type="loss")
    again = tiny_model(cache["resid_pre", 1], start_at_layer=1, tokens=tiny_tokens, return_type="loss")
    torch.testing.assert_close(again, loss)


@pytest.mark.parametrize(
    "kwargs", [{"stop_at_layer": 3}, {"start_at_layer": 3}, {"stop_at_layer": -3}, {"start_at_layer": -3}]
)
def test_out_of_range_start_or_stop_layer_raises(tiny_model, tiny_tokens, kwargs):
    x = tiny_model(tiny_tokens, stop_at_layer=0) if "start_at_layer" in kwargs else tiny_tokens
    arg = next(iter(kwargs))
    with pytest.raises(ValueError, match=rf"{arg}.*layers are 0\.\.1"):
        tiny_model(x, **kwargs)


# ----------------------------------------------------------------------------
# Padding
# ----------------------------------------------------------------------------
LENGTHS = (5, 8, 3)


def _padded_batch(side: str) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 100, (n,), generator=gen) for n in LENGTHS]
    width = max(LENGTHS)
    tokens = torch.full((len(prompts), width), 17)  # 17: an arbitrary pad id; the mask decides
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, t in enumerate(prompts):
        sl = slice(0, len(t)) if side == "right" else slice(width - len(t), width)
        tokens[i, sl], mask[i, sl] = t, 1
    return prompts, tokens, mask


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_gives_each_prompt_its_solo_logits(tiny_model, side):
    prompts, tokens, mask = _padded_batch(side)
    logits = tiny_model(tokens, attention_mask=mask)
    assert torch.isfinite(logits).all()
    for i, t in enumerate(prompts):
        real = mask[i].bool()
        torch.testing.assert_close(logits[i, real], tiny_model(t[None])[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_loss_is_token_weighted_mean_of_solo_losses(tiny_model, side):
    prompts, tokens, mask = _padded_batch(side)
    solo = [tiny_model(t[None], return_type="loss") for t in prompts]
    counts = [len(t) - 1 for t in prompts]
    want = sum(loss * n for loss, n in zip(solo, counts, strict=True)) / sum(counts)
    torch.testing.assert_close(tiny_model(tokens, attention_mask=mask, return_type="loss"), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_per_token_loss_matches_solo_and_is_zero_on_padding(tiny_model, side):
    prompts, tokens, mask = _padded_batch(side)
    per_token = tiny_model(tokens, attention_mask=mask, return_type="loss", loss_per_token=True)
    valid = (mask[:, 1:] * mask[:, :-1]).bool()
    assert (per_token[~valid] == 0).all()
    for i, t in enumerate(prompts):
        solo = tiny_model(t[None], return_type="loss", loss_per_token=True)[0]
        torch.testing.assert_close(per_token[i, valid[i]], solo, atol=1e-5, rtol=1e-5)


def test_padded_loss_has_finite_gradients(tiny_model):
    # Left padding gives padding queries a row with nothing to attend to; no NaN may leak.
    _, tokens, mask = _padded_batch("left")
    tiny_model(tokens, attention_mask=mask, return_type="loss").backward()
    for name, p in tiny_model.named_parameters():
        assert torch.isfinite(p.grad).all(), name


def test_padded_start_at_layer_matches_full_run(tiny_model):
    _, tokens, mask = _padded_batch("left")
    logits, cache = tiny_model.run_with_cache(tokens, attention_mask=mask)
    again = tiny_model(cache["resid_pre", 1], start_at_layer=1, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(again[real], logits[real], atol=1e-6, rtol=1e-6)


# ----------------------------------------------------------------------------
# Opt-in hooks
# ----------------------------------------------------------------------------
OPT_IN_FLAGS = ("use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in", "use_hook_tokens")


def _opt_in_shapes(cfg: Config, flags: set[str]) -> dict[str, tuple[int, ...]]:
    d, h = cfg.d_model, cfg.n_heads
    out: dict[str, tuple[int, ...]] = {}
    if "use_hook_tokens" in flags:
        out["hook_tokens"] = (B, P)
    for L in range(cfg.n_layers):
        q = f"blocks.{L}."
        if "use_attn_result" in flags:
            out[q + "attn.hook_result"] = (B, P, h, d)
        if "use_split_qkv_input" in flags:
            out |= {q + f"hook_{x}_input": (B, P, h, d) for x in "qkv"}
        if "use_attn_in" in flags:
            out[q + "hook_attn_in"] = (B, P, h, d)
        if "use_hook_mlp_in" in flags:
            out[q + "hook_mlp_in"] = (B, P, d)
    return out


@pytest.mark.parametrize("flags", [(f,) for f in OPT_IN_FLAGS] + [OPT_IN_FLAGS], ids=[*OPT_IN_FLAGS, "all"])
def test_opt_in_hooks_exist_with_right_shapes_and_leave_logits_unchanged(tiny_model, tiny_tokens, flags):
    cfg = Config(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=32, **{f: True for f in flags})
    model = GPT(cfg)
    model.load_state_dict(tiny_model.state_dict(), strict=True)
    logits, cache = model.run_with_cache(tiny_tokens)
    extra = _opt_in_shapes(cfg, set(flags))
    assert set(cache) == set(expected_hook_shapes(cfg, B, P)) | set(extra)
    for name, shape in extra.items():
        assert tuple(cache[name].shape) == shape, name
    torch.testing.assert_close(logits, tiny_model(tiny_tokens), atol=1e-5, rtol=1e-5)


def test_opt_in_hooks_are_absent_when_flags_are_off(tiny_model):
    for name in _opt_in_shapes(tiny_model.cfg, set(OPT_IN_FLAGS)):
        assert name not in tiny_model.hook_dict


def test_head_results_sum_with_b_O_to_attn_out(tiny_model, tiny_tokens):
    tiny_model.set_use_attn_result(True)
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    for L in range(2):
        summed = cache["result", L].sum(dim=2) + tiny_model.blocks[L].attn.b_O
        torch.testing.assert_close(summed, cache["attn_out", L], atol=1e-6, rtol=1e-6)


def test_asking_for_hook_result_with_flag_off_names_the_flag(tiny_model, tiny_tokens):
    with pytest.raises(KeyError, match="use_attn_result"):
        tiny_model.run_with_cache(tiny_tokens, names_filter="blocks.0.attn.hook_result")
    with pytest.raises(KeyError, match="use_attn_result"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.attn.hook_result", lambda t, hook: None)])


def test_set_use_attn_result_switches_the_hook_on_and_off(tiny_model, tiny_tokens):
    tiny_model.set_use_attn_result(True)
    assert "blocks.1.attn.hook_result" in tiny_model.hook_dict
    tiny_model.set_use_attn_result(False)
    assert "blocks.1.attn.hook_result" not in tiny_model.hook_dict
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    assert "blocks.1.attn.hook_result" not in cache


def test_patching_one_heads_q_input_changes_only_what_reads_queries(tiny_model, tiny_tokens):
    tiny_model.set_use_split_qkv_input(True)
    _, clean = tiny_model.run_with_cache(tiny_tokens)

    def bump_head_2(x, hook):
        x = x.clone()
        x[:, :, 2] += 1.0
        return x

    with tiny_model.hooks(fwd_hooks=[("blocks.0.hook_q_input", bump_head_2)]):
        _, cache = tiny_model.run_with_cache(tiny_tokens)
    q, q0 = cache["q", 0], clean["q", 0]
    assert not torch.allclose(q[:, :, 2], q0[:, :, 2])
    torch.testing.assert_close(q[:, :, [0, 1, 3]], q0[:, :, [0, 1, 3]])
    torch.testing.assert_close(cache["k", 0], clean["k", 0])
    torch.testing.assert_close(cache["v", 0], clean["v", 0])


# ----------------------------------------------------------------------------
# Bad input: each a clear error
# ----------------------------------------------------------------------------
def test_token_id_beyond_vocabulary_names_the_id_and_the_vocab_size(tiny_model):
    tokens = torch.tensor([[1, 2, 150, 3]])
    with pytest.raises(ValueError, match=r"150.*\b100\b"):
        tiny_model(tokens)


def test_negative_token_id_is_rejected(tiny_model):
    with pytest.raises(ValueError, match=r"-1\b"):
        tiny_model(torch.tensor([[1, -1, 2]]))


def test_sequence_longer_than_context_names_both_lengths(tiny_model):
    with pytest.raises(ValueError, match=r"33.*32"):
        tiny_model(torch.zeros(1, 33, dtype=torch.long))


def test_float_tokens_are_a_type_error(tiny_model):
    with pytest.raises(TypeError, match="integer"):
        tiny_model(torch.zeros(1, 4))


def test_three_dimensional_tokens_are_rejected_with_their_shape(tiny_model):
    with pytest.raises(ValueError, match=r"\(1, 2, 3\)"):
        tiny_model(torch.zeros(1, 2, 3, dtype=torch.long))


def test_empty_sequence_is_rejected(tiny_model):
    with pytest.raises(ValueError, match="empty"):
        tiny_model(torch.zeros(1, 0, dtype=torch.long))


def test_string_input_without_tokenizer_says_tokenizer(tiny_model):
    assert tiny_model.tokenizer is None
    with pytest.raises(ValueError, match="tokenizer"):
        tiny_model("Hello world")


def test_bad_return_type_is_rejected(tiny_model, tiny_tokens):
    with pytest.raises(ValueError, match=r"return_type='logit'"):
        tiny_model(tiny_tokens, return_type="logit")


def test_attention_mask_of_wrong_shape_names_both_shapes(tiny_model, tiny_tokens):
    with pytest.raises(ValueError, match=r"attention_mask.*\(2, 7\).*\(2, 6\)"):
        tiny_model(tiny_tokens, attention_mask=torch.ones(2, 6, dtype=torch.long))


def test_start_at_layer_with_token_ids_is_rejected(tiny_model, tiny_tokens):
    with pytest.raises(ValueError, match="residual stream"):
        tiny_model(tiny_tokens, start_at_layer=1)


def test_loss_from_start_at_layer_without_tokens_is_rejected(tiny_model, tiny_tokens):
    resid = tiny_model(tiny_tokens, stop_at_layer=1)
    with pytest.raises(ValueError, match="tokens="):
        tiny_model(resid, start_at_layer=1, return_type="loss")


# ----------------------------------------------------------------------------
# The full GPT-2-small shape, once
# ----------------------------------------------------------------------------
def test_default_config_has_gpt2_small_shape_and_parameter_count():
    cfg = Config()
    # Derived by hand from GPT-2 small (12 layers, 768 wide, 3072 MLP, 1024 positions, 50257 tokens):
    d, dm, V, n_ctx, n_layers = 768, 3072, 50257, 1024, 12
    per_layer = (2 * d) + (4 * d * d + 4 * d) + (2 * d) + (d * dm + dm + dm * d + d)
    hf_gpt2_small = V * d + n_ctx * d + n_layers * per_layer + 2 * d  # tied lm_head: no extra tensor
    assert hf_gpt2_small == 124_439_808  # the well-known GPT-2 small count
    ours = hf_gpt2_small + d * V + V  # we keep an untied W_U [768, 50257] and a b_U [50257]
    assert ours == 163_087_441

    with torch.device("meta"):  # shapes only: no memory, no init time
        model = GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == ours
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.n_ctx) == (12, 768, 12, 64, 3072, 1024)
    assert model.W_U.shape == (768, 50257) and model.W_Q.shape == (12, 12, 768, 64)
    assert len([n for n in model.hook_dict if n.startswith("blocks.11.")]) == 17


def test_gpt2_small_shaped_model_runs_with_design_hook_shapes():
    model = GPT(Config())  # real weights (random): ~2 s to initialise
    tokens = torch.tensor([[464, 50256, 0, 13]])
    names = ["blocks.11.attn.hook_pattern", "blocks.11.attn.hook_z", "blocks.11.mlp.hook_post", "ln_final.hook_scale"]
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=names)
    assert logits.shape == (1, 4, 50257)
    assert [tuple(cache[n].shape) for n in names] == [(1, 12, 4, 4), (1, 4, 12, 64), (1, 4, 3072), (1, 4, 1)]


# ----------------------------------------------------------------------------
# Fast paths: fused attention / LayerNorm when nobody hooks their insides
# ----------------------------------------------------------------------------
def _pattern_hook_counts(model):
    return sum(len(model.hook_dict[f"blocks.{L}.attn.hook_pattern"].fwd_hooks) for L in range(model.cfg.n_layers))


@pytest.mark.parametrize("padded", [False, True], ids=["plain", "left-padded"])
def test_fused_and_hooked_paths_agree(tiny_model, tiny_tokens, padded):
    mask = None
    if padded:
        mask = torch.ones_like(tiny_tokens)
        mask[0, :3] = 0  # the first prompt is left-padded
    with torch.no_grad():
        fast = tiny_model(tiny_tokens, attention_mask=mask)
        _, cache = tiny_model.run_with_cache(tiny_tokens, attention_mask=mask)  # every hook: the explicit path
        slow = cache["unembed.hook_out"]
        # Attaching one hook to one pattern switches that layer's path and changes nothing else.
        seen = []
        hooked = tiny_model.run_with_hooks(
            tiny_tokens,
            attention_mask=mask,
            fwd_hooks=[("blocks.1.attn.hook_pattern", lambda p, hook: seen.append(p.shape))],
        )
    assert seen == [(2, tiny_model.cfg.n_heads, 7, 7)]
    assert _pattern_hook_counts(tiny_model) == 0
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fast, hooked, atol=1e-5, rtol=1e-4)
    assert not torch.equal(fast, tiny_model.unembed.b_U.expand_as(fast))  # the comparison is not vacuous


def test_fused_layer_norm_matches_hooked_one(tiny_model, tiny_tokens):
    x = torch.randn(2, 7, tiny_model.cfg.d_model, generator=torch.Generator().manual_seed(3)) * 3 + 1
    ln = tiny_model.blocks[0].ln1
    fast = ln(x)
    with tiny_model.hooks(fwd_hooks=[("blocks.0.ln1.hook_scale", lambda t, hook: None)]):
        slow = ln(x)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_gelu_new_is_gpt2s_tanh_formula():
    from interp_gpt.model import gelu_new

    x = torch.linspace(-8, 8, 10001, dtype=torch.float64)
    written_out = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(gelu_new(x), written_out, atol=1e-12, rtol=0)


@pytest.mark.parametrize("shape", [(1, 1), (3, 7)])
def test_q_k_v_projections_equal_the_einsum_and_copy_no_weights(tiny_model, shape):
    """project() computes "batch posn d_model, n_heads d_model d_head" with heads as a batch
    axis, so W_Q/W_K/W_V are read where they lie: no copy of a weight per call (one token
    per step in generation paid a full copy of all three before)."""
    from torch.profiler import ProfilerActivity, profile

    attn = tiny_model.blocks[0].attn
    x = torch.randn(*shape, tiny_model.cfg.d_model)
    expected = torch.einsum("bpd,hde->bphe", x, attn.W_Q) + attn.b_Q
    with torch.inference_mode():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = attn.project(x, attn.W_Q, attn.b_Q)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    copies = [e.key for e in prof.key_averages() if e.key in ("aten::copy_", "aten::clone", "aten::contiguous")]
    assert copies == [], f"project() copied something: {copies}"


@pytest.mark.parametrize("d_vocab, shape", [(5000, (2, 40)), (4097, (1, 64)), (5000, (1, 63))])
def test_unembed_gives_the_plain_einsum_on_every_path(d_vocab, shape):
    """Without autograd, on the CPU, for 64+ positions and a vocabulary over 4,096 the unembed
    computes its matmul a vocabulary slice at a time (the last slice partial here); with
    autograd on, or a short input, in one einsum. Each equals x @ W_U + b_U, and a hook on
    hook_out sees the same logits."""
    torch.manual_seed(0)
    unembed = GPT(Config(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, n_ctx=64, d_vocab=d_vocab)).unembed
    torch.nn.init.normal_(unembed.W_U)
    torch.nn.init.normal_(unembed.b_U)
    x = torch.randn(*shape, 16)
    expected = x @ unembed.W_U.detach() + unembed.b_U.detach()
    seen = []
    unembed.hook_out.add_hook(lambda t, hook: seen.append(t.clone()))
    with torch.inference_mode():
        sliced = unembed(x)
    with_grad = unembed(x)
    unembed.hook_out.remove_hooks()
    torch.testing.assert_close(sliced, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(with_grad, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen[0], expected, rtol=1e-5, atol=1e-5)
    assert with_grad.requires_grad


@pytest.mark.parametrize("act_fn", ["gelu_new", "gelu", "relu", "gelu_fast"])
def test_in_place_bias_and_activation_give_the_autograd_paths_logits(tiny_model, tiny_tokens, act_fn):
    """Without autograd, biases are added into the fresh matmul outputs and the MLP's
    activation overwrites an unhooked hook_pre; with autograd on, both make new tensors.
    The logits are the same, and on the autograd path match a plain-torch reference."""
    model = GPT(Config(**{**tiny_model.cfg.__dict__, "act_fn": act_fn}))
    model.load_state_dict(tiny_model.state_dict())
    with torch.inference_mode():
        in_place = model(tiny_tokens)
    with_grad = model(tiny_tokens)
    assert with_grad.requires_grad
    torch.testing.assert_close(in_place, with_grad.detach(), atol=1e-6, rtol=1e-6)
    if act_fn == "gelu_new":
        torch.testing.assert_close(with_grad.detach(), reference_logits(model, tiny_tokens), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_hook_pre_keeps_the_pre_activation_when_the_activation_runs_in_place(tiny_model, tiny_tokens, mode):
    """The activation overwrites hook_pre's tensor only when nothing hooks hook_pre: a cached
    or stored pre-activation is never turned into the post-activation behind a user's back."""
    mlp = tiny_model.blocks[1].mlp
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with context():
        _, cache = tiny_model.run_with_cache(
            tiny_tokens,
            names_filter=lambda n: n.startswith("blocks.1.") and "mlp" in n or n.endswith("1.ln2.hook_normalized"),
        )
        kept = []  # a hook that keeps a reference, no clone
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.1.mlp.hook_pre", lambda t, hook: kept.append(t))])
        _, post_only = tiny_model.run_with_cache(tiny_tokens, names_filter="blocks.1.mlp.hook_post")
    ln2 = tiny_model.blocks[1].ln2
    x = cache["blocks.1.ln2.hook_normalized"] * ln2.w.detach() + ln2.b.detach()
    pre = x @ mlp.W_in.detach() + mlp.b_in.detach()
    post = F.gelu(pre, approximate="tanh")
    assert not torch.allclose(pre, post)  # the check below can tell them apart
    torch.testing.assert_close(cache["pre", 1], pre, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kept[0], pre, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["post", 1], post, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(post_only["post", 1], post, atol=1e-5, rtol=1e-5)


def test_add_bias_promotes_like_plus_when_dtypes_differ():
    """Under autocast a matmul output can be bfloat16 while the bias stays float32: the
    in-place add would fail (or round), so add_bias falls back to x + b there."""
    from interp_gpt.model import add_bias

    x = torch.randn(3, 5).to(torch.bfloat16)
    b = torch.randn(5)
    with torch.inference_mode():
        out = add_bias(x.clone(), b)
        same = x.float().clone()
        out_same = add_bias(same, b)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x + b, atol=0, rtol=0)
    assert out_same.data_ptr() == same.data_ptr()  # same dtype: written in place
    torch.testing.assert_close(out_same, x.float() + b, atol=0, rtol=0)


def test_inference_mode_adds_biases_and_runs_the_activation_in_place(tiny_model, tiny_tokens):
    """The in-place ops are really taken (what makes them worth having: no d_mlp-sized tensor
    per layer for the activation, no new tensor per bias) and not under autograd."""
    from torch.profiler import ProfilerActivity, profile

    def ops(grad: bool) -> set[str]:
        with torch.set_grad_enabled(grad), profile(activities=[ProfilerActivity.CPU]) as prof:
            tiny_model(tiny_tokens)
        return {e.key for e in prof.key_averages()}

    without, with_grad = ops(False), ops(True)
    assert "aten::gelu_" in without and "aten::gelu" not in without
    assert "aten::add_" in without
    assert "aten::gelu" in with_grad and "aten::gelu_" not in with_grad


@pytest.mark.parametrize("side", ["left", "right"])
def test_hooked_attention_path_with_padding_has_no_nan_and_the_fast_paths_logits(tiny_model, side):
    """A hook on hook_pattern switches to the written-out attention (scaled q, mask filled in
    place, NaN rows of padding queries zeroed); its logits equal the fused path's."""
    _, tokens, mask = _padded_batch(side)
    fast = tiny_model(tokens, attention_mask=mask)
    hooked, cache = tiny_model.run_with_cache(
        tokens, attention_mask=mask, names_filter=lambda n: n.endswith("hook_pattern")
    )
    torch.testing.assert_close(hooked, fast, atol=1e-5, rtol=1e-5)
    for L in range(tiny_model.cfg.n_layers):
        pattern = cache["pattern", L]
        assert torch.isfinite(pattern).all()
        sums = pattern.sum(-1)  # [batch, n_heads, q_pos]: 1 for a query that sees a token, 0 for none
        assert set(sums.round(decimals=5).unique().tolist()) <= {0.0, 1.0}


def test_hooked_attention_path_gives_the_fast_paths_gradients(tiny_model, tiny_tokens):
    """The in-place mask fill on the scores must not break autograd: grads through the hooked
    path equal grads through scaled_dot_product_attention."""
    tiny_model.zero_grad()
    tiny_model(tiny_tokens, return_type="loss").backward()
    fast = {n: p.grad.clone() for n, p in tiny_model.named_parameters()}
    tiny_model.zero_grad()
    tiny_model.run_with_hooks(
        tiny_tokens, return_type="loss", fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda t, hook: t)]
    ).backward()
    for n, p in tiny_model.named_parameters():
        torch.testing.assert_close(p.grad, fast[n], atol=1e-5, rtol=1e-4, msg=n)


# ----------------------------------------------------------------------------
# transformer-lens' parameter order, a seed's weights, loss_fn, to_string of one id (issue 28)
# ----------------------------------------------------------------------------
def test_named_parameters_come_in_transformer_lens_order():
    model = GPT(Config(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=8))
    block = ["ln1.w", "ln1.b", "ln2.w", "ln2.b", "attn.W_Q", "attn.W_O", "attn.b_Q", "attn.b_O", "attn.W_K", "attn.W_V"]
    block += ["attn.b_K", "attn.b_V", "mlp.W_in", "mlp.b_in", "mlp.W_out", "mlp.b_out"]
    want = ["embed.W_E", "pos_embed.W_pos", *(f"blocks.0.{n}" for n in block), "ln_final.w", "ln_final.b"]
    assert [n for n, _ in model.named_parameters()] == [*want, "unembed.W_U", "unembed.b_U"]
    tl = pytest.importorskip("transformer_lens")
    from interp_gpt.compare import transformer_lens_major

    if transformer_lens_major() >= 4:
        pytest.skip("transformer-lens 4.x: the order is compared against 3.9's HookedTransformer in .venv-tl3")
    import warnings

    for attn_only in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            theirs = tl.HookedTransformer(
                tl.HookedTransformerConfig(
                    n_layers=2,
                    d_model=16,
                    n_heads=2,
                    d_head=8,
                    n_ctx=8,
                    d_vocab=20,
                    act_fn="gelu_new",
                    attn_only=attn_only,
                )
            )
        ours = GPT(Config(n_layers=2, d_model=16, n_heads=2, d_vocab=20, n_ctx=8, attn_only=attn_only))
        assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]


def test_a_seed_gives_the_weights_it_gave_before_the_new_order():
    """Sums of each weight for seed 3, recorded with the parameters in their old order (attn's W_O after W_V)."""
    model = GPT(Config(n_layers=2, d_model=16, n_heads=2, d_vocab=20, n_ctx=8, seed=3))
    recorded = {
        "embed.W_E": -0.069846, "pos_embed.W_pos": 0.176413, "blocks.0.attn.W_Q": -0.057276,
        "blocks.0.attn.W_K": -0.225167, "blocks.0.attn.W_V": -0.451278, "blocks.0.attn.W_O": -0.433525,
        "blocks.0.mlp.W_in": -0.160942, "blocks.1.attn.W_O": 0.446831, "blocks.1.mlp.W_out": 1.23077,
        "unembed.W_U": -0.257154,
    }  # fmt: skip
    params = dict(model.named_parameters())
    for name, total in recorded.items():
        assert abs(float(params[name].detach().double().sum()) - total) < 1e-5, name


def test_loss_fn_is_the_forwards_loss_per_token_and_masked(tiny_model, tiny_tokens):
    logits = tiny_model(tiny_tokens)
    assert torch.equal(tiny_model.loss_fn(logits, tiny_tokens), tiny_model(tiny_tokens, return_type="loss"))
    per_token = tiny_model.loss_fn(logits, tiny_tokens, per_token=True)
    want = -logits[:, :-1].log_softmax(-1).gather(-1, tiny_tokens[:, 1:, None])[..., 0]
    torch.testing.assert_close(per_token, want)
    mask = torch.ones_like(tiny_tokens)
    mask[1, 4:] = 0  # the second prompt is 4 tokens long: 3 predictions
    masked = tiny_model.loss_fn(logits, tiny_tokens, attention_mask=mask, per_token=True)
    assert torch.equal(masked[1, 3:], torch.zeros(3)) and torch.equal(masked[0], per_token[0])
    torch.testing.assert_close(tiny_model.loss_fn(logits, tiny_tokens, mask), masked.sum() / 9)
    with pytest.raises(ValueError, match="loss_fn: logits must be"):
        tiny_model.loss_fn(logits, tiny_tokens[:, 1:])
    with pytest.raises(TypeError, match="tokens must hold integer token ids"):
        tiny_model.loss_fn(logits, tiny_tokens.float())


def test_to_string_takes_one_id_as_transformer_lens_does():
    import numpy as np

    model = GPT.from_pretrained("tiny-gpt2")
    assert model.to_string(422) == model.to_string(torch.tensor(422)) == model.to_string(np.int64(422)) == "the"
    assert model.to_string(np.array([422, 280])) == model.to_string([422, 280]) == "the c"
    with pytest.raises(TypeError, match="got bool"):
        model.to_string(True)
