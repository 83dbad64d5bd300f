"""The architecture registry: each architecture owns its config fields, and another's is refused by name."""

from __future__ import annotations

import pytest

from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.saes.architectures import ARCHITECTURES, FIELD_OWNERS, get_architecture

META = {"hook_name": "blocks.0.hook_resid_pre"}


def test_a_field_of_another_architecture_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"k=8 is a field of topk.* SAEs, not of a 'standard' one"):
        SAEConfig(d_in=8, d_sae=16, k=8, metadata=META)
    with pytest.raises(ValueError, match=r"rescale_acts_by_decoder_norm=True is a field of topk"):
        SAEConfig(d_in=8, d_sae=16, architecture="jumprelu", rescale_acts_by_decoder_norm=True, metadata=META)
    assert SAEConfig(d_in=8, d_sae=128, architecture="topk", metadata=META).k == 100  # sae-lens' default


def test_an_unknown_architecture_names_the_close_ones() -> None:
    with pytest.raises(ValueError, match=r"architecture='topkk' is not supported \(did you mean 'topk'"):
        get_architecture("topkk")
    with pytest.raises(ValueError, match=r"architecture='nope' is not supported; expected one of standard"):
        SAEConfig(d_in=8, d_sae=16, architecture="nope", metadata=META)


def test_every_architecture_builds_and_says_its_fields_in_cfg_json() -> None:
    for name in ARCHITECTURES:
        sae = SAE(SAEConfig(d_in=8, d_sae=16, architecture=name, **_small(name), metadata=META))
        written = sae.cfg.to_dict()
        assert written["architecture"] == name
        for field, owners in FIELD_OWNERS.items():
            assert (field in written) == (name in owners), (name, field)


def _small(name: str) -> dict[str, object]:
    """Fields an architecture needs to fit d_sae=16."""
    fields = get_architecture(name).fields
    small: dict[str, object] = {"k": 4} if "k" in fields else {}
    if "matryoshka_widths" in fields:
        small["matryoshka_widths"] = [4, 16]
    if "bottleneck_factor" in fields:  # temporal: d_sae a multiple of bottleneck_factor * n_heads
        small.update(n_heads=2, bottleneck_factor=4)
    return small


@pytest.mark.parametrize("arch", ["standard", "jumprelu", "gated"])
def test_the_sparse_training_path_equals_the_dense_one(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once few features fire, training goes through the active entries alone: the same loss terms and
    gradients as the dense computation (up to float summation order)."""
    import torch

    from interp_gpt.sae.saes.architectures import sparse
    from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

    torch.manual_seed(0)
    x = torch.randn(64, 16)
    results = []
    for share in (0.0, 1.0):  # every batch dense, then every batch sparse
        monkeypatch.setattr(sparse, "MAX_DENSITY", share)
        sae = SAE(SAEConfig(d_in=16, d_sae=48, architecture=arch, **_small(arch), metadata=META))
        sae.init_weights(seed=1)
        with torch.no_grad():
            bias = sae.b_gate if arch == "gated" else sae.b_enc
            bias.copy_(torch.linspace(-2, 0.5, 48))  # some features never fire, some often
            if arch == "jumprelu":
                sae.threshold.fill_(0.1)
            sae.b_dec.copy_(torch.randn(16, generator=torch.Generator().manual_seed(2)))
        trainer = SAETrainer(sae, SAETrainingConfig(init_weights=False))
        loss, parts = trainer.losses(x)
        loss.backward()
        scalars = {k: v for k, v in parts.items() if v.ndim == 0}
        results.append((loss.detach(), scalars, {n: p.grad for n, p in sae.named_parameters()}))
    (dense_loss, dense_parts, dense_grads), (sparse_loss, sparse_parts, sparse_grads) = results
    torch.testing.assert_close(sparse_loss, dense_loss, rtol=1e-5, atol=1e-6)
    for k in dense_parts:
        torch.testing.assert_close(sparse_parts[k], dense_parts[k], rtol=1e-5, atol=1e-6)
    for name, grad in dense_grads.items():
        torch.testing.assert_close(sparse_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    assert all(g is not None and bool(g.abs().sum() > 0) for g in dense_grads.values())


def test_every_architecture_evaluates_on_a_model(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """evaluate_sae runs every architecture on [batch, pos] activations (a temporal SAE reads the sequence)
    and its metrics are sane: KL >= 0, fractions in [0, 1], L0 within d_sae."""
    import math

    import torch

    from interp_gpt.sae.training import evaluate_sae

    tokens = torch.randint(0, tiny_model.cfg.d_vocab, (3, 10), generator=torch.Generator().manual_seed(0))
    d = tiny_model.cfg.d_model
    for name in ARCHITECTURES:
        sae = SAE(SAEConfig(d_in=d, d_sae=16, architecture=name, **_small(name), metadata=META))
        sae.init_weights(seed=0)
        got = evaluate_sae(tiny_model, sae, tokens, batch_size=2)
        assert math.isfinite(got["explained_variance"]) and got["kl_div"] >= 0, name
        assert 0 <= got["dead_fraction"] <= 1 and 0 <= got["dense_fraction"] <= 1, name
        assert 0 <= got["l0"] <= 16 and got["n_tokens"] == 30, name
