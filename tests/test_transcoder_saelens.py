"""Transcoders equal to sae-lens 6's own: Transcoder, SkipTranscoder, JumpReLUTranscoder and
JumpReLUSkipTranscoder (encode, decode, forward, skip, thresholds), and their files both ways.

sae-lens pins transformer-lens < 4: CI runs this module in its transformer-lens 3.9 venv
(.venv-tl3), e.g. `PYTHONPATH=$PWD .venv-tl3/bin/python -m pytest tests/test_transcoder_saelens.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from interp_gpt.sae import Transcoder, TranscoderConfig, load_transcoders, save_transcoders

sae_lens = pytest.importorskip("sae_lens", reason="sae-lens needs transformer-lens < 4: run in .venv-tl3")
SAEMetadata = pytest.importorskip("sae_lens.saes.sae").SAEMetadata

D_IN, D_SAE, D_OUT = 16, 48, 20
HOOKS = {"hook_name": "blocks.1.ln2.hook_normalized", "hook_name_out": "blocks.1.hook_mlp_out", "model_name": "gpt2"}
# sae-lens' architecture name -> (its class, its config class, ours)
KINDS = {
    "transcoder": ("Transcoder", "TranscoderConfig", dict(architecture="relu", skip=False)),
    "skip_transcoder": ("SkipTranscoder", "SkipTranscoderConfig", dict(architecture="relu", skip=True)),
    "jumprelu_transcoder": (
        "JumpReLUTranscoder",
        "JumpReLUTranscoderConfig",
        dict(architecture="jumprelu", skip=False),
    ),
    "jumprelu_skip_transcoder": (
        "JumpReLUSkipTranscoder",
        "JumpReLUSkipTranscoderConfig",
        dict(architecture="jumprelu", skip=True),
    ),
}


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Every tensor random; thresholds straddle 0 (sae-lens' JumpReLU is ReLU(h) * (h > threshold))."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if name != "threshold" else 1.0))


def theirs(kind: str, seed: int = 0) -> object:
    cls_name, cfg_name, _ = KINDS[kind]
    cfg = getattr(sae_lens, cfg_name)(
        d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, apply_b_dec_to_input=False, metadata=SAEMetadata(**HOOKS)
    )
    tc = getattr(sae_lens, cls_name)(cfg)
    randomise(tc, seed)
    return tc


def ours(kind: str, seed: int = 0) -> Transcoder:
    tc = Transcoder(TranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, metadata=dict(HOOKS), **KINDS[kind][2]))  # type: ignore[arg-type]
    randomise(tc, seed)
    return tc


def assert_same_numbers(mine: Transcoder, twin: object) -> None:
    x = torch.randn(3, 5, D_IN, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        acts, ref_acts = mine.encode(x), twin.encode(x)  # type: ignore[attr-defined]
        torch.testing.assert_close(acts, ref_acts, rtol=0, atol=0)
        assert 0 < (acts > 0).float().mean() < 1  # the activation is exercised: some on, some off
        ref_out = twin(x)  # type: ignore[operator]
        # sae-lens' decode leaves the skip to forward; ours takes the input and adds it
        ref_dec = twin.decode(ref_acts)  # type: ignore[attr-defined]
        if mine.cfg.skip:
            ref_dec = ref_dec + x @ twin.W_skip.T  # type: ignore[attr-defined]
        torch.testing.assert_close(mine.decode(acts, x), ref_dec, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(mine(x), ref_out, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", list(KINDS))
def test_sae_lens_files_load_here_with_its_numbers(tmp_path: Path, kind: str) -> None:
    twin = theirs(kind, seed=1)
    twin.save_model(tmp_path / kind)  # type: ignore[attr-defined]
    (mine,) = load_transcoders(tmp_path / kind)
    assert (mine.cfg.architecture, mine.cfg.skip) == (KINDS[kind][2]["architecture"], KINDS[kind][2]["skip"])
    assert (mine.input_hook, mine.output_hook, mine.cfg.model_name) == (
        HOOKS["hook_name"],
        HOOKS["hook_name_out"],
        "gpt2",
    )
    for name, p in twin.state_dict().items():  # type: ignore[attr-defined]
        assert torch.equal(mine.state_dict()[name], p), name
    assert_same_numbers(mine, twin)
    if kind.startswith("jumprelu"):
        assert (mine.threshold < 0).any() and mine.cfg.nonnegative_acts  # its JumpReLU clamps at 0


@pytest.mark.parametrize("kind", list(KINDS))
def test_our_files_load_in_sae_lens_with_our_numbers(tmp_path: Path, kind: str) -> None:
    mine = ours(kind, seed=2)
    mine.save_model(tmp_path / "one")
    save_transcoders([mine], tmp_path / "set")
    for folder in (tmp_path / "one", tmp_path / "set" / "layer_1"):
        twin = sae_lens.SAE.load_from_disk(str(folder))
        assert type(twin).__name__ == KINDS[kind][0]
        assert twin.cfg.metadata.hook_name_out == HOOKS["hook_name_out"]
        for name, p in mine.state_dict().items():
            assert torch.equal(twin.state_dict()[name], p), name
        assert_same_numbers(mine, twin)


def test_a_jumprelu_that_keeps_negatives_goes_to_sae_lens_only_when_exact(tmp_path: Path) -> None:
    """circuit-tracer's JumpReLU (no ReLU) equals sae-lens' when no threshold is negative: then it is
    written and sae-lens computes the same numbers; otherwise it is refused by name."""
    mine = Transcoder(
        TranscoderConfig(
            d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, architecture="jumprelu", nonnegative_acts=False, metadata=dict(HOOKS)
        )
    )
    randomise(mine, 3)
    with pytest.raises(ValueError, match="nonnegative_acts=False with negative thresholds"):
        mine.save_model(tmp_path / "neg")
    assert not (tmp_path / "neg").exists()
    with torch.no_grad():
        mine.threshold.abs_()
    mine.save_model(tmp_path / "pos")
    assert json.loads((tmp_path / "pos" / "cfg.json").read_text())["architecture"] == "jumprelu_transcoder"
    assert_same_numbers(mine, sae_lens.SAE.load_from_disk(str(tmp_path / "pos")))
