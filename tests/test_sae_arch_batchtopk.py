"""TopK trained in sae-lens' rescaled form, BatchTopK and Matryoshka BatchTopK: their selection, losses,
running threshold and inference form (a JumpReLU SAE), equal to sae-lens 6.54 where it defines them.

The comparisons need sae-lens (transformer-lens < 4): CI's transformer-lens 3.9 venv (.venv-tl3) runs
them; elsewhere they skip and say so. The rest runs everywhere.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from interp_gpt import GPT
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.saes.architectures.batchtopk import batch_topk
from interp_gpt.sae.saes.io import CFG_FILENAME
from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

try:
    import sae_lens
    from sae_lens.saes.sae import SAEMetadata as SaeLensMetadata
    from sae_lens.saes.sae import TrainStepInput
except ImportError:  # sae-lens needs transformer-lens < 4
    sae_lens = None

needs_sae_lens = pytest.mark.skipif(
    sae_lens is None, reason="sae-lens is not installed here; CI's transformer-lens 3.9 venv (.venv-tl3) has it"
)

HOOK = "blocks.1.hook_resid_pre"
D_IN, D_SAE = 16, 48
WIDTHS = [6, 20, 48]


pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: small matrices run faster on one thread)


def random_sae(arch: str, seed: int = 0, d_in: int = D_IN, d_sae: int = D_SAE, **kw: Any) -> SAE:
    """An SAE with every tensor random (decoder rows of uneven norms, biases, a running threshold)."""
    sae = SAE(SAEConfig(d_in=d_in, d_sae=d_sae, architecture=arch, metadata={"hook_name": HOOK}, **kw))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if name.startswith("W") else 0.1))
        if hasattr(sae, "topk_threshold"):
            sae.topk_threshold.fill_(0.05)
    return sae


def dense_batch_topk(h: torch.Tensor, k: float) -> torch.Tensor:
    """BatchTopK written out: the int(k * n) largest of ReLU(h) over the whole flattened batch."""
    acts = h.relu().flatten()
    top = acts.topk(int(k * h.shape[0]))
    return torch.zeros_like(acts).scatter(-1, top.indices, top.values).view(h.shape)


def pre_acts(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """`(x - b_dec) @ W_enc + b_enc`, times the decoder norms where the SAE rescales by them."""
    h = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    return h * sae.W_dec.norm(dim=-1) if sae.cfg.rescale_acts_by_decoder_norm else h


# ----------------------------------------------------------------------------
# The batch's top activations, and BatchTopK's encode
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(("k", "heavy"), [(2.5, False), (3, True), (0.05, False), (D_SAE, False), (1.0, True)])
def test_batch_topk_keeps_the_batchs_largest_activations(k: float, heavy: bool) -> None:
    g = torch.Generator().manual_seed(1)
    h = torch.randn(20, D_SAE, generator=g)
    if heavy:  # one row holds most of the batch's largest values, far more than its ceil(k) candidates
        h[3] += 5.0
    chosen = batch_topk(h, k)
    want = dense_batch_topk(h, k)
    assert torch.equal(chosen.dense(*h.shape), want)
    assert chosen.values.numel() == int((want > 0).sum()) == min(int(k * 20), int((h > 0).sum()))
    assert torch.equal(chosen.counts, (want > 0).sum(-1)) and bool((chosen.values > 0).all())
    assert torch.equal(chosen.rows, torch.repeat_interleave(torch.arange(20), chosen.counts))  # row order
    if heavy:
        assert int(chosen.counts[3]) > 4 * k


@pytest.mark.parametrize("rescale", [False, True])
def test_batchtopk_encode_is_over_the_whole_batch_as_sae_lens(rescale: bool) -> None:
    """Before saving, encode is sae-lens' BatchTopKTrainingSAE.encode: the selection runs over every row
    passed in at once (all leading axes), so a row's features depend on its batch."""
    sae = random_sae("batchtopk", k=2.5, rescale_acts_by_decoder_norm=rescale)
    x = torch.randn(3, 5, D_IN, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        feats = sae.encode(x)
        want = dense_batch_topk(pre_acts(sae, x.reshape(15, D_IN)), 2.5).view(3, 5, D_SAE)
        torch.testing.assert_close(feats, want, atol=1e-6, rtol=1e-6)
        assert int((feats > 0).sum()) == int(2.5 * 15)
        alone = sae.encode(x[0, :1])  # one row alone keeps int(2.5) = 2 features, whatever its batch did
        assert int((alone > 0).sum()) == 2 and not torch.equal(alone[0], feats[0, 0])
        w = sae.W_dec / sae.W_dec.norm(dim=-1, keepdim=True) if rescale else sae.W_dec
        torch.testing.assert_close(sae(x), feats @ w + sae.b_dec, atol=1e-5, rtol=1e-5)


def test_k_may_be_a_float_for_batchtopk_only_and_bad_values_are_refused_by_name() -> None:
    assert random_sae("batchtopk", k=2.5).cfg.k == 2.5
    assert SAEConfig(d_in=4, d_sae=128, architecture="batchtopk", metadata={"hook_name": HOOK}).k == 100  # sae-lens'
    for bad, words in [(0, r"k=0: expected a number > 0"), (-1.5, r"k=-1\.5"), (49, r"k=49: .*<= d_sae=48"),
                       (float("inf"), r"k=inf")]:  # fmt: skip
        with pytest.raises(ValueError, match=words):
            random_sae("batchtopk", k=bad)
    for bad in ("2", True):
        with pytest.raises(TypeError, match=rf"k={bad!r}: expected a positive number"):
            random_sae("batchtopk", k=bad)
    with pytest.raises(TypeError, match=r"k=2\.5: expected a positive integer, got float"):
        random_sae("topk", k=2.5)  # TopK's k stays an integer
    with pytest.raises(ValueError, match=r"matryoshka_widths=\[4, 48\] is a field of matryoshka_batchtopk"):
        random_sae("batchtopk", k=2, matryoshka_widths=[4, 48])


# ----------------------------------------------------------------------------
# Training: the running threshold, the rescaled TopK, the Matryoshka loss
# ----------------------------------------------------------------------------
def test_the_running_threshold_follows_the_smallest_positive_activation() -> None:
    sae = random_sae("batchtopk", k=3)
    cfg = SAETrainingConfig(lr=1e-3, init_weights=False, topk_threshold_lr=0.2, log_every=1)
    trainer = SAETrainer(sae, cfg)
    x = torch.randn(32, D_IN, generator=torch.Generator().manual_seed(3))
    for _ in range(3):
        before = sae.topk_threshold.clone()
        parts = trainer.step(x)
        smallest = parts["feats"][parts["feats"] > 0].min().double()
        assert sae.topk_threshold.dtype == torch.float64 and sae.topk_threshold.shape == ()
        torch.testing.assert_close(sae.topk_threshold, 0.8 * before + 0.2 * smallest)
        assert int((parts["feats"] > 0).sum()) == 3 * 32
    log = trainer.train(iter([x]), n_steps=1, progress=False)
    assert log[-1]["topk_threshold"] == pytest.approx(float(sae.topk_threshold))  # logged, as sae-lens' metric
    assert "topk_threshold" in sae.state_dict()  # a buffer: in the state, not trained by Adam
    assert all(p is not sae.topk_threshold for p in trainer.optimizer.param_groups[0]["params"])


def test_a_batch_that_keeps_nothing_still_trains() -> None:
    sae = random_sae("matryoshka_batchtopk", k=0.05, matryoshka_widths=WIDTHS)  # int(0.05 * 8) = 0 kept
    trainer = SAETrainer(sae, SAETrainingConfig(init_weights=False))
    b_dec = sae.b_dec.detach().clone()
    parts = trainer.step(torch.randn(8, D_IN))
    assert not bool(parts["feats"].any()) and float(sae.topk_threshold) == pytest.approx(0.05)
    torch.testing.assert_close(parts["x_hat"], b_dec.expand(8, D_IN))  # the reconstruction is b_dec alone
    assert not torch.equal(sae.b_dec.detach(), b_dec)  # ... which learns


def test_topk_with_rescaled_activations_trains_with_a_free_decoder_and_saves_folded(tmp_path: Path) -> None:
    sae = random_sae("topk", k=4, rescale_acts_by_decoder_norm=True)
    with pytest.raises(ValueError, match=r"normalize_decoder=True with sae\.cfg\.rescale_acts_by_decoder_norm=True"):
        SAETrainer(sae, SAETrainingConfig(normalize_decoder=True))
    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-2))
    assert trainer.normalize_decoder is False  # the default for the rescaled form
    x = torch.randn(64, D_IN, generator=torch.Generator().manual_seed(4))
    for _ in range(5):
        trainer.step(x)
    norms = sae.W_dec.detach().norm(dim=-1)
    assert norms.max() < 0.5  # sae-lens' decoder_init_norm 0.1, left free (never renormalised to 1)
    sae.save_model(tmp_path / "s")
    back = SAE.from_pretrained(tmp_path / "s")
    assert back.cfg.rescale_acts_by_decoder_norm  # as sae-lens' save_inference_model writes it
    torch.testing.assert_close(back.W_dec.norm(dim=-1), torch.ones(D_SAE))
    with torch.no_grad():
        torch.testing.assert_close(back(x), sae(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(back.encode(x), sae.encode(x), atol=1e-5, rtol=1e-5)
    assert (sae.W_dec.detach().norm(dim=-1) - norms).abs().max() == 0  # saving leaves the SAE itself alone


@pytest.mark.parametrize("rescale", [False, True])
def test_the_matryoshka_loss_sums_each_prefix_reconstruction(rescale: bool) -> None:
    sae = random_sae("matryoshka_batchtopk", k=4.5, matryoshka_widths=WIDTHS, rescale_acts_by_decoder_norm=rescale)
    trainer = SAETrainer(sae, SAETrainingConfig(init_weights=False, normalize_decoder=False))
    x = torch.randn(40, D_IN, generator=torch.Generator().manual_seed(5))
    loss, parts = trainer.losses(x)
    with torch.no_grad():
        feats = dense_batch_topk(pre_acts(sae, x), 4.5)
        torch.testing.assert_close(parts["feats"], feats)
        w = sae.W_dec / sae.W_dec.norm(dim=-1, keepdim=True) if rescale else sae.W_dec
        errs = [((feats[:, :n] @ w[:n] + sae.b_dec - x) ** 2).sum(-1).mean() for n in WIDTHS]
    assert set(parts) >= {"mse", "inner_mse_6", "inner_mse_20"} and "inner_mse_48" not in parts
    torch.testing.assert_close(parts["mse"], errs[-1])
    torch.testing.assert_close(parts["inner_mse_6"], errs[0])
    torch.testing.assert_close(parts["inner_mse_20"], errs[1])
    assert len({round(float(e), 3) for e in errs}) == 3  # the prefixes do differ
    torch.testing.assert_close(loss, sum(errs))  # no dead features yet: no aux term


def test_matryoshka_widths_are_checked_by_name() -> None:
    for widths, words in [
        ([], r"matryoshka_widths=\[\]: expected a non-empty list"),
        ([0, 48], r"matryoshka_widths=\[0, 48\]: 0 is not a positive integer"),
        ([4.0, 48], r"4\.0 is not a positive integer"),
        ([8, 4, 48], r"matryoshka_widths=\[8, 4, 48\]: the widths must be strictly increasing .* 8 is followed by 4"),
        ([8, 8, 48], r"8 is followed by 8"),
        ([4, 64], r"matryoshka_widths=\[4, 64\]: width 64 is over d_sae=48"),
    ]:
        with pytest.raises(ValueError, match=words):
            random_sae("matryoshka_batchtopk", k=2, matryoshka_widths=widths)
    with pytest.raises(ValueError, match=r"matryoshka_widths=\[\]"):
        random_sae("matryoshka_batchtopk", k=2)  # sae-lens' default, [], is refused as it refuses it
    with pytest.warns(UserWarning, match=r"a final level of width d_sae is appended"):
        sae = random_sae("matryoshka_batchtopk", k=2, matryoshka_widths=[4, 16])
    assert sae.cfg.matryoshka_widths == [4, 16, 48]  # as sae-lens' _validate_matryoshka_config


# ----------------------------------------------------------------------------
# The inference form: a JumpReLU SAE
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["batchtopk", "matryoshka_batchtopk"])
def test_save_model_writes_a_jumprelu_sae_whose_threshold_is_the_running_one(arch: str, tmp_path: Path) -> None:
    kw = {"matryoshka_widths": WIDTHS} if arch != "batchtopk" else {}
    sae = random_sae(arch, k=3.5, rescale_acts_by_decoder_norm=True, **kw)
    sae.topk_threshold.fill_(0.3)
    sae.save_model(tmp_path / "s")
    on_disk = json.loads((tmp_path / "s" / CFG_FILENAME).read_text())
    assert on_disk["architecture"] == "jumprelu" and "k" not in on_disk and "matryoshka_widths" not in on_disk
    assert on_disk["metadata"]["training_architecture"] == arch
    assert on_disk["metadata"]["training_architecture_details"]["k"] == 3.5
    back = SAE.from_pretrained(tmp_path / "s")
    assert back.cfg.architecture == "jumprelu" and sae.cfg.architecture == arch  # the SAE itself stays
    assert torch.equal(back.threshold, torch.full((D_SAE,), 0.3))
    torch.testing.assert_close(back.W_dec.norm(dim=-1), torch.ones(D_SAE))  # the norms folded in
    x = torch.randn(30, D_IN, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        h = pre_acts(sae, x)
        want = h.relu() * (h > 0.3)
        torch.testing.assert_close(back.encode(x), want, atol=1e-5, rtol=1e-5)
        assert 0 < int((want > 0).sum()) < want.numel()
        w = sae.W_dec / sae.W_dec.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(back(x), want @ w + sae.b_dec, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_error_term", [True, False])
def test_a_batchtopk_sae_splices_into_the_model(
    tiny_model: GPT, tiny_tokens: torch.Tensor, use_error_term: bool
) -> None:
    sae = random_sae("batchtopk", d_in=64, d_sae=96, k=6.5)
    with torch.no_grad():
        clean = tiny_model(tiny_tokens)
        manual = tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[(HOOK, lambda x, hook: sae(x))])
        with tiny_model.saes([sae], use_error_term=use_error_term):
            spliced = tiny_model(tiny_tokens)
    if use_error_term:
        torch.testing.assert_close(spliced, clean, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(spliced, manual, atol=1e-6, rtol=1e-6)
        assert (spliced - clean).abs().max() > 1e-2


# ----------------------------------------------------------------------------
# Quality: absorption on a planted hierarchy
# ----------------------------------------------------------------------------
N_INDEPENDENT, D_TOY = 8, 64


def hierarchy(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows over orthonormal directions: a parent (on in 40% of rows), two children (each on in 45% of
    the parent's rows, never together: whenever a child is on, so is the parent) and 8 independent
    features (5% each); magnitudes 0.7..1.3. Returns (x, which features are on, the directions)."""
    dirs = torch.linalg.qr(torch.randn(D_TOY, D_TOY, generator=g))[0].T[: 3 + N_INDEPENDENT]
    parent = torch.rand(n, generator=g) < 0.4
    u = torch.rand(n, generator=g)
    child1, child2 = parent & (u < 0.45), parent & (u >= 0.45) & (u < 0.9)
    on = torch.cat([torch.stack([parent, child1, child2], 1), torch.rand(n, N_INDEPENDENT, generator=g) < 0.05], 1)
    return (on * (0.7 + 0.6 * torch.rand(on.shape, generator=g))) @ dirs, on, dirs


def absorption(sae: SAE, x: torch.Tensor, on: torch.Tensor, dirs: torch.Tensor) -> float:
    """Of the rows where a child is on (so the parent is too), the share where the parent's latent (the
    decoder row closest to the parent direction) stays silent: the parent absorbed into the children."""
    with torch.no_grad():
        parent_latent = int((F.normalize(sae.W_dec, dim=-1) @ dirs[0]).argmax())
        child_rows = on[:, 1:3].any(-1)
        return float((sae.encode(x[child_rows])[:, parent_latent] <= 0).float().mean())


def train_toy(arch: str, seed: int, tmp_path: Path, **kw: Any) -> tuple[float, float, float]:
    """(absorption, explained variance, L0) of the saved (JumpReLU) form after 200 steps, both
    architectures starting from the same noisy copy of the true directions."""
    g = torch.Generator().manual_seed(seed)
    x, on, dirs = hierarchy(200 * 256 + 4096, g)
    sae = SAE(SAEConfig(d_in=D_TOY, d_sae=12, architecture=arch, k=1.0, metadata={"hook_name": HOOK}, **kw))
    with torch.no_grad():  # the true directions plus noise (cosine ~0.8), the 12th latent spare
        w = torch.randn(12, D_TOY, generator=g) * 0.1
        w[: dirs.shape[0]] += dirs
        sae.W_dec.copy_(F.normalize(w, dim=-1))
        sae.W_enc.copy_(sae.W_dec.T)
    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-2, init_weights=False, log_every=1000))
    for i in range(200):
        trainer.step(x[4096 + 256 * i : 4096 + 256 * (i + 1)])
    sae.save_model(tmp_path / f"{arch}{seed}")
    saved = SAE.from_pretrained(tmp_path / f"{arch}{seed}")
    held_out, held_on = x[:4096], on[:4096]
    with torch.no_grad():
        ev = 1 - (saved(held_out) - held_out).pow(2).sum() / (held_out - held_out.mean(0)).pow(2).sum()
        l0 = (saved.encode(held_out) > 0).float().sum(-1).mean()
    return absorption(saved, held_out, held_on, dirs), float(ev), float(l0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matryoshka_absorbs_the_parent_less_than_batchtopk(seed: int, tmp_path: Path) -> None:
    """The parent in Matryoshka's first level (width 1) must reconstruct on its own, so it keeps firing
    with its children; BatchTopK, with k below the true L0 (1.16), folds it into the children."""
    absorbed, ev, l0 = train_toy("batchtopk", seed, tmp_path)
    m_absorbed, m_ev, m_l0 = train_toy("matryoshka_batchtopk", seed, tmp_path, matryoshka_widths=[1, 12])
    assert m_absorbed <= 0.1 and absorbed >= m_absorbed + 0.3, (absorbed, m_absorbed)
    assert ev > 0.95 and m_ev > 0.9, (ev, m_ev)  # both learned the data
    assert 0.8 < l0 < 1.25 and 0.8 < m_l0 < 1.25, (l0, m_l0)  # the threshold keeps L0 near k = 1


# ----------------------------------------------------------------------------
# Equal to sae-lens: one training step, the saved inference form, its checkpoints
# ----------------------------------------------------------------------------
# name -> (our architecture, its config fields, the trainer's options)
TRAINED = {
    "topk_rescaled": ("topk", {"k": 6, "rescale_acts_by_decoder_norm": True}, {}),
    "topk_free_decoder": ("topk", {"k": 6}, {}),
    "batchtopk_rescaled": ("batchtopk", {"k": 5.5, "rescale_acts_by_decoder_norm": True}, {"topk_threshold_lr": 0.1}),
    "batchtopk": ("batchtopk", {"k": 5}, {}),
    "matryoshka_rescaled": (
        "matryoshka_batchtopk", {"k": 5.5, "rescale_acts_by_decoder_norm": True, "matryoshka_widths": WIDTHS}, {}
    ),
    "matryoshka_aux": (
        "matryoshka_batchtopk", {"k": 4, "matryoshka_widths": WIDTHS}, {"use_matryoshka_aux_loss": True}
    ),
}  # fmt: skip


def sae_lens_training_twin(sae: SAE, aux_coefficient: float = 1.0, **train: Any) -> Any:
    """sae-lens' training SAE of the same config, holding the same tensors."""
    assert sae_lens is not None
    c = sae.cfg
    kw: dict[str, Any] = {"k": c.k, "rescale_acts_by_decoder_norm": c.rescale_acts_by_decoder_norm}
    if c.architecture != "topk":
        kw["topk_threshold_lr"] = train.get("topk_threshold_lr", 0.01)
    if c.architecture == "matryoshka_batchtopk":
        kw.update(matryoshka_widths=list(c.matryoshka_widths), use_matryoshka_aux_loss=train.get("use_matryoshka_aux_loss", False))  # fmt: skip
    classes = {"topk": "TopKTrainingSAE", "batchtopk": "BatchTopKTrainingSAE",
               "matryoshka_batchtopk": "MatryoshkaBatchTopKTrainingSAE"}  # fmt: skip
    cls = getattr(sae_lens, classes[c.architecture])
    cfg_cls = getattr(sae_lens, classes[c.architecture] + "Config")
    cfg = cfg_cls(d_in=c.d_in, d_sae=c.d_sae, aux_loss_coefficient=aux_coefficient, metadata=SaeLensMetadata(hook_name=HOOK), **kw)  # fmt: skip
    twin = cls(cfg)
    twin.load_state_dict(sae.state_dict(), strict=True)
    return twin


@needs_sae_lens
@pytest.mark.parametrize("variant", list(TRAINED))
def test_one_training_step_equals_sae_lens(variant: str) -> None:
    arch, fields, train = TRAINED[variant]
    sae = random_sae(arch, **fields)
    twin = sae_lens_training_twin(sae, **train)
    x = torch.randn(64, D_IN, generator=torch.Generator().manual_seed(9))
    dead = torch.zeros(D_SAE, dtype=torch.bool)
    dead[::5] = True  # dead features in every Matryoshka level: the aux terms are exercised
    # sae-lens' trainer: its forward pass, backward, the gradient clipped to norm 1, Adam
    out = twin.training_forward_pass(
        TrainStepInput(sae_in=x, coefficients={}, dead_neuron_mask=dead, n_training_steps=0, is_logging_step=False)
    )
    out.loss.backward()
    their_grads = {name: p.grad.clone() for name, p in twin.named_parameters()}
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
    torch.optim.Adam(twin.parameters(), lr=1e-3, betas=(0.9, 0.999)).step()
    # ours, from the same weights, sae-lens' options (its aux coefficient 1.0; a free decoder)
    cfg = SAETrainingConfig(lr=1e-3, clip_grad_norm=1.0, init_weights=False, normalize_decoder=False,
                            aux_coefficient=1.0, **train)  # fmt: skip
    probe = SAETrainer(copy.deepcopy(sae), cfg)  # the gradients themselves (Adam's first step hides their scale)
    probe.steps_since_fired[dead] = cfg.dead_feature_window
    probe.losses(x)[0].backward()
    for name, p in probe.sae.named_parameters():
        torch.testing.assert_close(p.grad, their_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    trainer = SAETrainer(sae, cfg)
    trainer.steps_since_fired[dead] = cfg.dead_feature_window
    parts = trainer.step(x)
    names = {"mse": "mse_loss", "aux": "auxiliary_reconstruction_loss"}
    names.update({f"inner_mse_{w}": f"inner_mse_loss_{w}" for w in WIDTHS[:-1]})
    theirs = {ours: out.losses[name] for ours, name in names.items() if name in out.losses}
    assert set(theirs) == {k for k in parts if k in names} and float(theirs["aux"].detach()) > 0
    for name, value in theirs.items():
        torch.testing.assert_close(parts[name], value.detach(), rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(parts["loss"], out.loss.detach(), rtol=1e-5, atol=1e-5)
    for name, value in twin.state_dict().items():  # the updated weights, and the running threshold
        torch.testing.assert_close(sae.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    if arch != "topk":
        assert float(sae.topk_threshold) != 0.05  # it moved


@needs_sae_lens
@pytest.mark.parametrize("variant", ["topk_rescaled", "batchtopk_rescaled", "matryoshka_rescaled", "batchtopk"])
def test_the_saved_inference_form_equals_sae_lens_both_ways(variant: str, tmp_path: Path) -> None:
    arch, fields, _ = TRAINED[variant]
    sae = random_sae(arch, **fields)
    twin = sae_lens_training_twin(sae)
    sae.save_model(tmp_path / "ours")
    twin.save_inference_model(tmp_path / "theirs")
    ours_cfg, their_cfg = (json.loads((tmp_path / f / CFG_FILENAME).read_text()) for f in ("ours", "theirs"))
    for key in ("architecture", "d_in", "d_sae", "apply_b_dec_to_input", "normalize_activations", "k",
                "rescale_acts_by_decoder_norm"):  # fmt: skip
        assert ours_cfg.get(key) == their_cfg.get(key), key
    assert ours_cfg["metadata"].get("training_architecture", "topk") == their_cfg["metadata"]["training_architecture"]
    ours, theirs = SAE.from_pretrained(tmp_path / "ours"), SAE.from_pretrained(tmp_path / "theirs")
    assert set(ours.state_dict()) == set(theirs.state_dict())
    for name, value in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], value, rtol=1e-6, atol=1e-7, msg=name)
    back = sae_lens.SAE.load_from_disk(tmp_path / "ours")  # type: ignore[union-attr]
    assert type(back).__name__ == ("TopKSAE" if arch == "topk" else "JumpReLUSAE")
    x = torch.randn(20, D_IN, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(back.encode(x), theirs.encode(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(back(x), ours(x), atol=1e-5, rtol=1e-5)
        if arch == "topk":  # the same function as before saving
            torch.testing.assert_close(ours(x), sae(x), atol=1e-5, rtol=1e-5)


@needs_sae_lens
def test_a_sae_lens_training_checkpoint_loads_as_our_batchtopk_sae(tmp_path: Path) -> None:
    sae = random_sae("matryoshka_batchtopk", k=3.5, matryoshka_widths=WIDTHS, rescale_acts_by_decoder_norm=True)
    twin = sae_lens_training_twin(sae)
    twin.topk_threshold.fill_(0.125)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        twin.save_model(tmp_path / "ckpt")  # sae-lens' training checkpoint: architecture and topk_threshold kept
    back = SAE.from_pretrained(tmp_path / "ckpt")
    assert back.cfg.architecture == "matryoshka_batchtopk" and back.cfg.matryoshka_widths == WIDTHS
    assert back.cfg.k == 3.5 and back.topk_threshold.dtype == torch.float64 and float(back.topk_threshold) == 0.125
    x = torch.randn(10, D_IN)
    with torch.no_grad():
        torch.testing.assert_close(back.encode(x), twin.encode(x), atol=1e-5, rtol=1e-5)
