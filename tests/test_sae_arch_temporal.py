"""The temporal SAE (sae-lens' TemporalSAE): its maths written out, causality, its hooks, its files,
splicing, bad input, and (with sae-lens: CI's transformer-lens 3.9 venv) equality with sae-lens'
encode / decode / forward and its files both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TINY
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from interp_gpt import GPT, Config
from interp_gpt.checkpoints.sources import CheckpointError
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.common import NO_HOOKS
from interp_gpt.sae.saes.io import CFG_FILENAME, WEIGHTS_FILENAME
from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

try:
    import sae_lens
except ImportError:  # sae-lens needs transformer-lens < 4
    sae_lens = None

needs_sae_lens = pytest.mark.skipif(
    sae_lens is None, reason="sae-lens is not installed here; CI's transformer-lens 3.9 venv (.venv-tl3) has it"
)

HOOK = "blocks.1.hook_resid_pre"
SMALL = dict(architecture="temporal", n_heads=2, bottleneck_factor=4)  # d_sae=48: q/k 12 wide, 6 per head
# The options that change the numerics (each compared with sae-lens).
VARIANTS: dict[str, dict[str, object]] = {
    "tied_topk": dict(kval_topk=6),
    "tied_relu": dict(sae_diff_type="relu"),
    "untied_topk": dict(tied_weights=False, kval_topk=6),
    "tied_no_b_dec_in": dict(apply_b_dec_to_input=False, kval_topk=6),  # decode adds no b_dec
    "untied_no_b_dec_in": dict(tied_weights=False, apply_b_dec_to_input=False),  # decode adds b_dec
    "two_layers": dict(n_attn_layers=2, kval_topk=6),
    "no_layers": dict(n_attn_layers=0, kval_topk=6),
    "scalar_rescale": dict(normalize_activations="constant_scalar_rescale", activation_normalization_factor=0.37),
    "layer_norm": dict(normalize_activations="layer_norm", kval_topk=6),
    "norm_rescale": dict(normalize_activations="constant_norm_rescale"),
}


def random_sae(seed: int = 0, d_in: int = 16, d_sae: int = 48, hook: str = HOOK, **kw: object) -> SAE:
    """A temporal SAE with every tensor random (biases and b_dec too)."""
    cfg = SAEConfig(d_in=d_in, d_sae=d_sae, metadata={"hook_name": hook, "model_name": "tiny"}, **{**SMALL, **kw})  # type: ignore[arg-type]
    sae = SAE(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            scale = 1.0 if name in ("W_enc", "W_dec") else 0.5 if name.endswith("weight") else 0.1
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return sae


def seq(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------
# The maths, written out independently (explicit softmax attention, per head)
# ----------------------------------------------------------------------------
def reference(sae: SAE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(novel code, predicted code, forward's output) of normalisation "none", from the paper's steps."""
    c = sae.cfg
    W_dec = sae.W_dec
    E = W_dec.T if c.tied_weights else sae.W_enc
    lam = 1 / (4 * c.d_in)
    r = x - sae.b_dec if c.apply_b_dec_to_input else x
    b, p, _ = x.shape
    z_pred = torch.zeros(b, p, c.d_sae)
    for layer in sae.attn_layers:
        z = torch.relu(lam * r @ E)
        ctx = torch.cat([torch.zeros(b, 1, c.d_sae), z[:, :-1]], dim=1)
        q, k, v = layer.q_target(z), layer.k_ctx(ctx), layer.v_ctx(ctx)
        heads = []
        for h in range(c.n_heads):
            dq, dv = q.shape[-1] // c.n_heads, v.shape[-1] // c.n_heads
            qh, kh, vh = q[..., h * dq : (h + 1) * dq], k[..., h * dq : (h + 1) * dq], v[..., h * dv : (h + 1) * dv]
            scores = qh @ kh.transpose(1, 2) / dq**0.5
            scores = scores.masked_fill(torch.ones(p, p, dtype=torch.bool).triu(1), -torch.inf)
            heads.append(scores.softmax(-1) @ vh)
        zn = torch.relu(layer.c_proj(torch.cat(heads, -1)))
        d = zn @ W_dec
        s = (d * r).sum(-1, keepdim=True) / (d.norm(dim=-1, keepdim=True) + 1e-6) ** 2
        z_pred, r = z_pred + s * zn, r - s * d
    novel = torch.relu(lam * r @ E)
    if c.sae_diff_type == "topk" and c.kval_topk is not None:
        kth = novel.topk(c.kval_topk, dim=-1).values[..., -1:]
        novel = novel * (novel >= kth)
    out = (novel + z_pred) @ W_dec
    if c.apply_b_dec_to_input or not c.tied_weights:
        out = out + sae.b_dec
    return novel, z_pred, out


@pytest.mark.parametrize("variant", ["tied_topk", "untied_no_b_dec_in", "tied_no_b_dec_in", "two_layers"])
def test_encode_decode_forward_follow_the_formulas(variant: str) -> None:
    sae = random_sae(2, **VARIANTS[variant])
    x = seq(3, 7, 16)
    with torch.no_grad():
        novel, z_pred, out = reference(sae, x)
        feats = sae.encode(x)
        torch.testing.assert_close(feats, novel, atol=1e-5, rtol=1e-5)
        assert 0 < (feats > 0).float().mean() < 1
        assert z_pred[:, 1:].abs().amax() > 1e-3  # the attention predicts something: it is exercised
        torch.testing.assert_close(sae(x), out, atol=1e-5, rtol=1e-5)
        # decode is the novel part only; forward adds the predicted code's decoding
        novel_only = sae.decode(feats)
        torch.testing.assert_close(novel_only + z_pred @ sae.W_dec, out, atol=1e-5, rtol=1e-5)
        assert (novel_only - out).abs().amax() > 1e-3


def test_topk_keeps_kval_topk_codes_and_none_means_relu() -> None:
    x = seq(2, 5, 16)
    with torch.no_grad():
        assert int((random_sae(3, kval_topk=4).encode(x) > 0).sum(-1).max()) == 4
        relu = random_sae(3, sae_diff_type="relu", kval_topk=4).encode(x)  # kval_topk ignored for relu
        assert int((relu > 0).sum(-1).min()) > 4
        torch.testing.assert_close(random_sae(3).encode(x), relu)  # topk without kval_topk: plain ReLU


def test_causal_over_positions() -> None:
    """A change at position t changes nothing before t (encode, forward), and does change t itself."""
    sae = random_sae(4, n_attn_layers=2, kval_topk=6)
    x = seq(2, 8, 16)
    y = x.clone()
    y[:, 5] += seq(2, 16, seed=9)
    with torch.no_grad():
        assert torch.equal(sae.encode(x)[:, :5], sae.encode(y)[:, :5])
        assert torch.equal(sae(x)[:, :5], sae(y)[:, :5])
        assert (sae(x)[:, 5:] - sae(y)[:, 5:]).abs().amax(-1).min() > 1e-4  # position 5 and the later ones see it
        # a position's output depends on the earlier ones: the context matters
        assert (sae(x)[:, 3] - sae(x[:, 3:4])[:, 0]).abs().amax() > 1e-4


def test_a_row_of_tokens_is_refused_by_name() -> None:
    sae = random_sae()
    with pytest.raises(ValueError, match=r"x: a temporal SAE reads sequences \[batch, pos, d_in\].*\(5, 16\)"):
        sae.encode(seq(5, 16))
    with pytest.raises(ValueError, match=r"shape \(2, 3, 4, 16\)"):
        sae(seq(2, 3, 4, 16))


def test_constant_scalar_rescale_scales_in_and_out() -> None:
    sae = random_sae(5, normalize_activations="constant_scalar_rescale", activation_normalization_factor=0.25)
    plain = random_sae(5)
    x = seq(2, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(sae.encode(x), plain.encode(0.25 * x))
        torch.testing.assert_close(sae(x), plain(0.25 * x) / 0.25)
        feats = sae.encode(x)
        torch.testing.assert_close(sae.decode(feats), plain.decode(feats) / 0.25)
        torch.testing.assert_close(sae.decode(feats), plain.decode(feats) / 0.25)  # a constant: no state used up


def test_which_hooks_fire() -> None:
    """As sae-lens: encode fires input, acts_pre (the novel code's), acts_post; decode fires recons;
    forward fires input, acts_pre, acts_post and output, not recons."""
    sae = random_sae(kval_topk=6)
    seen: list[str] = []
    for name in sae.hook_names:
        getattr(sae, name).add_hook(lambda t, hook, name=name: seen.append(name))
    x = seq(2, 4, 16)
    with torch.no_grad():
        feats = sae.encode(x)
        assert seen == ["hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post"]
        seen.clear()
        sae.decode(feats)
        assert seen == ["hook_sae_recons"]
        seen.clear()
        sae(x)
        assert seen == ["hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_output"]
    sae.reset_hooks()


# ----------------------------------------------------------------------------
# Config, files, training
# ----------------------------------------------------------------------------
def test_config_has_sae_lens_defaults_and_refuses_bad_fields_by_name() -> None:
    cfg = SAEConfig(d_in=16, d_sae=512, architecture="temporal", metadata={"hook_name": HOOK})
    assert (cfg.n_heads, cfg.n_attn_layers, cfg.bottleneck_factor) == (8, 1, 64)
    assert (cfg.sae_diff_type, cfg.kval_topk, cfg.tied_weights, cfg.activation_normalization_factor) == (
        "topk", None, True, 1.0,
    )  # fmt: skip
    bad = [
        (dict(d_sae=44), r"d_sae=44 must be a multiple of bottleneck_factor \* n_heads = 4 \* 2"),
        (dict(n_heads=0), r"n_heads=0: expected an integer >= 1"),
        (dict(n_attn_layers=-1), r"n_attn_layers=-1"),
        (dict(sae_diff_type="jumprelu"), r"sae_diff_type='jumprelu': expected 'relu' or 'topk'"),
        (dict(kval_topk=49), r"kval_topk=49: expected at most d_sae=48"),
        (dict(kval_topk=0), r"kval_topk=0"),
        (dict(tied_weights="false"), r"tied_weights='false': expected true or false"),
        (dict(activation_normalization_factor=0.0), r"activation_normalization_factor=0.0"),
        (dict(k=4), r"k=4 is a field of topk.* not of a 'temporal' one"),
        (dict(normalize_activations="covariance_whitening"), r"covariance_whitening.*temporal"),
    ]
    for kw, msg in bad:
        with pytest.raises((ValueError, TypeError), match=msg):
            SAEConfig(d_in=16, **{"d_sae": 48, **SMALL, **kw}, metadata={"hook_name": HOOK})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"n_heads=2 is a field of temporal SAEs, not of a 'standard' one"):
        SAEConfig(d_in=16, d_sae=48, n_heads=2, metadata={"hook_name": HOOK})
    with pytest.raises(ValueError, match=r"'constant_scalar_rescale' is for temporal SAEs.*not a 'standard' one"):
        SAEConfig(d_in=16, d_sae=48, normalize_activations="constant_scalar_rescale", metadata={"hook_name": HOOK})


@pytest.mark.parametrize("tied", [True, False])
def test_saved_and_loaded_back(tmp_path: Path, tied: bool) -> None:
    sae = random_sae(6, tied_weights=tied, n_attn_layers=2, kval_topk=6)
    sae.save_model(tmp_path / "s")
    names = set(load_file(tmp_path / "s" / WEIGHTS_FILENAME))
    assert ("W_enc" in names) == (not tied) and "b_enc" not in names
    assert "attn_layers.1.c_proj.bias" in names and len(names) == (2 if tied else 3) + 2 * 8
    back = SAE.from_pretrained(tmp_path / "s")
    assert back.cfg.to_dict() == sae.cfg.to_dict()
    x = seq(2, 5, 16)
    with torch.no_grad():
        assert torch.equal(back(x), sae(x))


def test_a_file_with_a_wrong_attention_tensor_is_refused_by_name(tmp_path: Path) -> None:
    sae = random_sae(7)
    sae.save_model(tmp_path / "s")
    path = tmp_path / "s" / WEIGHTS_FILENAME
    state = load_file(path)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    state["attn_layers.0.k_ctx.weight"] = torch.zeros(13, 48)
    save_file(state, str(path), metadata=meta)
    with pytest.raises(
        CheckpointError, match=r"mis-shaped attn_layers\.0\.k_ctx\.weight \(13, 48\) \(expected \(12, 48\)\)"
    ):
        SAE.from_pretrained(tmp_path / "s")
    del state["attn_layers.0.k_ctx.weight"]
    save_file(state, str(path), metadata=meta)
    with pytest.raises(CheckpointError, match=r"missing \['attn_layers\.0\.k_ctx\.weight'\]"):
        SAE.from_pretrained(tmp_path / "s")


def test_init_is_seeded_and_fills_every_tensor() -> None:
    a, b = random_sae(), random_sae()
    a.init_weights(seed=3)
    b.init_weights(seed=3)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name
        assert name == "b_dec" or p.abs().amax() > 0, name
    row = a.attn_layers[0].v_ctx.weight.norm(dim=1)  # sae-lens' rows of norm 1/sqrt(d_sae / n_heads)
    torch.testing.assert_close(row, torch.full_like(row, (48 / 2) ** -0.5), atol=1e-5, rtol=1e-5)


def test_the_trainer_refuses_it_by_name() -> None:
    with pytest.raises(ValueError, match=r"sae\.cfg\.architecture='temporal' is inference only"):
        SAETrainer(random_sae(), SAETrainingConfig())


# ----------------------------------------------------------------------------
# Splicing into the model
# ----------------------------------------------------------------------------
@pytest.fixture
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(Config(**TINY)).eval()  # type: ignore[arg-type]


def test_spliced_without_error_term_equals_a_manual_substitution(model: GPT) -> None:
    sae = random_sae(8, d_in=64, d_sae=96, kval_topk=8)
    tokens = torch.randint(0, 100, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        manual = model.run_with_hooks(tokens, fwd_hooks=[(HOOK, lambda x, hook: sae(x))])
        with model.saes([sae]):
            spliced, cache = model.run_with_cache(tokens)
        torch.testing.assert_close(spliced, manual, atol=1e-6, rtol=1e-6)
        assert (spliced - model(tokens)).abs().max() > 1e-2  # the SAE changed the output
        assert cache[HOOK + ".hook_sae_acts_post"].shape == (3, 9, 96)
        assert HOOK + ".hook_sae_recons" not in cache  # forward's path, as sae-lens'


def test_spliced_with_error_term_keeps_the_logits(model: GPT) -> None:
    sae = random_sae(9, d_in=64, d_sae=96, kval_topk=8)
    tokens = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        with model.saes([sae], use_error_term=True):
            spliced, spliced_cache = model.run_with_cache(tokens)
            zeroed = model.run_with_hooks(
                tokens, fwd_hooks=[(HOOK + ".hook_sae_acts_post", lambda f, hook: torch.zeros_like(f))]
            )
        torch.testing.assert_close(spliced, logits, atol=1e-5, rtol=1e-5)
        error = spliced_cache[HOOK + ".hook_sae_error"]
        torch.testing.assert_close(error, cache[HOOK] - sae(cache[HOOK]), atol=1e-5, rtol=1e-5)
        assert (zeroed - logits).abs().max() > 1e-3  # the features do feed the output


def test_spliced_on_hook_z(model: GPT) -> None:
    hook = "blocks.0.attn.hook_z"
    sae = random_sae(10, d_in=64, d_sae=96, hook=hook, reshape_activations="hook_z")
    tokens = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        manual = model.run_with_hooks(tokens, fwd_hooks=[(hook, lambda z, hook: sae(z))])
        with model.saes([sae]):
            torch.testing.assert_close(model(tokens), manual, atol=1e-6, rtol=1e-6)


# ----------------------------------------------------------------------------
# Equal to sae-lens
# ----------------------------------------------------------------------------
def sae_lens_twin(sae: SAE) -> object:
    """sae-lens' TemporalSAE of the same config, holding the same tensors."""
    assert sae_lens is not None
    twin = sae_lens.SAE.from_dict(sae.cfg.to_dict())
    twin.load_state_dict(sae.state_dict(), strict=True)
    return twin


@needs_sae_lens
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_encode_decode_forward_equal_sae_lens(variant: str) -> None:
    sae = random_sae(11, **VARIANTS[variant])
    twin = sae_lens_twin(sae)
    assert type(twin).__name__ == "TemporalSAE"
    x = seq(3, 7, 16)
    with torch.no_grad():
        feats, ref = sae.encode(x), twin.encode(x)  # type: ignore[attr-defined]
        torch.testing.assert_close(feats, ref, atol=1e-5, rtol=1e-5)
        assert 0 < (feats > 0).float().mean() < 1
        torch.testing.assert_close(sae.decode(feats), twin.decode(ref), atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]
        torch.testing.assert_close(sae(x), twin(x), atol=1e-5, rtol=1e-5)  # type: ignore[operator]
        if sae.cfg.normalize_activations == "none":  # the predicted code itself (sae-lens' public method)
            state: dict[str, torch.Tensor] = {}
            sae.arch.encode_with_state(sae, x, NO_HOOKS, state)
            ref_pred = twin.encode_with_predictions(x)[1]  # type: ignore[attr-defined]
            torch.testing.assert_close(state["z_pred"], ref_pred, atol=1e-5, rtol=1e-5)


@needs_sae_lens
def test_hook_z_equals_sae_lens() -> None:
    sae = random_sae(12, hook="blocks.0.attn.hook_z", reshape_activations="hook_z", kval_topk=6)
    twin = sae_lens_twin(sae)
    x = seq(2, 5, 4, 4)  # [batch, pos, n_heads, d_head]
    with torch.no_grad():
        torch.testing.assert_close(sae(x), twin(x), atol=1e-5, rtol=1e-5)  # type: ignore[operator]


@needs_sae_lens
def test_the_same_hooks_fire_as_in_sae_lens() -> None:
    sae = random_sae(13, kval_topk=6)
    twin = sae_lens_twin(sae)
    x = seq(2, 4, 16)
    for module in (sae, twin):
        seen: list[str] = []
        for name in ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_output"):
            getattr(module, name).add_hook(lambda t, hook, name=name, seen=seen: seen.append(name))
        with torch.no_grad():
            module.decode(module.encode(x))  # type: ignore[operator]
            module(x)  # type: ignore[operator]
        module.hook_seen = seen  # type: ignore[union-attr]
        module.reset_hooks()  # type: ignore[union-attr]
    assert sae.hook_seen == twin.hook_seen  # type: ignore[attr-defined]


@needs_sae_lens
@pytest.mark.parametrize("variant", ["untied_topk", "two_layers", "scalar_rescale"])
def test_files_both_ways_with_sae_lens(variant: str, tmp_path: Path) -> None:
    sae = random_sae(14, **VARIANTS[variant])
    x = seq(2, 6, 16)
    sae.save_model(tmp_path / "ours")
    theirs = sae_lens.SAE.load_from_disk(str(tmp_path / "ours"))  # type: ignore[union-attr]
    assert type(theirs).__name__ == "TemporalSAE"
    twin = sae_lens_twin(sae)
    twin.save_model(tmp_path / "theirs")  # type: ignore[attr-defined]
    back = SAE.from_pretrained(tmp_path / "theirs")
    written = json.loads((tmp_path / "theirs" / CFG_FILENAME).read_text())
    assert written["architecture"] == "temporal" and back.cfg.n_heads == written["n_heads"]
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), sae(x), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(back(x), sae(x), atol=1e-6, rtol=1e-6)
    for key in ("n_heads", "n_attn_layers", "bottleneck_factor", "sae_diff_type", "kval_topk", "tied_weights"):
        assert getattr(theirs.cfg, key) == getattr(sae.cfg, key), key
