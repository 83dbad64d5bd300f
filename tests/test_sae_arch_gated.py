"""The Gated SAE: encode / decode / forward equal sae-lens' GatedSAE, files both ways, splicing, one
training step equal to sae-lens' GatedTrainingSAE (the sparse and the dense step), and it learns planted
sparse data.

The comparisons need sae-lens (transformer-lens < 4): CI's transformer-lens 3.9 venv runs them; elsewhere
they skip and say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from interp_gpt import GPT
from interp_gpt.checkpoints.sources import CheckpointError
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.saes.architectures import sparse
from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

try:
    import sae_lens
    from sae_lens.saes.gated_sae import GatedTrainingSAE, GatedTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepInput
except ImportError:  # sae-lens needs transformer-lens < 4
    sae_lens = None

needs_sae_lens = pytest.mark.skipif(
    sae_lens is None, reason="sae-lens is not installed here; CI's transformer-lens 3.9 venv (.venv-tl3) has it"
)

HOOK = "blocks.1.hook_resid_pre"
D_IN, D_SAE = 16, 48


pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: small matrices run faster on one thread)


def gated_sae(seed: int = 0, d_in: int = D_IN, d_sae: int = D_SAE, hook: str = HOOK, **kw: object) -> SAE:
    """A Gated SAE with every tensor random (b_gate, b_mag, r_mag and b_dec too)."""
    cfg = SAEConfig(
        d_in=d_in, d_sae=d_sae, architecture="gated", metadata={"hook_name": hook, "model_name": "tiny"}, **kw
    )  # type: ignore[arg-type]
    sae = SAE(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.25 if name.startswith("W") else 0.3))
    return sae


def batch(n: int = 64, seed: int = 1, d_in: int = D_IN) -> torch.Tensor:
    return torch.randn(n, d_in, generator=torch.Generator().manual_seed(seed))


def twin_of(sae: SAE) -> object:
    """sae-lens' SAE of the same config, holding the same tensors."""
    assert sae_lens is not None
    twin = sae_lens.SAE.from_dict(sae.cfg.to_dict())
    twin.load_state_dict(sae.state_dict(), strict=True)
    return twin


# ----------------------------------------------------------------------------
# Inference
# ----------------------------------------------------------------------------
def test_it_holds_sae_lens_tensors_and_encodes_by_the_formula() -> None:
    sae = gated_sae(1)
    assert sorted(sae.state_dict()) == ["W_dec", "W_enc", "b_dec", "b_gate", "b_mag", "r_mag"]
    x = batch(5)
    sae_in = x - sae.b_dec
    gate = (sae_in @ sae.W_enc + sae.b_gate) > 0
    magnitude = torch.relu(sae_in @ (sae.W_enc * sae.r_mag.exp()) + sae.b_mag)
    with torch.no_grad():
        feats = sae.encode(x)
        torch.testing.assert_close(feats, (gate * magnitude).detach())
        torch.testing.assert_close(sae(x), feats @ sae.W_dec + sae.b_dec)
    assert 0 < (feats > 0).float().mean() < 0.5 < gate.float().mean()  # the gate closes some that the magnitude opens


@needs_sae_lens
@pytest.mark.parametrize(
    "kw", [{}, {"apply_b_dec_to_input": False}, {"normalize_activations": "layer_norm"}], ids=["plain", "no_b_dec_in", "layer_norm"]
)  # fmt: skip
def test_encode_decode_forward_equal_sae_lens(kw: dict) -> None:  # type: ignore[type-arg]
    sae = gated_sae(2, **kw)
    twin = twin_of(sae)
    assert type(twin).__name__ == "GatedSAE"
    x = torch.randn(3, 5, D_IN, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        feats, ref = sae.encode(x), twin.encode(x)  # type: ignore[attr-defined]
        torch.testing.assert_close(feats, ref, atol=1e-5, rtol=1e-5)
        assert 0 < (feats > 0).float().mean() < 1
        torch.testing.assert_close(sae.decode(feats), twin.decode(ref), atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]
        torch.testing.assert_close(sae(x), twin(x), atol=1e-5, rtol=1e-5)  # type: ignore[operator]


@needs_sae_lens
def test_files_both_ways_with_sae_lens(tmp_path: Path) -> None:
    sae = gated_sae(4)
    twin = twin_of(sae)
    twin.save_model(tmp_path / "theirs")  # type: ignore[attr-defined]
    ours = SAE.from_pretrained(tmp_path / "theirs")
    assert ours.cfg.architecture == "gated" and ours.cfg.hook_name == HOOK
    for k, v in sae.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    ours.save_model(tmp_path / "ours")
    back = sae_lens.SAE.load_from_disk(tmp_path / "ours")  # type: ignore[union-attr]
    assert type(back).__name__ == "GatedSAE" and back.cfg.metadata.hook_name == HOOK
    x = batch(7)
    with torch.no_grad():
        torch.testing.assert_close(back(x), sae(x), atol=1e-5, rtol=1e-5)


def test_save_and_load_round_trip_and_a_file_without_r_mag_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    sae = gated_sae(5)
    sae.save_model(tmp_path / "s")
    back = SAE.from_pretrained(tmp_path / "s")
    x = batch(3)
    with torch.no_grad():
        assert torch.equal(back(x), sae(x))
    weights = tmp_path / "s" / "sae_weights.safetensors"
    state = load_file(str(weights))
    state["b_enc"] = state.pop("r_mag")  # a standard SAE's bias where the gated one's r_mag should be
    save_file(state, str(weights))
    with pytest.raises(CheckpointError, match=r"(?s)gated SAE.*r_mag.*b_enc"):
        SAE.from_pretrained(tmp_path / "s")


@pytest.mark.parametrize("use_error_term", [False, True])
def test_spliced_it_gives_the_logits_of_a_manual_hook(
    tiny_model: GPT, tiny_tokens: torch.Tensor, use_error_term: bool
) -> None:
    sae = gated_sae(6, d_in=64, d_sae=96)
    with torch.no_grad():
        if use_error_term:  # the SAE's output plus its error: the clean activation
            want = tiny_model(tiny_tokens)
        else:
            want = tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[(HOOK, lambda x, hook: sae.decode(sae.encode(x)))])
        with tiny_model.saes([sae], use_error_term=use_error_term):
            got, cache = tiny_model.run_with_cache(tiny_tokens, names_filter=lambda n: "hook_sae" in n)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert (cache[HOOK + ".hook_sae_acts_post"] > 0).any()
        if not use_error_term:
            assert (got - tiny_model(tiny_tokens)).abs().max() > 1e-2  # the SAE did change the output


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------
@needs_sae_lens
@pytest.mark.parametrize("path", ["sparse", "dense"])
@pytest.mark.parametrize("b_dec_in", [True, False])
def test_one_step_equals_sae_lens(path: str, b_dec_in: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparse, "MAX_DENSITY", 1.0 if path == "sparse" else -1.0)
    sae, x, lr = gated_sae(7, apply_b_dec_to_input=b_dec_in), batch(seed=8), 1e-3
    twin = GatedTrainingSAE(
        GatedTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=b_dec_in, l1_coefficient=0.6)
    )
    twin.load_state_dict(sae.state_dict(), strict=True)
    out = twin.training_forward_pass(
        TrainStepInput(
            sae_in=x, coefficients={"l1": 0.6}, dead_neuron_mask=None, n_training_steps=0, is_logging_step=False
        )
    )
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)  # as sae-lens' trainer, then its Adam
    torch.optim.Adam(twin.parameters(), lr=lr, betas=(0.9, 0.999)).step()

    trainer = SAETrainer(sae, SAETrainingConfig(lr=lr, clip_grad_norm=1.0, init_weights=False, l1_coefficient=0.6))
    parts = trainer.step(x)
    for ours, theirs in (("mse", "mse_loss"), ("l1", "l1_loss"), ("aux", "auxiliary_reconstruction_loss")):
        torch.testing.assert_close(parts[ours], out.losses[theirs].detach(), rtol=1e-5, atol=1e-5, msg=ours)
    torch.testing.assert_close(parts["loss"], out.loss.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(parts["feats"], out.feature_acts.detach(), rtol=1e-5, atol=1e-6)
    mine = dict(sae.named_parameters())
    for name, p in twin.named_parameters():
        torch.testing.assert_close(mine[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=f"{name}.grad")
        torch.testing.assert_close(mine[name].detach(), p.detach(), rtol=1e-5, atol=1e-6, msg=name)
    assert all(float(p.grad.abs().sum()) > 0 for p in mine.values())  # type: ignore[union-attr]


def planted(n: int, n_true: int = 24, p: float = 0.06, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that are sparse non-negative mixtures of `n_true` unit directions (returned too)."""
    g = torch.Generator().manual_seed(seed)
    dirs = F.normalize(torch.randn(n_true, D_IN, generator=g), dim=-1)
    on = torch.rand(n, n_true, generator=g) < p
    return (on * (1 + torch.rand(n, n_true, generator=g))) @ dirs, dirs


def batches(x: torch.Tensor, size: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    while True:
        order = torch.randperm(x.shape[0], generator=g)
        for i in range(0, x.shape[0] - size + 1, size):
            yield x[order[i : i + size]]


def test_it_learns_planted_sparse_data() -> None:
    x, dirs = planted(16_384)  # 24 directions, 1.44 of them per row on average
    sae = SAE(SAEConfig(d_in=D_IN, d_sae=D_SAE, architecture="gated", metadata={"hook_name": HOOK}))
    trainer = SAETrainer(sae, SAETrainingConfig(lr=3e-3, l1_coefficient=2.0, log_every=100))
    data = batches(x, 256)
    first = float(trainer.step(next(data))["mse"].detach())  # the reconstruction error at initialisation
    last = trainer.train(data, n_steps=800, progress=False)[-1]
    assert last["mse"] < 0.1 * first and last["explained_variance"] > 0.9 and last["l0"] < 3, last
    cos = (F.normalize(sae.W_dec.detach(), dim=-1) @ dirs.T).max(0).values
    assert (cos > 0.9).float().mean() >= 0.9, cos


def test_init_weights_is_sae_lens_training_init() -> None:
    sae, x = gated_sae(9), batch(32) + 3.0
    trainer = SAETrainer(sae, SAETrainingConfig())
    sae.arch.init_weights(trainer, x)
    torch.testing.assert_close(sae.W_dec.norm(dim=-1), torch.full((D_SAE,), 0.1))  # decoder_init_norm
    torch.testing.assert_close(sae.W_enc, sae.W_dec.T)
    for name in ("b_gate", "b_mag", "r_mag"):
        assert torch.equal(getattr(sae, name), torch.zeros(D_SAE)), name
    torch.testing.assert_close(sae.b_dec, x.mean(0))  # init_b_dec_to_mean (sae-lens: 0)
