"""The AbsTopK SAE ("abstopk"): the k pre-activations of largest magnitude, signed.

Its formula and training terms written out; equal to sae-lens' AbsTopKSAE / AbsTopKTrainingSAE (encode,
decode, files both ways, one training step: each loss term and the updated weights, the saved inference
form); spliced with and without the error term; and on planted signed data it learns one feature per
direction, firing both ways, where TopK of the same width cannot. The sae-lens comparisons skip without
sae-lens (CI's transformer-lens 3.9 venv has it). Also the helpers the matching-pursuit tests share.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_sae import HOOK, needs_sae_lens, random_sae, sae_lens, sae_lens_twin
from test_sae_training import batches, one_thread  # noqa: F401 (one_thread: an autouse fixture)

from interp_gpt import GPT
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

FEATS = HOOK + ".hook_sae_acts_post"
VARIANTS = {
    "abstopk": dict(architecture="abstopk", k=5),
    "abstopk_rescaled": dict(architecture="abstopk", k=5, rescale_acts_by_decoder_norm=True),
    "abstopk_no_b_dec_in": dict(architecture="abstopk", k=5, apply_b_dec_to_input=False),
    "abstopk_norm_rescale": dict(architecture="abstopk", k=5, normalize_activations="constant_norm_rescale"),
}


# ----------------------------------------------------------------------------
# Helpers (the matching-pursuit tests use them too)
# ----------------------------------------------------------------------------
def one_step_both(
    sae: SAE, theirs: Any, x: torch.Tensor, dead: torch.Tensor, lr: float = 1e-2, **cfg: Any
) -> tuple[dict[str, torch.Tensor], Any]:
    """One training step of ours (the trainer as sae-lens' trainer runs: clip 1.0, no renormalising)
    and of sae-lens' training SAE `theirs` (given our weights) on `x`, with the features `dead` dead in
    both. Returns (our parts, their TrainStepOutput)."""
    from sae_lens.saes.sae import TrainStepInput

    theirs.load_state_dict(sae.state_dict(), strict=True)
    window = 5
    trainer = SAETrainer(
        sae,
        SAETrainingConfig(
            lr=lr, init_weights=False, normalize_decoder=False, clip_grad_norm=1.0, dead_feature_window=window, **cfg
        ),
    )
    trainer.steps_since_fired[dead] = window
    assert torch.equal(trainer.dead_mask(), dead)
    step_input = TrainStepInput(
        sae_in=x, coefficients={}, dead_neuron_mask=dead, n_training_steps=0, is_logging_step=True
    )
    out = theirs.training_forward_pass(step_input)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)  # sae-lens' trainer: always, at 1.0
    optimizer = torch.optim.Adam(theirs.parameters(), lr=lr, betas=(0.9, 0.999))  # its defaults
    optimizer.step()
    return trainer.step(x), out


def assert_same_step(parts: dict[str, torch.Tensor], out: Any, sae: SAE, theirs: Any, names: dict[str, str]) -> None:
    """Each loss term (ours by name: sae-lens' name), the total, the features and every updated weight."""
    for ours, their_name in names.items():
        torch.testing.assert_close(parts[ours], out.losses[their_name].detach(), atol=1e-5, rtol=1e-5, msg=ours)
    assert set(out.losses) == set(names.values())
    torch.testing.assert_close(parts["loss"], out.loss.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(parts["feats"], out.feature_acts.detach(), atol=1e-5, rtol=1e-5)
    theirs_after = theirs.state_dict()
    for name, value in sae.state_dict().items():
        torch.testing.assert_close(value, theirs_after[name], atol=1e-6, rtol=1e-5, msg=name)


def hooked_sae_transformer(model: GPT) -> Any:
    """sae-lens' HookedSAETransformer holding `model`'s weights."""
    from transformer_lens import HookedTransformerConfig

    assert sae_lens is not None
    c = model.cfg
    tl_cfg = HookedTransformerConfig(
        n_layers=c.n_layers, d_model=c.d_model, n_heads=c.n_heads, d_head=c.d_head, d_mlp=c.d_mlp,
        d_vocab=c.d_vocab, n_ctx=c.n_ctx, act_fn=c.act_fn, eps=c.eps, normalization_type="LN",
    )  # fmt: skip
    hst = sae_lens.HookedSAETransformer(tl_cfg)
    missing, unexpected = hst.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(k.endswith(("mask", "IGNORE")) for k in missing), (missing, unexpected)
    return hst


def check_splice(model: GPT, tokens: torch.Tensor, sae: SAE) -> dict[str, torch.Tensor]:
    """With the error term the logits are the model's and the features the SAE's; without, the output
    is a manual substitution's. Returns the cache spliced with the error term."""
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        with_error, spliced = model.run_with_cache_with_saes(tokens, saes=[sae], use_error_term=True)
        torch.testing.assert_close(with_error, logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(spliced[FEATS], sae.encode(cache[HOOK]))
        manual = model.run_with_hooks(tokens, fwd_hooks=[(HOOK, lambda x, hook: sae.decode(sae.encode(x)))])
        substituted = model.run_with_saes(tokens, saes=[sae], use_error_term=False)
        assert torch.equal(substituted, manual)
        assert (substituted - logits).abs().max() > 1e-2  # the SAE did change the output
    return dict(spliced.items())


def check_splice_equals_sae_lens(model: GPT, tokens: torch.Tensor, sae: SAE, use_error_term: bool) -> None:
    """Our splice equals sae-lens' HookedSAETransformer's: the logits and every SAE hook both have."""
    twin = sae_lens_twin(sae)
    with torch.no_grad():
        theirs, their_cache = hooked_sae_transformer(model).run_with_cache_with_saes(
            tokens, saes=[twin], use_error_term=use_error_term
        )
        ours, our_cache = model.run_with_cache_with_saes(tokens, saes=[sae], use_error_term=use_error_term)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    shared = [n for n in their_cache.keys() if "hook_sae" in n]
    assert (HOOK + ".hook_sae_error" in shared) == use_error_term and HOOK + ".hook_sae_recons" in shared
    for name in shared:
        torch.testing.assert_close(our_cache[name], their_cache[name], atol=1e-4, rtol=1e-4, msg=name)


def planted_signed(
    n: int, d_in: int = 16, n_true: int = 24, p: float = 0.06, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that are sparse mixtures of `n_true` unit directions, each with either sign (returned too)."""
    g = torch.Generator().manual_seed(seed)
    dirs = F.normalize(torch.randn(n_true, d_in, generator=g), dim=-1)
    on = torch.rand(n, n_true, generator=g) < p
    sign = torch.where(torch.rand(n, n_true, generator=g) < 0.5, -1.0, 1.0)
    return (on * sign * (1 + torch.rand(n, n_true, generator=g))) @ dirs, dirs


# ----------------------------------------------------------------------------
# The formulas, written out (no sae-lens)
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("rescale", [False, True])
def test_encode_keeps_the_k_largest_magnitudes_with_their_sign(rescale: bool) -> None:
    sae = random_sae(1, architecture="abstopk", k=5, rescale_acts_by_decoder_norm=rescale)
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(3))
    norms = sae.W_dec.norm(dim=-1) if rescale else torch.ones(48)
    with torch.no_grad():
        pre = ((x - sae.b_dec) @ sae.W_enc + sae.b_enc) * norms
        kth = pre.abs().topk(5, dim=-1).values[:, -1:]
        want = torch.where(pre.abs() >= kth, pre, torch.zeros_like(pre))
        feats = sae.encode(x)
        torch.testing.assert_close(feats, want)
        assert ((feats != 0).sum(-1) == 5).all() and (feats < 0).any() and (feats > 0).any()
        torch.testing.assert_close(sae.decode(feats), (feats / norms) @ sae.W_dec + sae.b_dec)


def test_a_feature_firing_negative_counts_as_fired_and_auxk_picks_dead_ones_by_magnitude() -> None:
    d_in, d_sae = 4, 6
    sae = SAE(SAEConfig(d_in=d_in, d_sae=d_sae, architecture="abstopk", k=1, metadata={"hook_name": HOOK}))
    with torch.no_grad():  # feature 0 reads -5 x_0 (x_0 > 0): strongly negative on every row; the rest small
        sae.W_enc.copy_(torch.randn(d_in, d_sae, generator=torch.Generator().manual_seed(0)) * 0.1)
        sae.W_enc[:, 0] = torch.tensor([-5.0, 0, 0, 0])
        sae.W_enc[:, 5] = torch.tensor([-3.0, 0, 0, 0])  # feature 5: negative too, dead, the largest dead |h|
        sae.W_enc[:, 4] = torch.tensor([0.5, 0, 0, 0])  # feature 4: positive, dead, the largest dead h
        sae.W_dec.copy_(torch.randn(d_sae, d_in, generator=torch.Generator().manual_seed(1)))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    x = torch.rand(8, d_in, generator=torch.Generator().manual_seed(2)) + torch.tensor([1.0, 0, 0, 0])
    trainer = SAETrainer(
        sae, SAETrainingConfig(lr=1e-9, init_weights=False, dead_feature_window=3, aux_coefficient=0.5)
    )
    trainer.steps_since_fired[3:] = 3  # features 3, 4, 5 dead
    dead = trainer.dead_mask().clone()
    loss, parts = trainer.losses(x)
    assert (parts["feats"][:, 0] < 0).all() and (parts["feats"][:, 1:] == 0).all()
    # AuxK, written out: the k_aux = d_in // 2 = 2 dead features of largest |h|, signed, reconstruct x - x_hat
    with torch.no_grad():
        pre = x @ sae.W_enc
        x_hat = parts["feats"] @ sae.W_dec
        top = torch.where(dead, pre.abs(), -torch.inf).topk(2, dim=-1).indices
        aux_acts = torch.zeros_like(pre).scatter_(-1, top, pre.gather(-1, top))
        want = 0.5 * min(3 / 2, 1.0) * ((aux_acts @ sae.W_dec - (x - x_hat)) ** 2).sum(-1).mean()
        assert (top == 5).any(dim=-1).all()  # the negative dead feature is chosen: by magnitude, not by value
    torch.testing.assert_close(parts["aux"].detach(), want)
    torch.testing.assert_close(loss.detach(), parts["mse"].detach() + want)
    trainer.step(x)
    assert trainer.steps_since_fired.tolist() == [0, 1, 1, 4, 4, 4]  # negative acts fire: feature 0 is alive


def test_saved_inference_form_folds_the_decoder_norms() -> None:
    sae = random_sae(2, architecture="abstopk", k=5, rescale_acts_by_decoder_norm=True)
    changes, state = sae.arch.inference_state(sae, dict(sae.state_dict()))
    assert changes == {}  # the cfg keeps rescale_acts_by_decoder_norm, as sae-lens writes it
    torch.testing.assert_close(state["W_dec"].norm(dim=-1), torch.ones(48))
    folded = SAE(sae.cfg)
    folded.load_state_dict(state)
    x = torch.randn(5, 16)
    with torch.no_grad():  # the same features and output
        torch.testing.assert_close(folded.encode(x), sae.encode(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(folded(x), sae(x), atol=1e-5, rtol=1e-5)
    plain = random_sae(2, architecture="abstopk", k=5)
    kept = plain.arch.inference_state(plain, dict(plain.state_dict()))[1]
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in kept.items())  # nothing to fold


def test_on_planted_signed_data_abstopk_learns_each_direction_both_ways_and_topk_cannot() -> None:
    """Every direction appears with either sign: AbsTopK needs one feature for it (firing negative for
    the minus sign), TopK two. At the same width AbsTopK finds all 24 directions, TopK few of them both ways."""
    x, dirs = planted_signed(20_000)
    found, ev = {}, {}
    for arch in ("abstopk", "topk"):
        sae = SAE(SAEConfig(d_in=16, d_sae=32, architecture=arch, k=4, metadata={"hook_name": HOOK}))
        log = SAETrainer(sae, SAETrainingConfig(lr=3e-3, log_every=100)).train(batches(x, 256), 400, progress=False)
        cos = F.normalize(sae.W_dec.detach(), dim=-1) @ dirs.T  # [d_sae, n_true]
        if arch == "abstopk":  # one row covers +d and -d
            found[arch] = (cos.abs().max(0).values > 0.9).float().mean()
            with torch.no_grad():
                assert (sae.encode(x[:2000]) < 0).float().mean() > 0.3 * (sae.encode(x[:2000]) != 0).float().mean()
        else:  # a row for +d and another for -d
            found[arch] = ((cos.max(0).values > 0.9) & ((-cos).max(0).values > 0.9)).float().mean()
        ev[arch] = log[-1]["explained_variance"]
        assert log[-1]["l0"] == 4 and log[-1]["dead_fraction"] == 0
    assert found["abstopk"] >= 0.95 and ev["abstopk"] > 0.88, (found, ev)
    assert found["topk"] <= 0.3 and ev["topk"] < ev["abstopk"] - 0.02, (found, ev)


def test_bad_abstopk_configs_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"k=49: expected an integer in 1..d_sae=48"):
        SAEConfig(d_in=16, d_sae=48, architecture="abstopk", k=49, metadata={"hook_name": HOOK})
    with pytest.raises(ValueError, match=r"max_iterations=3 is a field of matching_pursuit SAEs, not of a 'abstopk'"):
        SAEConfig(d_in=16, d_sae=48, architecture="abstopk", max_iterations=3, metadata={"hook_name": HOOK})


# ----------------------------------------------------------------------------
# Equal to sae-lens
# ----------------------------------------------------------------------------
@needs_sae_lens
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_encode_decode_forward_equal_sae_lens(variant: str) -> None:
    sae = random_sae(1, **VARIANTS[variant])  # type: ignore[arg-type]
    twin = sae_lens_twin(sae)
    assert type(twin).__name__ == "AbsTopKSAE"
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        feats, ref_feats = sae.encode(x), twin.encode(x)  # type: ignore[attr-defined]
        torch.testing.assert_close(feats, ref_feats, atol=1e-5, rtol=1e-5)
        assert (feats < 0).any() and ((feats != 0).sum(-1) == 5).all()
        torch.testing.assert_close(sae.decode(feats), twin.decode(ref_feats), atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]
        torch.testing.assert_close(sae(x), twin(x), atol=1e-5, rtol=1e-5)  # type: ignore[operator]


@needs_sae_lens
@pytest.mark.parametrize("variant", ["abstopk", "abstopk_rescaled"])
def test_files_both_ways(variant: str, tmp_path: Path) -> None:
    sae = random_sae(5, **VARIANTS[variant])  # type: ignore[arg-type]
    sae_lens_twin(sae).save_model(tmp_path / "theirs")  # type: ignore[attr-defined]
    ours = SAE.from_pretrained(tmp_path / "theirs")
    assert (ours.cfg.architecture, ours.cfg.k) == ("abstopk", 5)
    assert ours.cfg.rescale_acts_by_decoder_norm == sae.cfg.rescale_acts_by_decoder_norm
    assert all(torch.equal(ours.state_dict()[k], v) for k, v in sae.state_dict().items())
    ours.save_model(tmp_path / "ours")
    back = sae_lens.SAE.load_from_disk(tmp_path / "ours")  # type: ignore[union-attr]
    assert type(back).__name__ == "AbsTopKSAE" and back.cfg.k == 5
    x = torch.randn(7, 16)
    with torch.no_grad():
        torch.testing.assert_close(back.encode(x), sae.encode(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(back(x), sae(x), atol=1e-5, rtol=1e-5)


@needs_sae_lens
@pytest.mark.parametrize("rescale", [False, True])
def test_one_training_step_equals_sae_lens(rescale: bool) -> None:
    from sae_lens.saes.abstopk_sae import AbsTopKTrainingSAE, AbsTopKTrainingSAEConfig

    sae = random_sae(7, architecture="abstopk", k=4, rescale_acts_by_decoder_norm=rescale)
    theirs = AbsTopKTrainingSAE(
        AbsTopKTrainingSAEConfig(d_in=16, d_sae=48, k=4, aux_loss_coefficient=0.5, rescale_acts_by_decoder_norm=rescale)
    )
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(8))
    dead = torch.zeros(48, dtype=torch.bool)
    dead[::3] = True  # 16 dead: AuxK on, at full scale (n_dead >= k_aux = 8)
    parts, out = one_step_both(sae, theirs, x, dead, aux_coefficient=0.5)
    assert float(parts["aux"]) > 0 and (parts["feats"] < 0).any()
    assert_same_step(parts, out, sae, theirs, {"mse": "mse_loss", "aux": "auxiliary_reconstruction_loss"})


@needs_sae_lens
def test_saved_inference_form_equals_sae_lens(tmp_path: Path) -> None:
    from sae_lens.saes.abstopk_sae import AbsTopKTrainingSAE, AbsTopKTrainingSAEConfig
    from safetensors.torch import load_file

    sae = random_sae(9, architecture="abstopk", k=4, rescale_acts_by_decoder_norm=True)
    theirs = AbsTopKTrainingSAE(AbsTopKTrainingSAEConfig(d_in=16, d_sae=48, k=4, rescale_acts_by_decoder_norm=True))
    theirs.load_state_dict(sae.state_dict())
    theirs.save_inference_model(tmp_path / "theirs")
    saved = load_file(str(tmp_path / "theirs" / "sae_weights.safetensors"))
    _, ours = sae.arch.inference_state(sae, dict(sae.state_dict()))
    assert set(ours) == set(saved)
    for name, value in saved.items():
        torch.testing.assert_close(ours[name], value, msg=name)
    loaded = SAE.from_pretrained(tmp_path / "theirs")
    x = torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), sae(x), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------
# Splicing
# ----------------------------------------------------------------------------
def test_splice_with_and_without_the_error_term(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    sae = random_sae(11, d_in=64, d_sae=96, architecture="abstopk", k=8)
    cache = check_splice(tiny_model, tiny_tokens, sae)
    assert (cache[FEATS] < 0).any()


@needs_sae_lens
@pytest.mark.parametrize("use_error_term", [False, True])
def test_splice_equals_hooked_sae_transformer(tiny_model: GPT, tiny_tokens: torch.Tensor, use_error_term: bool) -> None:
    sae = random_sae(12, d_in=64, d_sae=96, architecture="abstopk", k=8, rescale_acts_by_decoder_norm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        check_splice_equals_sae_lens(tiny_model, tiny_tokens, sae, use_error_term)
