"""The direct-path sweeps against transformer-lens 4.3's `get_act_patch_direct_path(_all_sources)`,
on a TransformerBridge built offline from a random Hugging Face GPT-2 (the parity suite's way)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from interp_gpt import from_pretrained_no_processing
from interp_gpt.circuits import get_act_patch_direct_path, get_act_patch_direct_path_all_sources
from interp_gpt.compare import transformer_lens_major

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tl_bridge import word_level_bridge  # noqa: E402

tl = pytest.importorskip("transformer_lens")
pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(
        transformer_lens_major() < 4,
        reason="get_act_patch_direct_path is transformer-lens 4.3's: the .venv (TL 4.3) checks this",
    ),
]


@pytest.fixture(scope="module")
def pair(hf_gpt2_factory):  # type: ignore[no-untyped-def]
    hf_model = hf_gpt2_factory(seed=3)
    with torch.no_grad():  # GPT-2's init (std 0.02) barely lets a patch move the logits: scale it up
        for name, p in hf_model.named_parameters():
            if name.endswith(".weight") and ".ln_" not in name:
                p.mul_(8.0)
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 99, (3, 8), generator=gen)
    corrupted = torch.randint(0, 99, (3, 8), generator=gen)
    return (
        from_pretrained_no_processing(hf_model, tokenizer=None).eval(),
        word_level_bridge(hf_model, "interp_gpt-circuits-test"),
        clean,
        corrupted,
    )


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3].mean() - logits[:, -1, 5].mean() + logits[:, :, 11].mean()


def _caches(model, clean, corrupted):  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return model.run_with_cache(clean)[1], model.run_with_cache(corrupted)[1]


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_direct_path_matches_transformer_lens(pair, component):
    ours, bridge, clean, corrupted = pair
    from transformer_lens import patching as tl_patching

    want = tl_patching.get_act_patch_direct_path(
        bridge, corrupted, *_caches(bridge, clean, corrupted), metric, 0, 1, component, verbose=False
    )
    got = get_act_patch_direct_path(
        ours, corrupted, *_caches(ours, clean, corrupted), metric, 0, 1, component, verbose=False
    )
    assert got.shape == want.shape == (2, 4)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert (want[1] - float(metric(ours(corrupted).detach()))).abs().max() > 1e-3  # the patches move the metric


def test_direct_path_all_sources_matches_transformer_lens(pair):
    ours, bridge, clean, corrupted = pair
    from transformer_lens import patching as tl_patching

    want = tl_patching.get_act_patch_direct_path_all_sources(
        bridge, corrupted, *_caches(bridge, clean, corrupted), metric, "k", verbose=False
    )
    got = get_act_patch_direct_path_all_sources(
        ours, corrupted, *_caches(ours, clean, corrupted), metric, "k", verbose=False
    )
    assert got.shape == want.shape == (2, 4, 2, 4)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert not bridge.cfg.use_split_qkv_input and not ours.cfg.use_split_qkv_input
