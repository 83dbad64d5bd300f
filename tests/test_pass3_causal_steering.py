"""Issue 36, third pass (causal and steering): padded batches read at real tokens, map_direction on
refactored attention and low-precision models, steering coefficients, bool probe labels, hashable
mean-difference labels, tiny sampling temperatures, the causal tools' seeds."""

from __future__ import annotations

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.causal import collect_activations
from interp_gpt.steering import contrastive_vector

HOOK = "blocks.1.hook_resid_pre"
VERSE = ["ROMEO:\nThou art a villain, and thy", "JULIET:\nO, my lord, what says thy"]
PROSE = ["Prince Andrew looked at Pierre and at the", "The French army crossed the river near the"]


@pytest.fixture(scope="module")
def tiny() -> GPT:
    return GPT.from_pretrained("tiny-gpt2").eval()


def _one_by_one(model: GPT, prompts: list[str], position: int = -1) -> torch.Tensor:
    return torch.stack([collect_activations(model, HOOK, model.to_tokens(p), position)[0] for p in prompts])


# ---------------------------------------------------------------- row 2: one rule for padded batches
def test_collect_activations_reads_each_prompt_at_its_own_real_token(tiny: GPT) -> None:
    prompts = VERSE + PROSE
    expected = _one_by_one(tiny, prompts)
    scale = expected.abs().max()
    for side in ("right", "left"):
        tokens, mask = tiny.to_tokens(prompts, padding_side=side, return_mask=True)
        got = collect_activations(tiny, HOOK, tokens, attention_mask=mask)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * scale)
    torch.testing.assert_close(collect_activations(tiny, HOOK, prompts), expected, rtol=1e-4, atol=1e-5 * scale)
    # positions count in each row's real tokens, from the start too
    first = collect_activations(tiny, HOOK, prompts, positions=2)
    torch.testing.assert_close(first, _one_by_one(tiny, prompts, 2), rtol=1e-4, atol=1e-5 * scale)


def test_collect_activations_agrees_with_contrastive_vector_as_the_readme_uses_them(tiny: GPT) -> None:
    acts = collect_activations(tiny, HOOK, VERSE + PROSE, positions=-1)  # the README's call
    v = contrastive_vector(tiny, VERSE, PROSE, HOOK)
    expected = acts[:2].double().mean(0) - acts[2:].double().mean(0)
    torch.testing.assert_close(v.double(), expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


def test_collect_activations_refuses_a_position_past_a_rows_real_tokens(tiny: GPT) -> None:
    with pytest.raises(ValueError, match=r"collect_activations: positions=9 is outside tokens\[1\] \(2 real tokens"):
        collect_activations(tiny, HOOK, ["The cat sat on the mat today", "A"], positions=9)
    tokens, mask = tiny.to_tokens(["The cat", "A dog ran"], return_mask=True)
    with pytest.raises(ValueError, match="attention_mask goes with token ids"):
        collect_activations(tiny, HOOK, ["The cat"], attention_mask=mask)


# ---------------------------------------------------------------- row 3: map_direction on refactored heads
@pytest.fixture(scope="module")
def refactored() -> GPT:
    return GPT.from_pretrained("tiny-gpt2", refactor_factored_attn_matrices=True).eval()


@pytest.fixture(scope="module")
def raw() -> GPT:
    return GPT.from_pretrained_no_processing("tiny-gpt2").eval()


@pytest.mark.parametrize("site", ["q", "k", "v", "z"])
@pytest.mark.parametrize("direction", ["to_refactored", "from_refactored", "processed_to_refactored"])
def test_map_direction_carries_head_vectors_between_factorings(
    tiny: GPT, raw: GPT, refactored: GPT, site: str, direction: str
) -> None:
    from interp_gpt.steering import map_direction, steer

    src, dst = {
        "to_refactored": (raw, refactored),
        "from_refactored": (refactored, raw),
        "processed_to_refactored": (tiny, refactored),
    }[direction]
    hook = f"blocks.1.attn.hook_{site}"
    tokens = tiny.to_tokens("ROMEO: What say you, my lord?")
    v = 3 * torch.randn(tiny.cfg.n_heads, tiny.cfg.d_head, generator=torch.Generator().manual_seed(0))
    w = map_direction(v, src, dst, hook)
    with torch.no_grad(), steer(src, hook, v, positions=[2, 3]):
        a = src(tokens).log_softmax(-1)
    with torch.no_grad(), steer(dst, hook, w, positions=[2, 3]):
        b = dst(tokens).log_softmax(-1)
    with torch.no_grad():
        plain = src(tokens).log_softmax(-1)
    assert float((a - plain).abs().max()) > 0.1  # the steering does something
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max()))
    with pytest.raises(ValueError, match=rf"map_direction: '{hook}', mode='project_out': .* factored differently"):
        map_direction(v, src, dst, hook, mode="project_out")


# ---------------------------------------------------------------- row 8g: labels grouped by Python equality
@pytest.mark.parametrize(
    "labels",
    [
        [1, 1, "1", "1", 2, 2],
        [(0, 1), (0, 1), (1, 0), (1, 0), (2,), (2,)],
        [None, None, "a", "a", "b", "b"],
        [frozenset({1}), frozenset({1}), frozenset({2}), frozenset({2}), frozenset(), frozenset()],
    ],
)
def test_mean_difference_basis_groups_labels_by_python_equality(labels: list) -> None:
    from interp_gpt.causal import mean_difference_basis

    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    basis = mean_difference_basis(x, labels)
    assert basis.shape == (8, 2)  # three classes: the rank-2 span of the centred means
    means = torch.stack([x[0:2].mean(0), x[2:4].mean(0), x[4:6].mean(0)])
    centred = (means - means.mean(0)).T  # [8, 3]
    torch.testing.assert_close(basis @ (basis.T @ centred), centred, rtol=1e-4, atol=1e-5 * float(centred.abs().max()))


def test_mean_difference_basis_refuses_unhashable_labels_by_name() -> None:
    from interp_gpt.causal import mean_difference_basis

    with pytest.raises(TypeError, match=r"labels\[0\]=\[0\] is not hashable"):
        mean_difference_basis(torch.randn(4, 8), [[0], [0], [1], [1]])
    with pytest.raises(ValueError, match=r"labels has 3 entries, expected 4"):
        mean_difference_basis(torch.randn(4, 8), [0, 1, 1])


# ---------------------------------------------------------------- row 11: mean-zero to the dtype's rounding
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hook", ["blocks.1.hook_resid_pre", "blocks.1.ln2.hook_normalized"])
def test_map_direction_takes_a_vector_centred_in_a_low_precision_dtype(dtype: torch.dtype, hook: str) -> None:
    from interp_gpt.steering import map_direction

    processed = GPT.from_pretrained("tiny-gpt2", dtype=dtype)
    raw = GPT.from_pretrained_no_processing("tiny-gpt2", dtype=dtype)
    v = torch.randn(processed.cfg.d_model, generator=torch.Generator().manual_seed(0)).to(dtype)
    with pytest.raises(ValueError, match="mean"):  # a vector with a mean is still refused
        map_direction(v, raw, processed, hook, mode="project_out")
    centred = v - v.mean()  # as the refusal advises; its mean is rounding, not zero
    assert float(centred.float().mean()) != 0.0
    w = map_direction(centred, raw, processed, hook, mode="project_out")
    torch.testing.assert_close(w, centred)


# ---------------------------------------------------------------- row 12: coeff as a 0-d tensor or numpy scalar
def test_steer_takes_a_0d_tensor_and_a_numpy_scalar_as_coeff(tiny: GPT) -> None:
    import numpy as np

    from interp_gpt.steering import Steering, steer

    hook = "blocks.1.hook_resid_pre"
    tokens = tiny.to_tokens("The cat sat on the mat")
    _, cache = tiny.run_with_cache(tokens, names_filter=hook)
    u = torch.randn(tiny.cfg.d_model, generator=torch.Generator().manual_seed(0))
    u = u / u.norm()
    coeff = (cache[hook] @ u).mean()  # the docstring's recipe: a 0-d tensor
    with torch.no_grad(), steer(tiny, hook, u, coeff=float(coeff), mode="ablate"):
        expected = tiny(tokens)
    scale = float(expected.abs().max())
    for c in (coeff, np.float32(coeff.item()), np.float64(coeff.item())):
        for spec in ((hook, u, c, "ablate"), ([Steering(hook, u, coeff=c, mode="ablate")],)):
            with torch.no_grad(), steer(tiny, *spec):
                torch.testing.assert_close(tiny(tokens), expected, rtol=1e-4, atol=1e-4 * scale)
    with pytest.raises(TypeError, match="coeff must be a number"):
        with steer(tiny, hook, u, coeff=torch.tensor([1.0, 2.0])):
            pass
    with pytest.raises(TypeError, match="coeff must be a number"):
        with steer(tiny, hook, u, coeff=torch.tensor(True)):
            pass


def test_interchange_takes_a_0d_tensor_strength(tiny: GPT) -> None:
    import numpy as np

    from interp_gpt.causal import interchange, random_basis

    base, source = tiny.to_tokens(["The cat sat on the"]), tiny.to_tokens(["The dog ran to the"])
    B = random_basis(tiny.cfg.d_model, 4, seed=1)
    expected = interchange(tiny, HOOK, base, source, B, strength=0.5)
    scale = float(expected.abs().max())
    for s in (torch.tensor(0.5), np.float32(0.5)):
        torch.testing.assert_close(
            interchange(tiny, HOOK, base, source, B, strength=s), expected, rtol=1e-4, atol=1e-4 * scale
        )


# ---------------------------------------------------------------- row 13: a bool positive_label
def test_sparse_probing_takes_a_bool_positive_label() -> None:
    from interp_gpt.causal import sparse_probing

    g = torch.Generator().manual_seed(0)
    labels = torch.arange(40) % 2 == 0
    features = torch.randn(40, 8, generator=g)
    features[:, 3] += 2.0 * labels
    for flag, number in ((True, 1), (False, 0)):
        a = sparse_probing(features, labels, k=2, positive_label=flag)
        b = sparse_probing(features, labels, k=2, positive_label=number)
        assert a.positive_label == number and a.accuracy == b.accuracy
        assert torch.equal(a.selected_features, b.selected_features)
        torch.testing.assert_close(a.coefficients, b.coefficients)
    with pytest.raises(ValueError, match=r"positive_label=2 is not one of the labels' classes \[0, 1\]"):
        sparse_probing(features, labels, k=2, positive_label=2)


# ---------------------------------------------------------------- row 16: a tiny sampling temperature
@pytest.mark.parametrize("temperature", [1e-39, 1e-300, 5e-324])
def test_generate_samples_stably_at_a_tiny_temperature(tiny: GPT, temperature: float) -> None:
    greedy = tiny.generate("The cat", max_new_tokens=6, do_sample=False, verbose=False)
    for extra in ({}, {"top_k": 5}, {"top_p": 0.5}):
        sampled = tiny.generate("The cat", max_new_tokens=6, temperature=temperature, seed=0, verbose=False, **extra)
        assert sampled == greedy  # the limit T -> 0 of sampling is greedy decoding (no ties here)


def test_the_generate_command_takes_a_tiny_temperature(tiny: GPT, capsys: pytest.CaptureFixture[str]) -> None:
    from interp_gpt.cli import main

    rc = main(["generate", "The cat", "--temperature", "1e-39", "--max-new-tokens", "6", "--seed", "0"])
    out, err = capsys.readouterr()
    greedy = tiny.generate("The cat", max_new_tokens=6, do_sample=False, verbose=False)
    assert rc == 0, err
    assert out == greedy + "\n"


# ---------------------------------------------------------------- rows 10 and 17: fit_das and the causal seeds
def _das_problem(model: GPT) -> tuple:
    ids = [model.to_single_token(w) for w in (" he", " she")]
    base, source = model.to_tokens(["Then he", "Then she"]), model.to_tokens(["Then she", "Then he"])
    return base, source, torch.tensor([1, 0]), (lambda t: model(t)[:, -1, ids])


def test_fit_das_trains_under_inference_mode_as_outside_it(tiny: GPT) -> None:
    from interp_gpt.causal import fit_das

    base, source, targets, task = _das_problem(tiny)
    expected = fit_das(tiny, HOOK, base, source, targets, task, rank=1, epochs=3, progress=False)
    with torch.inference_mode():
        base, source, targets, _ = _das_problem(tiny)  # inference tensors, made inside
        got = fit_das(tiny, HOOK, base, source, targets, task, rank=1, epochs=3, progress=False)
    assert not got.basis.is_inference()
    torch.testing.assert_close(got.basis, expected.basis)
    assert got.losses == pytest.approx(expected.losses, rel=1e-5)
    assert all(p.requires_grad for p in tiny.parameters())  # restored


@pytest.mark.parametrize("seed", [-1, 1.5, "0", 2**64, True])
def test_the_causal_tools_refuse_a_bad_seed_by_name_before_any_work(tiny: GPT, seed: object) -> None:
    from interp_gpt.causal import fit_das, norm_matched_placebo, random_basis, sparse_probing

    base, source, targets, task = _das_problem(tiny)
    error = (TypeError, ValueError)
    with pytest.raises(error, match=r"fit_das: seed"):
        fit_das(tiny, HOOK, base, source, targets, task, rank=1, epochs=1, progress=False, seed=seed)
    B = random_basis(tiny.cfg.d_model, 2)
    with pytest.raises(error, match=r"norm_matched_placebo: seed"):
        norm_matched_placebo(tiny, HOOK, base, source, B, seed=seed)
    with pytest.raises(error, match=r"random_basis: seed"):
        random_basis(tiny.cfg.d_model, 2, seed=seed)
    with pytest.raises(error, match=r"sparse_probing: seed"):
        sparse_probing(torch.randn(8, 4), torch.arange(8) % 2, k=1, seed=seed)
