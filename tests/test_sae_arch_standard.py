"""The standard (ReLU + decoder-norm-weighted L1) SAE: one training step equal to sae-lens'
StandardTrainingSAE (its loss terms, gradients and the weights after clip + Adam), on the sparse and
the dense step. Needs sae-lens (CI's transformer-lens 3.9 venv); skips elsewhere and says so."""

from __future__ import annotations

import pytest
import torch

from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.saes.architectures import sparse
from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

try:
    from sae_lens.saes.sae import TrainStepInput
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
except ImportError:  # sae-lens needs transformer-lens < 4
    StandardTrainingSAE = None

needs_sae_lens = pytest.mark.skipif(
    StandardTrainingSAE is None, reason="sae-lens is not installed here; CI's transformer-lens 3.9 venv has it"
)
D_IN, D_SAE = 16, 48


@needs_sae_lens
@pytest.mark.parametrize("path", ["sparse", "dense"])
@pytest.mark.parametrize("b_dec_in", [True, False])
def test_one_step_equals_sae_lens(path: str, b_dec_in: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparse, "MAX_DENSITY", 1.0 if path == "sparse" else -1.0)
    g = torch.Generator().manual_seed(3)
    sae = SAE(SAEConfig(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=b_dec_in, metadata={"hook_name": "h"}))
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.25 if name.startswith("W") else 0.3))
    x, lr, l1 = torch.randn(64, D_IN, generator=g), 1e-3, 0.7
    twin = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=b_dec_in))
    twin.load_state_dict(sae.state_dict(), strict=True)
    out = twin.training_forward_pass(
        TrainStepInput(
            sae_in=x, coefficients={"l1": l1}, dead_neuron_mask=None, n_training_steps=0, is_logging_step=False
        )
    )
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)  # as sae-lens' trainer, then its Adam
    torch.optim.Adam(twin.parameters(), lr=lr, betas=(0.9, 0.999)).step()

    trainer = SAETrainer(sae, SAETrainingConfig(lr=lr, clip_grad_norm=1.0, init_weights=False, l1_coefficient=l1))
    parts = trainer.step(x)
    torch.testing.assert_close(parts["mse"], out.losses["mse_loss"].detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(parts["l1"], out.losses["l1_loss"].detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(parts["loss"], out.loss.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(parts["feats"], out.feature_acts.detach(), rtol=1e-5, atol=1e-6)
    mine = dict(sae.named_parameters())
    for name, p in twin.named_parameters():
        torch.testing.assert_close(mine[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=f"{name}.grad")
        torch.testing.assert_close(mine[name].detach(), p.detach(), rtol=1e-5, atol=1e-6, msg=name)
    assert all(float(p.grad.abs().sum()) > 0 for p in mine.values())  # type: ignore[union-attr]
