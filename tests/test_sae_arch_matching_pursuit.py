"""The matching-pursuit SAE ("matching_pursuit"): greedy, tied, one decoder row at a time.

Its encoding equals a row-by-row loop written from the definition (ties, rows with nothing positive,
both stopping rules, early exit once every row is done); it is equal to sae-lens' MatchingPursuitSAE /
MatchingPursuitTrainingSAE (encode, decode, files both ways, one training step); it splices with and
without the error term; and it learns planted sparse directions. The sae-lens comparisons skip without
sae-lens (CI's transformer-lens 3.9 venv has it).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_sae import HOOK, needs_sae_lens, random_sae, sae_lens, sae_lens_twin
from test_sae_arch_abstopk import FEATS, assert_same_step, check_splice, check_splice_equals_sae_lens, one_step_both
from test_sae_training import batches, one_thread, planted  # noqa: F401 (one_thread: an autouse fixture)
from torch.overrides import TorchFunctionMode

from interp_gpt import GPT
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.saes.architectures.matching_pursuit import matching_pursuit
from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

MP = "matching_pursuit"
VARIANTS = {
    "defaults": dict(architecture=MP),
    "fixed_iterations": dict(
        architecture=MP, max_iterations=3, residual_threshold=0.0, stop_on_duplicate_support=False
    ),
    "residual_threshold": dict(architecture=MP, residual_threshold=2.5, stop_on_duplicate_support=False),
    "no_b_dec_in": dict(architecture=MP, apply_b_dec_to_input=False, max_iterations=6),
}
INFERENCE_VARIANTS = {**VARIANTS, "layer_norm": dict(architecture=MP, normalize_activations="layer_norm")}


def mp_sae(seed: int = 0, **kw: Any) -> SAE:
    """A random matching-pursuit SAE with decoder rows of norm about 1 (as trained), b_dec non-zero."""
    return random_sae(seed, **{"architecture": MP, **kw})  # type: ignore[arg-type]


def by_rows(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """Matching pursuit written from the definition, one row at a time, in float64."""
    c, W = sae.cfg, sae.W_dec.detach().double()
    out = torch.zeros(x.shape[0], c.d_sae, dtype=torch.float64)
    for row in range(x.shape[0]):
        r = (x[row] - sae.b_dec * c.apply_b_dec_to_input).detach().double()
        for _ in range(c.max_iterations or c.d_in):
            corr = W @ r
            i = int(corr.argmax()) if corr.max() > 0 else 0  # nothing positive: feature 0, value 0
            v = max(float(r @ W[i]), 0.0)
            grew = out[row, i] == 0 and v > 0
            out[row, i] += v
            r = r - v * W[i]
            if (c.stop_on_duplicate_support and not grew) or (
                0 < c.residual_threshold and r.norm() < c.residual_threshold
            ):
                break
    return out.float()


class CountMatmuls(TorchFunctionMode):
    """The rows of each `a @ b` run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") in ("matmul", "__matmul__"):
            self.rows.append(int(args[0].shape[0]))
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------
# The algorithm, written out (no sae-lens)
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_encode_equals_the_definition_row_by_row(variant: str) -> None:
    sae = mp_sae(1, **VARIANTS[variant])
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        feats = sae.encode(x)
        assert feats.shape == (2, 6, 48) and (feats >= 0).all()
        torch.testing.assert_close(feats.flatten(0, 1), by_rows(sae, x.flatten(0, 1)), atol=1e-5, rtol=1e-5)
        l0 = (feats != 0).sum(-1)
        assert 1 < l0.float().mean() and l0.max() <= (sae.cfg.max_iterations or 16)
        b_dec = sae.b_dec if sae.cfg.apply_b_dec_to_input else 0
        torch.testing.assert_close(sae.decode(feats), feats @ sae.W_dec + b_dec)


def test_a_row_with_nothing_positive_chooses_nothing_and_stops() -> None:
    sae = mp_sae(3)
    with torch.no_grad():
        sae.W_dec.copy_(sae.W_dec.abs())  # every row positive: x - b_dec negative correlates negatively
        x = sae.b_dec - torch.rand(3, 16) - 0.1
        assert ((x - sae.b_dec) @ sae.W_dec.T < 0).all()
        with CountMatmuls() as count:
            acts, residual = matching_pursuit(x - sae.b_dec, sae.W_dec, 0.0, None, True)
    assert torch.equal(acts, torch.zeros(3, 48)) and torch.equal(residual, x - sae.b_dec)
    assert count.rows == [3]  # the support did not grow: done after one iteration


def test_the_loop_stops_once_every_row_is_done_and_drops_rows_as_they_finish() -> None:
    sae = mp_sae(4)
    with torch.no_grad():
        sae.W_dec.copy_(F.normalize(sae.W_dec, dim=-1))
        easy = 2 * sae.W_dec[:3] + sae.b_dec  # one row each: done after one step (residual 0)
        hard = sae.b_dec + torch.randn(2, 16, generator=torch.Generator().manual_seed(5))
        with CountMatmuls() as count:
            sae.encode(torch.cat([easy, hard]))
    assert count.rows[:2] == [5, 2] and len(count.rows) < 16, count.rows
    stay = mp_sae(4, residual_threshold=0.0, stop_on_duplicate_support=False)
    with torch.no_grad(), CountMatmuls() as count:
        stay.encode(torch.cat([easy, hard]))
    assert count.rows == [5] * 16  # no stopping rule: d_in iterations over every row


def test_tied_tensors_and_which_hooks_run(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    sae = mp_sae(6, d_in=64, d_sae=96)
    assert set(sae.state_dict()) == {"W_dec", "b_dec"}  # sae-lens' tensors: W_enc is W_dec.T
    assert torch.equal(sae.W_enc, sae.W_dec.T) and sae.W_enc.data_ptr() == sae.W_dec.data_ptr()
    assert sae.dtype == torch.float32 and "max_iterations=None" in repr(sae)
    with pytest.raises(AttributeError, match="b_enc"):
        sae.b_enc  # noqa: B018
    cache = check_splice(tiny_model, tiny_tokens, sae)
    # no single pre-activation: hook_sae_acts_pre does not run (as in sae-lens); hook_sae_acts_post does
    assert FEATS in cache and HOOK + ".hook_sae_acts_pre" not in cache and (cache[FEATS] > 0).any()


def test_bad_configs_are_refused_by_name() -> None:
    def cfg(**kw: Any) -> SAEConfig:
        return SAEConfig(d_in=16, d_sae=48, architecture=MP, metadata={"hook_name": HOOK}, **kw)

    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=rf"max_iterations={bad!r}: expected an integer >= 1, or None"):
            cfg(max_iterations=bad)
    for bad in (-0.1, math.nan, math.inf, "0.1", True):
        with pytest.raises(ValueError, match=r"residual_threshold=.*: expected a finite number >= 0"):
            cfg(residual_threshold=bad)
    with pytest.raises(TypeError, match=r"stop_on_duplicate_support='yes': expected JSON true or false"):
        cfg(stop_on_duplicate_support="yes")
    with pytest.raises(
        ValueError,
        match=r"k=4 is a field of topk, batchtopk, matryoshka_batchtopk, abstopk SAEs, not of a 'matching_pursuit' one",
    ):
        cfg(k=4)
    with pytest.raises(ValueError, match=r"residual_threshold=0.5 is a field of matching_pursuit SAEs"):
        SAEConfig(d_in=16, d_sae=48, architecture="topk", k=4, residual_threshold=0.5, metadata={"hook_name": HOOK})
    assert cfg(residual_threshold=0).residual_threshold == 0.0 and cfg().max_iterations is None


def test_training_starts_from_unit_rows_and_its_loss_is_the_residual() -> None:
    x, _ = planted(512)
    sae = mp_sae(7, max_iterations=4)
    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-3, dead_feature_window=1))
    parts = trainer.step(x[:256])
    assert trainer.normalize_decoder is False  # free rows, as in sae-lens
    with torch.no_grad():
        parts = {k: v.detach() for k, v in trainer.losses(x[256:])[1].items()}
        torch.testing.assert_close(parts["feats"], sae.encode(x[256:]))
        torch.testing.assert_close(parts["mse"], ((sae(x[256:]) - x[256:]) ** 2).sum(-1).mean())
        torch.testing.assert_close(parts["x_hat"], sae(x[256:]), atol=1e-5, rtol=1e-5)
    assert set(parts) == {"mse", "feats", "x_hat"}  # no auxiliary term
    fresh = SAETrainer(mp_sae(7), SAETrainingConfig(lr=1e-12))
    fresh.step(x[:256])
    torch.testing.assert_close(fresh.sae.W_dec.norm(dim=-1), torch.ones(48), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fresh.sae.b_dec, x[:256].mean(0), atol=1e-5, rtol=1e-5)
    fired = (fresh.sae.encode(x[:256]) != 0).any(0)
    assert (fresh.steps_since_fired == (~fired).long()).all() and (~fired).any()


def test_it_learns_planted_sparse_directions() -> None:
    x, dirs = planted(20_000)
    sae = SAE(SAEConfig(d_in=16, d_sae=32, architecture=MP, max_iterations=4, metadata={"hook_name": HOOK}))
    trainer = SAETrainer(sae, SAETrainingConfig(lr=3e-3, log_every=100))
    data = batches(x, 256)
    first = float(trainer.step(next(data))["loss"])
    log = trainer.train(data, n_steps=300, progress=False)
    assert log[-1]["loss"] < 0.5 * first and log[-1]["explained_variance"] > 0.95 and log[-1]["l0"] <= 4
    found = (F.normalize(sae.W_dec.detach(), dim=-1) @ dirs.T).max(0).values > 0.9
    assert found.float().mean() >= 0.9, found
    untrained = F.normalize(mp_sae(99, d_sae=32).W_dec.detach(), dim=-1) @ dirs.T
    assert (untrained.max(0).values > 0.9).float().mean() < 0.5  # the test can fail


# ----------------------------------------------------------------------------
# Equal to sae-lens
# ----------------------------------------------------------------------------
@needs_sae_lens
@pytest.mark.parametrize("variant", list(INFERENCE_VARIANTS))
def test_encode_decode_forward_equal_sae_lens(variant: str) -> None:
    sae = mp_sae(1, **INFERENCE_VARIANTS[variant])
    twin = sae_lens_twin(sae)
    assert type(twin).__name__ == "MatchingPursuitSAE"
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        feats, ref_feats = sae.encode(x), twin.encode(x)  # type: ignore[attr-defined]
        torch.testing.assert_close(feats, ref_feats, atol=1e-5, rtol=1e-5)
        assert (feats != 0).sum(-1).float().mean() > 1
        torch.testing.assert_close(sae.decode(feats), twin.decode(ref_feats), atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]
        torch.testing.assert_close(sae(x), twin(x), atol=1e-5, rtol=1e-5)  # type: ignore[operator]
        assert torch.equal(sae.W_enc, twin.W_enc)  # type: ignore[attr-defined]


@needs_sae_lens
def test_files_both_ways(tmp_path: Path) -> None:
    sae = mp_sae(5, max_iterations=7, residual_threshold=0.5, stop_on_duplicate_support=False)
    sae_lens_twin(sae).save_model(tmp_path / "theirs")  # type: ignore[attr-defined]
    ours = SAE.from_pretrained(tmp_path / "theirs")
    c = ours.cfg
    assert (c.architecture, c.max_iterations, c.residual_threshold, c.stop_on_duplicate_support) == (MP, 7, 0.5, False)
    assert all(torch.equal(ours.state_dict()[k], v) for k, v in sae.state_dict().items())
    ours.save_model(tmp_path / "ours")
    back = sae_lens.SAE.load_from_disk(tmp_path / "ours")  # type: ignore[union-attr]
    assert type(back).__name__ == "MatchingPursuitSAE" and back.cfg.max_iterations == 7
    default = mp_sae(5)
    default.save_model(tmp_path / "default")
    assert sae_lens.SAE.load_from_disk(tmp_path / "default").cfg.max_iterations is None  # type: ignore[union-attr]
    x = torch.randn(7, 16)
    with torch.no_grad():
        torch.testing.assert_close(back.encode(x), sae.encode(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(back(x), sae(x), atol=1e-5, rtol=1e-5)


@needs_sae_lens
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_one_training_step_equals_sae_lens(variant: str) -> None:
    from sae_lens.saes.matching_pursuit_sae import MatchingPursuitTrainingSAE, MatchingPursuitTrainingSAEConfig

    kw = {k: v for k, v in VARIANTS[variant].items() if k != "architecture"}
    sae = mp_sae(7, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # its decoder_init_norm forced to 1
        theirs = MatchingPursuitTrainingSAE(MatchingPursuitTrainingSAEConfig(d_in=16, d_sae=48, **kw))  # type: ignore[arg-type]
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(8))
    dead = torch.zeros(48, dtype=torch.bool)
    dead[::3] = True  # no dead-feature term here: nothing changes
    parts, out = one_step_both(sae, theirs, x, dead)
    assert_same_step(parts, out, sae, theirs, {"mse": "mse_loss"})


@needs_sae_lens
@pytest.mark.parametrize("use_error_term", [False, True])
def test_splice_equals_hooked_sae_transformer(tiny_model: GPT, tiny_tokens: torch.Tensor, use_error_term: bool) -> None:
    sae = mp_sae(12, d_in=64, d_sae=96, max_iterations=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        check_splice_equals_sae_lens(tiny_model, tiny_tokens, sae, use_error_term)


def test_the_gram_updated_choices_equal_the_recomputed_ones() -> None:
    """Training picks rows from correlations updated through W_dec @ W_dec.T: the same activations,
    residual and gradients as recomputing `r @ W_dec.T` every iteration (float rounding apart)."""
    from interp_gpt.sae.saes.architectures.matching_pursuit import gram_of, matching_pursuit

    g = torch.Generator().manual_seed(3)
    w = torch.nn.functional.normalize(torch.randn(96, 24, generator=g), dim=-1).requires_grad_(True)
    x = torch.randn(40, 24, generator=g)
    gram = gram_of(w, 12, x.shape[0])
    assert gram is not None and gram.shape == (96, 96)
    out = []
    for use in (None, gram):
        acts, residual = matching_pursuit(x, w, 1e-2, 12, True, use)
        (residual.pow(2).sum() + acts.sum()).backward()
        assert w.grad is not None
        out.append((acts.detach(), residual.detach(), w.grad.clone()))
        w.grad = None
    (a0, r0, g0), (a1, r1, g1) = out
    assert torch.equal(a0 != 0, a1 != 0)  # the same rows chosen
    torch.testing.assert_close(a1, a0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r1, r0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g1, g0, rtol=1e-4, atol=1e-5)
    assert gram_of(w, 1, 2) is None  # too few iterations x rows to repay the product
