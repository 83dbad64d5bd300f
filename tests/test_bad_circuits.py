"""Bad input to interp_gpt.circuits (issue #25): each case asserts the error type and that the
message names the caller, the argument and the value; the silent wrong answers these used to
give are checked against brute-force references (tests/circuit_refs.py) or plain hooked runs."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.circuits import (
    Circuit,
    Graph,
    acdc,
    eap_ig_scores,
    eap_scores,
    exact_edge_scores,
    faithfulness,
    faithfulness_curve,
    get_act_patch_direct_path,
    get_act_patch_direct_path_all_sources,
    patch_edges,
    path_patch,
)
from interp_gpt.patching import attribution_patch
from interp_gpt.sae import SAE, SAEConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from circuit_refs import brute_patch, random_model, sender_values  # noqa: E402

TWO = Config(n_layers=2, d_model=36, n_heads=3, d_vocab=60, n_ctx=16)


def tokens(seed: int, shape: tuple[int, int] = (2, 6)) -> torch.Tensor:
    return torch.randint(0, TWO.d_vocab, shape, generator=torch.Generator().manual_seed(seed))


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3].mean() - logits[:, -1, 5].mean() + 0.1 * logits[:, :, 7].mean()


@pytest.fixture(scope="module")
def model() -> GPT:
    return random_model(TWO)


@pytest.fixture(scope="module")
def text_model() -> GPT:
    return GPT.from_pretrained("tiny-gpt2")


def text_metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, 1, 3].mean() - logits[:, 1, 5].mean()


# Every circuit entry point that takes clean and corrupted prompts, as (name, call).
def _entry_points(m: Any) -> list[tuple[str, Any]]:
    g = Graph.from_model(m)
    e = ["a0.h1 -> a1.h0<k>"]
    return [
        ("patch_edges", lambda c, x: patch_edges(m, c, x, [e], text_metric, progress=False)),
        ("path_patch", lambda c, x: path_patch(m, c, x, ["a0.h1"], ["logits"], text_metric, progress=False)),
        ("eap_scores", lambda c, x: eap_scores(m, c, x, text_metric)),
        ("eap_ig_scores", lambda c, x: eap_ig_scores(m, c, x, text_metric, steps=2, progress=False)),
        ("exact_edge_scores", lambda c, x: exact_edge_scores(m, c, x, text_metric, edges=e, progress=False)),
        ("faithfulness", lambda c, x: faithfulness(m, c, x, e, text_metric)),
        (
            "faithfulness_curve",
            lambda c, x: faithfulness_curve(m, c, x, torch.ones(g.n_edges), text_metric, [1], progress=False),
        ),
        ("acdc", lambda c, x: acdc(m, c, x, text_metric, tau=0.1, progress=False)),
    ]


ENTRY_POINTS = [name for name, _ in _entry_points(random_model(TWO))]


# ----------------------------------------------------------------------------
# 1. text pairs whose rows tokenize to different lengths
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_text_rows_of_different_lengths_are_refused_naming_the_row_and_both_lengths(text_model, name):
    call = dict(_entry_points(text_model))[name]
    clean, corrupted = ["The cat sat", "ab"], ["ab", "The cat sat"]  # both batches pad to [2, 5]
    assert text_model.to_tokens(clean).shape == text_model.to_tokens(corrupted).shape
    with pytest.raises(ValueError, match=rf"^{name}: row 0: clean_tokens has 5 tokens but corrupted_tokens has 2;"):
        call(clean, corrupted)
    # A tensor row counts as all real: a padded string row against it is refused too.
    with pytest.raises(ValueError, match=rf"^{name}: row 1: clean_tokens has 2 tokens but corrupted_tokens has 5"):
        call(["The cat sat", "ab"], text_model.to_tokens(["The dog ran", "The cat sat"]))


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_bad_token_tensors_are_refused_naming_the_caller(model, name):
    """The prompts come in through the one way in (interp_gpt.prepare.prompts), which names the caller."""
    call = dict(_entry_points(model))[name]
    bad_id = tokens(1).clone()
    bad_id[1, 2] = TWO.d_vocab
    with pytest.raises(ValueError, match=rf"^{name}: clean_tokens: token id 60 at \[batch, posn\] = \[1, 2\]"):
        call(bad_id, tokens(2))
    with pytest.raises(ValueError, match=rf"^{name}: corrupted_tokens: 17 tokens is longer than the context of 16"):
        call(tokens(1), tokens(2, (2, 17)))
    with pytest.raises(TypeError, match=rf"^{name}: corrupted_tokens must be a string, a list of strings or a"):
        call(tokens(1), 3.0)


def test_text_pairs_of_equal_lengths_patch_as_the_brute_force_reference(text_model):
    clean, corrupted = ["The cat sat", "ab"], ["The dog ran", "the"]  # rows 5 / 2 tokens on both sides
    c_ids, x_ids = text_model.to_tokens(clean), text_model.to_tokens(corrupted)
    edges = ["input -> a1.h0<v>", "a0.h0 -> a1.h2<k>", "m0 -> logits"]
    got = patch_edges(text_model, clean, corrupted, [[e] for e in edges], progress=False)
    other = sender_values(text_model, x_ids)
    for k, e in enumerate(edges):
        want = brute_patch(text_model, c_ids, other, [e])
        torch.testing.assert_close(got[k], want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("ablation", ["mean", "resample"])
def test_ablations_over_rows_of_different_lengths_are_refused(text_model, ablation):
    with pytest.raises(
        ValueError, match=rf"patch_edges: clean_tokens .*row 1 has 2 tokens but row 0 has 5.*{ablation}"
    ):
        patch_edges(text_model, ["The cat sat", "ab"], ablation, [["m0 -> logits"]], progress=False)
    with pytest.raises(ValueError, match=r"faithfulness: reference row 1 has 2 tokens but row 0 has 5"):
        faithfulness(text_model, ["The cat sat", "The dog ran"], ablation, ["m0 -> logits"], text_metric,
                     reference=["The cat sat", "ab"])  # fmt: skip
    # "zero" takes nothing from other rows: rows of different lengths are fine.
    patch_edges(text_model, ["The cat sat", "ab"], "zero", [["m0 -> logits"]], progress=False)


# ----------------------------------------------------------------------------
# 2. an SAE spliced in
# ----------------------------------------------------------------------------
def make_sae(hook: str, d_in: int, seed: int = 0) -> SAE:
    sae = SAE(SAEConfig(d_in=d_in, d_sae=2 * d_in, metadata={"hook_name": hook}))  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.2 if name.startswith("W") else 0.05))
    return sae.to(torch.float64)


@pytest.mark.parametrize("hook, d_in", [("blocks.0.hook_mlp_out", 36), ("blocks.0.attn.hook_z", 12)])
def test_an_sae_without_the_error_term_is_refused_by_hook_and_sae(hook, d_in):
    model = random_model(TWO)
    model.add_sae(make_sae(hook, d_in))
    clean, corrupted = tokens(1), tokens(2)
    why = rf"an SAE \(standard, d_in={d_in}, .*\) is spliced in at '{hook}' without the error term.*use_error_term=True.*reset_saes"
    for name, call in _entry_points(model):
        if name.startswith("eap"):
            continue
        with pytest.raises(ValueError, match=rf"^{name}: {why}"):
            call(clean, corrupted)
    _, cache = model.run_with_cache(clean)
    with pytest.raises(ValueError, match=rf"^get_act_patch_direct_path: {why}"):
        get_act_patch_direct_path(model, corrupted, cache, cache, metric, 0, 0, verbose=False)
    with pytest.raises(ValueError, match=rf"^get_act_patch_direct_path_all_sources: {why}"):
        get_act_patch_direct_path_all_sources(model, corrupted, cache, cache, metric, verbose=False)


@pytest.mark.parametrize("error_term", [False, True])
def test_edge_attribution_is_refused_with_any_sae_spliced(error_term):
    model = random_model(TWO)
    model.add_sae(make_sae("blocks.1.hook_resid_pre", 36), use_error_term=error_term)
    for fn in (eap_scores, eap_ig_scores):
        with pytest.raises(ValueError, match=rf"^{fn.__name__}: an SAE .* at 'blocks.1.hook_resid_pre'.*reset_saes"):
            fn(model, tokens(1), tokens(2), metric)


@pytest.mark.parametrize("hook, d_in", [("blocks.0.hook_mlp_out", 36), ("blocks.0.attn.hook_z", 12),
                                        ("blocks.1.hook_resid_pre", 36)])  # fmt: skip
def test_single_edge_patches_with_an_sae_and_its_error_term_equal_brute_force(hook, d_in):
    model = random_model(TWO)
    clean, corrupted = tokens(1), tokens(2)
    g = Graph(TWO)
    edges = g.edge_names[::3]
    model.add_sae(make_sae(hook, d_in), use_error_term=True)
    got = patch_edges(model, clean, corrupted, [[e] for e in edges], progress=False)
    model.reset_saes()
    other = sender_values(model, corrupted)
    want = torch.stack([brute_patch(model, clean, other, [e]) for e in edges])
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    assert (want - model(clean).detach()).abs().amax(dim=(1, 2, 3)).gt(1e-3).sum() > len(edges) // 2


# ----------------------------------------------------------------------------
# 3. a metric whose gradient is zero
# ----------------------------------------------------------------------------
def sign_metric(logits: torch.Tensor) -> torch.Tensor:
    return torch.sign(logits[:, -1, 3] - logits[:, -1, 5]).mean()


@pytest.mark.parametrize("fn", [eap_scores, eap_ig_scores])
def test_a_step_metric_is_refused_by_name_while_a_smooth_one_is_not(model, fn):
    clean, corrupted = tokens(1), tokens(2)
    with pytest.raises(ValueError, match=rf"^{fn.__name__}: metric sign_metric has a zero gradient at every receiver"):
        fn(model, clean, corrupted, sign_metric)
    with pytest.raises(ValueError, match=r"metric <lambda> has a zero gradient"):
        fn(model, clean, corrupted, lambda lg: lg[:, -1, 3].round().mean())
    # exact patching finds edges that move the step metric (so zeros from EAP would be wrong)
    exact = exact_edge_scores(model, clean, corrupted, sign_metric, progress=False)
    assert exact.abs().max() > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fn(model, clean, corrupted, metric).abs().max() > 0


def test_attribution_patching_refuses_a_step_metric_too(model):
    with pytest.raises(ValueError, match=r"^attribution_patch: metric sign_metric has a zero gradient"):
        attribution_patch(model, tokens(1), tokens(2), sign_metric)
    attribution_patch(model, tokens(1), tokens(2), metric)


# ----------------------------------------------------------------------------
# 4. edges: bool masks, index lists, names; anything ambiguous refused
# ----------------------------------------------------------------------------
def _edge_takers(model: GPT) -> list[tuple[str, str, Any]]:
    g = Graph(TWO)
    c, x = tokens(1), tokens(2)
    return [
        ("Graph.edge_indices", "edges", g.edge_indices),
        ("Graph.edge_mask", "edges", g.edge_mask),
        ("Circuit", "edges", lambda e: Circuit(g, e)),
        ("patch_edges", r"edge_sets\[0\]", lambda e: patch_edges(model, c, x, [e], progress=False)),
        ("exact_edge_scores", "edges", lambda e: exact_edge_scores(model, c, x, metric, edges=e, progress=False)),
        ("faithfulness", "circuit", lambda e: faithfulness(model, c, x, e, metric)),
    ]


def test_integer_masks_floats_out_of_range_and_repeated_edges_are_refused(model):
    n = Graph(TWO).n_edges
    mask = torch.zeros(n, dtype=torch.long)
    mask[::3] = 1
    for caller, arg, take in _edge_takers(model):
        where = rf"^{caller}: {arg}: "
        with pytest.raises(TypeError, match=where + r"a torch.uint8 tensor is ambiguous.*\.bool\(\)"):
            take(mask.to(torch.uint8))
        with pytest.raises(TypeError, match=where + rf"a torch.int64 tensor of {n} values, all 0 or 1, is ambiguous"):
            take(mask)
        with pytest.raises(TypeError, match=where + rf"a list of {n} values, all 0 or 1, is ambiguous"):
            take(mask.tolist())
        with pytest.raises(TypeError, match=where + r"a torch.float32 tensor of shape"):
            take(mask.float())
        with pytest.raises(ValueError, match=where + rf"edge index {n} is out of range: edges are 0..{n - 1}"):
            take([0, n])
        with pytest.raises(ValueError, match=where + r"edge 1 \('input -> a0.h0<k>'\) is given twice"):
            take([1, 4, 1])
        with pytest.raises(ValueError, match=where + r"edge 4 \('input -> a0.h1<k>'\) is given twice"):
            take(["input -> a0.h1<k>", 4])
        with pytest.raises(ValueError, match=where + rf"a bool mask of shape \({n - 1},\).*\[{n}\]"):
            take(mask[1:].bool())
        with pytest.raises(ValueError, match=where + rf"a list of 3 bools is not a mask.*{n}"):
            take([True, False, True])
        with pytest.raises(KeyError, match=where[1:] + r"unknown sender node 'mo'.*did you mean"):
            take(["mo -> logits"])
        with pytest.raises(TypeError, match=where + r"1.5 is not an edge name or index"):
            take([1.5])


def test_a_mask_as_bool_tensor_numpy_array_or_bool_list_patches_every_edge_it_sets(model):
    """The old reading: a 0/1 integer mask taken as the edge indices {0, 1}. Now the bool forms
    give the masked edges, checked against the brute-force reference."""
    g = Graph(TWO)
    mask = torch.zeros(g.n_edges, dtype=torch.bool)
    mask[1::4] = True
    names = [g.edge_name(int(i)) for i in mask.nonzero().flatten()]
    clean, corrupted = tokens(1), tokens(2)
    forms = [mask, mask.numpy(), mask.tolist(), np.flatnonzero(mask.numpy()), names]
    got = patch_edges(model, clean, corrupted, forms, progress=False)
    want = brute_patch(model, clean, sender_values(model, corrupted), names)
    for k in range(len(forms)):
        torch.testing.assert_close(got[k], want, atol=1e-10, rtol=1e-10)
    assert Circuit(g, mask.numpy()).edges == names == Circuit(g, names).edges


# ----------------------------------------------------------------------------
# 5. direct-path sweeps: caches checked against the tokens
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("sweep", ["one", "all"])
def test_direct_path_caches_of_another_batch_or_length_or_without_hook_z_are_refused(model, sweep):
    clean, corrupted = tokens(1), tokens(2)
    _, cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)
    _, three = model.run_with_cache(tokens(3, (3, 6)))
    _, short = model.run_with_cache(tokens(3, (2, 5)))
    _, no_z = model.run_with_cache(clean, names_filter=lambda n: not n.endswith("hook_z"))
    caller = "get_act_patch_direct_path" + ("" if sweep == "one" else "_all_sources")

    def run(c: Any, x: Any) -> Any:
        if sweep == "one":
            return get_act_patch_direct_path(model, corrupted, c, x, metric, 0, 1, "k", verbose=False)
        return get_act_patch_direct_path_all_sources(model, corrupted, c, x, metric, "k", verbose=False)

    shape = (
        rf"^{caller}: clean_cache\['blocks.0.attn.hook_z'\] has shape \({{}}, 3, 12\) but corrupted_tokens is \[2, 6\]"
    )
    with pytest.raises(ValueError, match=shape.format("3, 6")):
        run(three, corrupted_cache)
    with pytest.raises(ValueError, match=shape.format("2, 5")):
        run(short, corrupted_cache)
    with pytest.raises(ValueError, match=rf"^{caller}: corrupted_cache\['blocks.0.attn.hook_z'\] has shape \(3, 6"):
        run(cache, three)
    with pytest.raises(KeyError, match=rf"{caller}: clean_cache holds no 'blocks.0.attn.hook_z'"):
        run(no_z, corrupted_cache)
    with pytest.raises(TypeError, match=rf"^{caller}: corrupted_cache must be an ActivationCache.*got list"):
        run(cache, [corrupted_cache])
    run(cache, corrupted_cache)


# ----------------------------------------------------------------------------
# 16. a resample reference of another batch size
# ----------------------------------------------------------------------------
def test_a_resample_reference_of_another_batch_size_is_one_line_naming_both_sizes(model):
    with pytest.raises(
        ValueError, match=r"^patch_edges: reference has 3 prompts but clean_tokens has 2: the 'resample'"
    ):
        patch_edges(model, tokens(1), "resample", [["m0 -> logits"]], reference=tokens(3, (3, 6)), progress=False)
    with pytest.raises(ValueError, match=r"^faithfulness: reference has 4 prompts but clean_tokens has 2"):
        faithfulness(model, tokens(1), "resample", ["m0 -> logits"], metric, reference=tokens(3, (4, 6)))
    # "mean" averages over the reference: any batch size is fine
    patch_edges(model, tokens(1), "mean", [["m0 -> logits"]], reference=tokens(3, (3, 6)), progress=False)


def test_other_prompt_count_is_named():
    model = random_model(TWO)
    with pytest.raises(ValueError, match=r"^patch_edges: corrupted_tokens has 3 prompt\(s\) but clean_tokens has 2"):
        patch_edges(model, tokens(1), tokens(2, (3, 6)), [["m0 -> logits"]], progress=False)
