"""interp_gpt.causal against transformer-lens 4.3's `transformer_lens.tools.analysis` on one random GPT-2
checkpoint (a TransformerBridge built offline, unprocessed): interchange and the placebo to 1e-4, the bases
exactly, sparse probing exactly (neurons, split) and to 1e-8 (coefficients), DAS's seeded start exactly and
its learned basis to 1e-6 in float64.

DAS is compared on float64 models: Adam's first steps move every coordinate by about `lr` whatever the size
of its gradient, so in float32, where the two models' logits differ in the 7th digit, coordinates whose
gradient is float noise drift apart by up to ~lr (measured: 1e-2 on the basis after 3 epochs, 1.5e-3 on the
losses). In float64 the same seed gives the same basis.
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from interp_gpt import from_pretrained_no_processing
from interp_gpt.causal import (
    collect_activations,
    fit_das,
    interchange,
    mean_difference_basis,
    norm_matched_placebo,
    random_basis,
    sparse_probing,
)
from interp_gpt.causal.das import _subspace, _weight

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tl_bridge import word_level_bridge  # noqa: E402

tl = pytest.importorskip("transformer_lens")


def _tl_version() -> tuple[int, ...]:
    return tuple(int(p) for p in version("transformer_lens").split(".")[:2] if p.isdigit())


pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(
        _tl_version() < (4, 3),
        reason="interchange / fit_das / fit_sparse_probe are transformer-lens 4.3's: the .venv (TL 4.3) checks this",
    ),
]
HOOK = "blocks.1.hook_resid_pre"


def _pair(hf_gpt2_factory, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    hf = hf_gpt2_factory(seed=3)
    with torch.no_grad():  # GPT-2's init (std 0.02) barely lets an intervention move the logits: scale it up
        for name, p in hf.named_parameters():
            if name.endswith(".weight") and ".ln_" not in name:
                p.mul_(8.0)
    hf = hf.to(dtype)
    gen = torch.Generator().manual_seed(0)
    base, source = torch.randint(0, 99, (6, 8), generator=gen), torch.randint(0, 99, (6, 9), generator=gen)
    return (
        from_pretrained_no_processing(hf, tokenizer=None).to(dtype).eval(),
        word_level_bridge(hf, "interp_gpt-causal-test"),
        base,
        source,
    )


@pytest.fixture(scope="module")
def pair(hf_gpt2_factory):  # type: ignore[no-untyped-def]
    return _pair(hf_gpt2_factory, torch.float32)


@pytest.fixture(scope="module")
def pair64(hf_gpt2_factory):  # type: ignore[no-untyped-def]
    return _pair(hf_gpt2_factory, torch.float64)


POS = torch.tensor([7, 3, 5, 7, 0, 2])
SRC_POS = torch.tensor([1, 8, 6, 2, 4, 7])


@pytest.mark.parametrize("hook", [HOOK, "blocks.0.mlp.hook_post", "blocks.1.hook_attn_out"])
def test_interchange_and_placebo_equal_transformer_lens(pair, hook: str) -> None:  # type: ignore[no-untyped-def]
    from transformer_lens.tools.analysis import interchange as ref

    ours, bridge, base, source = pair
    ref_src = ref.collect_activations(bridge, hook, source, lambda t: bridge(t), positions=SRC_POS)
    assert (collect_activations(ours, hook, source, SRC_POS) - ref_src).abs().max() < 1e-5
    d = ref_src.shape[-1]
    B = random_basis(d, 3, seed=5)
    assert torch.equal(B, ref.random_basis(d, 3, 5))
    assert torch.equal(
        mean_difference_basis(ref_src, [0, 1, 0, 1, 1, 0]), ref.mean_difference_basis(ref_src, [0, 1, 0, 1, 1, 0])
    )

    step = ref.SubspaceInterchange(B, 0.7)
    want = ref.intervened_logits(bridge, hook, step, base, ref_src, lambda t: bridge(t), positions=POS)
    got = interchange(ours, hook, base, source, B, POS, 0.7, source_positions=SRC_POS, batch_size=4)
    diff = float((got - want).abs().max())
    with torch.no_grad():
        moved = float((want - bridge(base)).abs().max())
    print(f"interchange at {hook}: max |ours - TL 4.3| = {diff:.2e} (logits moved by {moved:.2f})")
    assert diff < 1e-4 and moved > 0.1

    placebo = ref.NormMatchedPlacebo(step, ref.random_basis(d, 3, 11))
    want = ref.intervened_logits(bridge, hook, placebo, base, ref_src, lambda t: bridge(t), positions=POS)
    got = norm_matched_placebo(ours, hook, base, source, B, POS, 0.7, source_positions=SRC_POS, seed=11)
    diff = float((got - want).abs().max())
    print(f"placebo at {hook}: max |ours - TL 4.3| = {diff:.2e}")
    assert diff < 1e-4


def test_das_learns_the_basis_transformer_lens_learns(pair64) -> None:  # type: ignore[no-untyped-def]
    from transformer_lens.tools.analysis import interchange as ref

    ours, bridge, base, source = pair64
    with torch.no_grad():
        assert float((ours(base) - bridge(base)).abs().max()) < 1e-10
    assert torch.equal(_weight(_subspace(64, 2, 4)), ref_start(ref, 4))
    targets = torch.tensor([0, 1, 1, 0, 1, 0])
    ids = [5, 9]
    kw = dict(rank=2, base_positions=POS, source_positions=SRC_POS, epochs=5, batch_size=4, lr=2e-2, seed=4)
    want = ref.fit_das(bridge, HOOK, base, source, targets, lambda t: bridge(t)[:, -1, ids], **kw)
    got = fit_das(ours, HOOK, base, source, targets, lambda t: ours(t)[:, -1, ids], progress=False, **kw)  # type: ignore[arg-type]
    losses = max(abs(a - b) for a, b in zip(got.losses, want.losses, strict=True))
    basis = float((got.basis - want.basis).abs().max())
    print(f"DAS (float64): losses {got.losses[0]:.4f} -> {got.losses[-1]:.4f}, max diff to TL 4.3 {losses:.1e}; "
          f"basis max diff {basis:.1e}")  # fmt: skip
    assert losses < 1e-9 and basis < 1e-6 and got.losses[-1] < got.losses[0] - 0.05


def ref_start(ref, seed: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """transformer-lens 4.3's initial DAS basis for `seed` (how its fit_das seeds it)."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return ref.LearnedSubspace(64, 2).basis


@pytest.mark.parametrize("seed", [0, 3])
def test_sparse_probing_equals_transformer_lens(seed: int) -> None:
    from transformer_lens.tools.analysis.sparse_probing import fit_sparse_probe

    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(80, generator=gen) < 0.4).long()
    features = torch.randn(80, 30, generator=gen)
    features[:, 4] += 1.5 * labels
    features[:, 17] -= 1.0 * labels
    features[:, 9] += 0.5 * labels
    for k in (1, 4, 12):
        want = fit_sparse_probe(features, labels, k=k, seed=seed)
        got = sparse_probing(features, labels, k=k, seed=seed)
        assert torch.equal(got.selected_features, want.selected_features)
        assert torch.equal(got.train_indices, want.train_indices) and torch.equal(got.test_indices, want.test_indices)
        diff = max(
            float((got.coefficients - want.coefficients).abs().max()), float((got.intercept - want.intercept).abs())
        )
        print(f"sparse probing k={k}: neurons {got.selected_features.tolist()}, coefficient max diff {diff:.1e}, "
              f"accuracy {got.accuracy} vs {want.metrics.accuracy}")  # fmt: skip
        assert diff < 1e-8 and got.accuracy == want.metrics.accuracy
        assert torch.allclose(got.feature_scores, want.feature_scores, atol=0, rtol=0)
    # L-BFGS cut short after 2 iterations: the Newton refinement finishes the fit, as transformer-lens' does
    want = fit_sparse_probe(features, labels, k=6, seed=seed, max_iter=2)
    got = sparse_probing(features, labels, k=6, seed=seed, max_iter=2)
    assert float((got.coefficients - want.coefficients).abs().max()) < 1e-8


def test_sparse_probing_of_mlp_neurons_equals_transformer_lens(pair) -> None:  # type: ignore[no-untyped-def]
    from transformer_lens.tools.analysis.sparse_probing import fit_sparse_probe

    ours, _, _, _ = pair
    tokens = torch.randint(0, 99, (60, 6), generator=torch.Generator().manual_seed(7))
    labels = (tokens[:, -1] < 50).long()  # is the last token in the first half of the vocabulary
    neurons = collect_activations(ours, "blocks.0.mlp.hook_post", tokens)  # [60, 256]
    for k in (1, 8):
        want = fit_sparse_probe(neurons, labels, k=k, seed=2)
        got = sparse_probing(neurons, labels, k=k, seed=2)
        diff = max(
            float((got.coefficients - want.coefficients).abs().max()), float((got.intercept - want.intercept).abs())
        )
        print(
            f"MLP neurons k={k}: {got.selected_features.tolist()}, coefficient max diff {diff:.1e}, accuracy {got.accuracy:.3f}"
        )
        assert torch.equal(got.selected_features, want.selected_features) and diff < 1e-8
        assert got.accuracy == want.metrics.accuracy
