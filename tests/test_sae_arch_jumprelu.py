"""JumpReLU training: one step equals sae-lens' JumpReLUTrainingSAE (every sparsity mode, the estimator
to the input, the pre-activation loss on dead features, the sparse and the dense step), it learns planted
sparse data, and the threshold stays float32 (sae-lens #728: a bfloat16 one silently stops learning).

The comparisons need sae-lens (transformer-lens < 4): CI's transformer-lens 3.9 venv runs them; elsewhere
they skip and say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.saes.architectures import sparse
from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

try:
    import sae_lens
    from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepInput
except ImportError:  # sae-lens needs transformer-lens < 4
    sae_lens = None

needs_sae_lens = pytest.mark.skipif(
    sae_lens is None, reason="sae-lens is not installed here; CI's transformer-lens 3.9 venv (.venv-tl3) has it"
)

HOOK = "blocks.1.hook_resid_pre"
D_IN, D_SAE = 16, 48


pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: small matrices run faster on one thread)


def jumprelu_sae(seed: int = 0, dtype: str = "float32", **kw: object) -> SAE:
    """A JumpReLU SAE with every tensor random: pre-activations ~ N(0, 1), thresholds in [0, 1)."""
    sae = SAE(
        SAEConfig(d_in=D_IN, d_sae=D_SAE, architecture="jumprelu", dtype=dtype, metadata={"hook_name": HOOK}, **kw)
    )  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            if name == "threshold":
                p.copy_(torch.rand(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.25 if name.startswith("W") else 0.1))
    return sae


def batch(n: int = 64, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, D_IN, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------
# One step equals sae-lens'
# ----------------------------------------------------------------------------
CASES = {
    "step": dict(jumprelu_sparsity_loss_mode="step"),
    "step_ste_to_input": dict(jumprelu_sparsity_loss_mode="step", jumprelu_ste_to_input=True),
    "tanh": dict(jumprelu_sparsity_loss_mode="tanh", jumprelu_tanh_scale=3.0),
    "tanh_ste_to_input": dict(jumprelu_sparsity_loss_mode="tanh", jumprelu_ste_to_input=True),
    "quadratic": dict(jumprelu_sparsity_loss_mode="quadratic", target_l0=5.0),
    "quadratic_ste_to_input": dict(jumprelu_sparsity_loss_mode="quadratic", target_l0=5.0, jumprelu_ste_to_input=True),
}


@needs_sae_lens
@pytest.mark.parametrize("path", ["sparse", "dense"])
@pytest.mark.parametrize("case", list(CASES))
def test_one_step_equals_sae_lens(case: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparse, "MAX_DENSITY", 1.0 if path == "sparse" else -1.0)
    opts = dict(CASES[case], jumprelu_bandwidth=0.2, l0_coefficient=0.7, pre_act_loss_coefficient=0.3)
    ours, theirs, (our_parts, their_out) = _one_step_each(jumprelu_sae(2), batch(), opts, lr=1e-3)
    theirs_l = their_out.losses
    torch.testing.assert_close(our_parts["mse"], theirs_l["mse_loss"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_parts["l0_loss"], theirs_l["l0_loss"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_parts["pre_act_loss"], theirs_l["pre_act_loss"], rtol=1e-5, atol=1e-6)
    assert float(theirs_l["pre_act_loss"].detach()) > 0  # the dead features' term is exercised
    torch.testing.assert_close(our_parts["loss"], their_out.loss.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_parts["feats"], their_out.feature_acts.detach(), rtol=1e-5, atol=1e-6)
    for name, p in theirs.named_parameters():
        q = dict(ours.named_parameters())[name]
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=f"{name}.grad")
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-5, atol=1e-6, msg=name)
    assert ours.threshold.grad is not None and ours.threshold.grad.abs().sum() > 0  # the estimator is exercised


@needs_sae_lens
def test_one_step_equals_sae_lens_without_b_dec_in_the_input_and_the_threshold_projected() -> None:
    sae = jumprelu_sae(3, apply_b_dec_to_input=False)
    with torch.no_grad():
        sae.threshold[:5] = -0.3  # projected to 0 before the forward, by both
    opts = dict(jumprelu_bandwidth=0.2, l0_coefficient=0.5)
    ours, theirs, (our_parts, their_out) = _one_step_each(sae, batch(seed=4), opts, lr=1e-3)
    torch.testing.assert_close(our_parts["l0_loss"], their_out.losses["l0_loss"], rtol=1e-5, atol=1e-5)
    assert "pre_act_loss" not in our_parts and "pre_act_loss" not in their_out.losses
    for name, p in theirs.named_parameters():
        torch.testing.assert_close(dict(ours.named_parameters())[name].detach(), p.detach(), rtol=1e-5, atol=1e-6)


def _one_step_each(sae: SAE, x: torch.Tensor, opts: dict, lr: float) -> tuple:  # type: ignore[type-arg]
    """One step of our trainer and one of sae-lens' (its trainer's order: forward, backward, clip to 1.0,
    Adam) from the same weights, batch and dead features; returns (our SAE, theirs, (our parts, their output))."""
    dead = torch.zeros(D_SAE, dtype=torch.bool)
    dead[::5] = True
    twin = JumpReLUTrainingSAE(
        JumpReLUTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=sae.cfg.apply_b_dec_to_input, **opts)
    )
    twin.load_state_dict(sae.state_dict(), strict=True)
    out = twin.training_forward_pass(
        TrainStepInput(
            sae_in=x,
            coefficients={"l0": opts["l0_coefficient"]},
            dead_neuron_mask=dead,
            n_training_steps=0,
            is_logging_step=False,
        )
    )
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
    torch.optim.Adam(twin.parameters(), lr=lr, betas=(0.9, 0.999)).step()

    trainer = SAETrainer(sae, SAETrainingConfig(lr=lr, clip_grad_norm=1.0, init_weights=False, **opts))
    trainer.steps_since_fired[dead] = trainer.cfg.dead_feature_window
    parts = trainer.step(x)
    return sae, twin, (parts, out)


def test_the_sparse_step_equals_the_dense_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without sae-lens too: the sparse step (positions that fire or sit in the window) is the dense one."""
    results = []
    for limit in (1.0, -1.0):
        monkeypatch.setattr(sparse, "MAX_DENSITY", limit)
        sae = jumprelu_sae(5)
        cfg = SAETrainingConfig(lr=1e-3, init_weights=False, jumprelu_bandwidth=0.2, jumprelu_sparsity_loss_mode="tanh",
                                jumprelu_ste_to_input=True, pre_act_loss_coefficient=0.1)  # fmt: skip
        trainer = SAETrainer(sae, cfg)
        trainer.steps_since_fired[::3] = cfg.dead_feature_window
        parts = trainer.step(batch())
        results.append((parts, {n: p.grad.clone() for n, p in sae.named_parameters()}))  # type: ignore[union-attr]
    (sp, sg), (dp, dg) = results
    for k in ("loss", "mse", "l0_loss", "pre_act_loss", "feats", "x_hat"):
        torch.testing.assert_close(sp[k], dp[k], rtol=1e-5, atol=1e-6, msg=k)
    for k in sg:
        torch.testing.assert_close(sg[k], dg[k], rtol=1e-4, atol=1e-6, msg=k)
    assert 0 < (sp["feats"] > 0).float().mean() < 1 and sg["threshold"].abs().sum() > 0


def test_the_estimators_give_the_threshold_the_kernel_s_gradient() -> None:
    """Independent of sae-lens: d/dt sum(h * (h > t)) = -(t / bw) * #{|h - t| < bw / 2} and d/dt L0 = -(1 / bw) * #."""
    from interp_gpt.sae.saes.architectures.jumprelu import jump_relu, step

    h = torch.tensor([[0.45, 0.52, 0.9, 0.1], [0.56, 0.3, 0.49, 0.0]])  # in the window (0.4, 0.6): 2, 1, 1, 0
    t = torch.tensor([0.5, 0.5, 0.5, 0.5], requires_grad=True)
    jump_relu(h, t, 0.2).sum().backward()
    torch.testing.assert_close(t.grad, torch.tensor([-5.0, -2.5, -2.5, 0.0]))  # -(0.5 / 0.2) * count
    t.grad = None
    step(h, t, 0.2).sum().backward()
    torch.testing.assert_close(t.grad, torch.tensor([-10.0, -5.0, -5.0, 0.0]))  # -(1 / 0.2) * count


# ----------------------------------------------------------------------------
# It learns
# ----------------------------------------------------------------------------
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


def _train_planted(mode: str, n_steps: int, **extra: float) -> tuple[SAE, dict[str, float], torch.Tensor]:
    x, dirs = planted(16_384)  # 24 directions, 1.44 of them per row on average
    sae = SAE(SAEConfig(d_in=D_IN, d_sae=D_SAE, architecture="jumprelu", metadata={"hook_name": HOOK}))
    cfg = SAETrainingConfig(lr=3e-3, log_every=100, jumprelu_sparsity_loss_mode=mode, jumprelu_init_threshold=0.3,
                            **extra)  # type: ignore[arg-type]  # fmt: skip
    log = SAETrainer(sae, cfg).train(batches(x, 256), n_steps=n_steps, progress=False)
    cos = (F.normalize(sae.W_dec.detach(), dim=-1) @ dirs.T).max(0).values  # each direction's best decoder row
    return sae, log[-1], cos


def test_it_learns_planted_sparse_data() -> None:
    sae, last, cos = _train_planted("step", 800, l0_coefficient=0.1)
    assert last["explained_variance"] > 0.9 and last["l0"] < 2.5, last
    assert (cos > 0.9).float().mean() >= 0.9, cos
    assert (sae.threshold - 0.3).abs().max() > 0.2  # the thresholds learned


def test_the_quadratic_loss_brings_the_l0_to_its_target() -> None:
    _, last, _ = _train_planted("quadratic", 600, l0_coefficient=0.5, target_l0=4.0)
    assert abs(last["l0"] - 4.0) < 1.0 and last["explained_variance"] > 0.9, last  # (the data's own L0: 1.44)


# ----------------------------------------------------------------------------
# The threshold stays float32 (sae-lens #728)
# ----------------------------------------------------------------------------
def _train_near_one(sae: SAE, n_steps: int = 20) -> None:
    """Steps whose pre-activations sit around a threshold of 1.0: it gets a gradient every step."""
    with torch.no_grad():
        sae.threshold.fill_(1.0)
    trainer = SAETrainer(
        sae, SAETrainingConfig(lr=1e-3, init_weights=False, jumprelu_bandwidth=0.5, l0_coefficient=1.0)
    )
    for i in range(n_steps):
        trainer.step(batch(128, seed=10 + i) * 2)


def test_a_bfloat16_sae_keeps_a_float32_threshold_and_it_learns() -> None:
    sae = jumprelu_sae(6, dtype="bfloat16")
    assert sae.W_enc.dtype == torch.bfloat16 and sae.threshold.dtype == torch.float32
    _train_near_one(sae)
    assert sae.threshold.dtype == torch.float32
    assert (sae.threshold - 1.0).abs().max() > 5e-3  # moved by ~lr a step


def test_a_bfloat16_threshold_would_not_learn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why: the same training with the threshold in bfloat16 (the keep and the guard switched off) leaves
    every threshold where it started (Adam's ~1e-3 steps round away next to 1.0's spacing of 2^-7)."""
    from interp_gpt.sae.saes.architectures.jumprelu import JumpReLU

    monkeypatch.setattr(JumpReLU, "float32_params", lambda self, cfg: ())
    monkeypatch.setattr(JumpReLU, "check_trainable", lambda self, sae, trainer: None)
    sae = jumprelu_sae(6, dtype="bfloat16")
    assert sae.threshold.dtype == torch.bfloat16
    _train_near_one(sae)
    assert sae.threshold.grad is not None and sae.threshold.grad.abs().sum() > 0  # it had a gradient ...
    assert torch.equal(sae.threshold, torch.ones_like(sae.threshold))  # ... and did not move


def test_casts_keep_the_threshold_float32_with_its_values() -> None:
    sae = jumprelu_sae(7)
    before = sae.threshold.detach().clone()
    for cast in (lambda s: s.to(torch.bfloat16), lambda s: s.half(), lambda s: s.to("cpu", torch.bfloat16)):
        cast(sae)
        assert sae.threshold.dtype == torch.float32 and torch.equal(sae.threshold.detach(), before)
    sae.double()
    assert sae.threshold.dtype == torch.float64  # never below float32
    assert SAE(SAEConfig(d_in=4, d_sae=8, architecture="jumprelu", dtype="float16", metadata={"hook_name": HOOK})).threshold.dtype == torch.float32  # fmt: skip


def test_a_file_with_a_bfloat16_threshold_loads_into_float32_and_trains(tmp_path: Path) -> None:
    """The decision (see jumprelu.py): a half-precision threshold in a file is read into float32, exactly."""
    from safetensors.torch import load_file, save_file

    sae = jumprelu_sae(8, dtype="bfloat16")
    sae.save_model(tmp_path / "s")
    stored = load_file(str(tmp_path / "s" / "sae_weights.safetensors"))
    assert stored["threshold"].dtype == torch.float32 and stored["W_enc"].dtype == torch.bfloat16
    assert torch.equal(SAE.from_pretrained(tmp_path / "s").threshold.detach(), sae.threshold.detach())  # exact
    # a file as sae-lens' bfloat16 saves write it: the threshold in bfloat16 too
    meta = _metadata(tmp_path / "s" / "sae_weights.safetensors")
    stored["threshold"] = stored["threshold"].to(torch.bfloat16)
    save_file(stored, str(tmp_path / "s" / "sae_weights.safetensors"), metadata=meta)
    for dtype in (None, "bfloat16", "float32"):
        back = SAE.from_pretrained(tmp_path / "s", dtype=dtype)
        assert back.threshold.dtype == torch.float32
        assert torch.equal(back.threshold.detach(), stored["threshold"].float())
    back = SAE.from_pretrained(tmp_path / "s")
    with torch.no_grad():
        x = batch(8)
        want = jumprelu_sae(8, dtype="bfloat16")
        want.threshold.data = stored["threshold"].float()
        assert torch.equal(back.encode(x), want.encode(x))
    _train_near_one(back, n_steps=5)
    assert (back.threshold - 1.0).abs().max() > 2e-3


def test_a_replaced_half_precision_threshold_is_refused_by_name() -> None:
    sae = jumprelu_sae(9, dtype="bfloat16")
    state = {k: v.to(torch.bfloat16) for k, v in sae.state_dict().items()}
    sae.load_state_dict(state, assign=True)  # replaces the parameter: now bfloat16
    assert sae.threshold.dtype == torch.bfloat16
    with pytest.raises(
        TypeError, match=r"sae\.threshold has dtype torch\.bfloat16: a JumpReLU threshold trains in float32.*#728"
    ):
        SAETrainer(sae)
    sae.threshold.data = sae.threshold.data.float()  # the fix the message names
    SAETrainer(sae)


@needs_sae_lens
def test_a_bfloat16_save_loads_in_sae_lens_and_back(tmp_path: Path) -> None:
    sae = jumprelu_sae(11, dtype="bfloat16")
    sae.save_model(tmp_path / "ours")
    theirs = sae_lens.SAE.load_from_disk(tmp_path / "ours")
    assert theirs.threshold.dtype == torch.bfloat16  # sae-lens' inference SAE holds it in its dtype
    x = batch(8)
    with torch.no_grad():
        torch.testing.assert_close(theirs.encode(x), sae.encode(x))
    theirs.save_model(tmp_path / "theirs")  # the threshold stored in bfloat16
    back = SAE.from_pretrained(tmp_path / "theirs")
    assert back.threshold.dtype == torch.float32
    with torch.no_grad():
        assert torch.equal(back.encode(x), theirs.encode(x))


def _metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata()  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("opts", "match"),
    [
        (dict(jumprelu_sparsity_loss_mode="quadratic"), r"jumprelu_sparsity_loss_mode='quadratic' needs target_l0.*target_l0=None"),
        (dict(jumprelu_sparsity_loss_mode="quadratic", target_l0=49.0), r"target_l0=49\.0 is out of range: expected a number > 0 and <= d_sae=48"),
        (dict(jumprelu_sparsity_loss_mode="quadratic", target_l0=0.0), r"target_l0=0\.0 is out of range"),
        (dict(target_l0=4.0), r"target_l0=4\.0 is read only by jumprelu_sparsity_loss_mode='quadratic' \(the mode is 'step'\)"),
    ],
)  # fmt: skip
def test_bad_training_options_are_refused_by_name(opts: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=match):
        SAETrainer(jumprelu_sae(), SAETrainingConfig(**opts))
    with pytest.raises(
        ValueError, match=r"jumprelu_sparsity_loss_mode='cubic'; expected 'step', 'tanh' or 'quadratic'"
    ):
        SAETrainingConfig(jumprelu_sparsity_loss_mode="cubic")


def test_the_examples_run() -> None:
    import doctest

    from interp_gpt.sae.saes.architectures import jumprelu

    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    finder = doctest.DocTestFinder(recurse=False)
    tests = finder.find(sparse, globs=vars(sparse))
    for fn in (jumprelu.jump_relu, jumprelu.step):
        tests += finder.find(fn, globs=vars(jumprelu))
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False) == (0, 5)
