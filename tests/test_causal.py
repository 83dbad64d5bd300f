"""interp_gpt.causal: interchange and its placebo against plain hooks, DAS on a planted causal variable,
sparse probing on planted features, and the bad-input errors. (Parity with transformer-lens 4.3:
tests/test_causal_transformer_lens.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.causal import (
    check_basis,
    collect_activations,
    fit_das,
    interchange,
    mean_difference_basis,
    norm_matched_placebo,
    orthonormal_basis,
    random_basis,
    sparse_probing,
)

HOOK = "blocks.1.hook_resid_pre"
D = 32


def planted_variable_model(seed: int = 0) -> tuple[GPT, torch.Tensor]:
    """A 2-layer model (d_model 32, 20 tokens) whose answer is one direction `u` of the residual stream:
    tokens 2..10 write -2u, tokens 11..19 write +2u (plus noise), and the unembedding reads +-5u into
    tokens 0 and 1. So "is the last token >= 11" is a causal variable carried by `u` alone."""
    model = GPT(Config(n_layers=2, d_model=D, n_heads=2, d_vocab=20, n_ctx=8))
    model.init_weights(seed=seed)
    gen = torch.Generator().manual_seed(seed + 1000)  # not random_basis' seeds: the placebo must not find u
    u = torch.randn(D, generator=gen)
    u = (u - u.mean()) / (u - u.mean()).norm()  # mean zero, so the LayerNorms keep it
    sign = torch.zeros(20)
    sign[2:11], sign[11:] = -1.0, 1.0
    with torch.no_grad():
        model.embed.W_E.copy_(0.3 * torch.randn(20, D, generator=gen) + 2.0 * sign[:, None] * u)
        model.unembed.W_U.zero_()
        model.unembed.W_U[:, 0], model.unembed.W_U[:, 1] = -5.0 * u, 5.0 * u
    return model.eval(), u


def pairs(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random base and source prompts and the high-level model's answer under the interchange: the source's variable."""
    base = torch.randint(2, 20, (n, 5), generator=gen)
    source = torch.randint(2, 20, (n, 5), generator=gen)
    return base, source, (source[:, -1] >= 11).long()


@pytest.fixture(scope="module")
def planted() -> tuple[GPT, torch.Tensor]:
    return planted_variable_model()


@pytest.fixture(scope="module")
def small() -> GPT:
    model = GPT(Config(n_layers=2, d_model=D, n_heads=4, d_vocab=50, n_ctx=10))
    model.init_weights(seed=3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-1].startswith("W_"):
                p.mul_(5.0)  # larger weights: an intervention moves the logits visibly
    return model.eval()


def tokens(n: int, seed: int, length: int = 7) -> torch.Tensor:
    return torch.randint(0, 50, (n, length), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------
# interchange and the placebo
# ----------------------------------------------------------------------------
def _by_hand(model: GPT, base: torch.Tensor, new_rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The base run with the rows at `pos` replaced by `new_rows`, by a plain hook."""

    def put(act: torch.Tensor, hook: object) -> torch.Tensor:
        act = act.clone()
        act[torch.arange(len(act)), pos] = new_rows
        return act

    with torch.no_grad():
        return model.run_with_hooks(base, fwd_hooks=[(HOOK, put)])


def test_interchange_is_h_plus_s_times_the_source_move_inside_the_basis(small: GPT) -> None:
    base, source = tokens(5, 0), tokens(5, 1, length=9)
    pos, src_pos = torch.tensor([6, 0, 3, -1, 2]), torch.tensor([8, 1, -2, 4, 0])
    B = random_basis(D, 3, seed=4)
    _, cache = small.run_with_cache(base, names_filter=HOOK)
    _, src_cache = small.run_with_cache(source, names_filter=HOOK)
    h = cache[HOOK][torch.arange(5), pos % 7]
    s = src_cache[HOOK][torch.arange(5), src_pos % 9]
    want = _by_hand(small, base, h + 0.6 * ((s - h) @ B) @ B.T, pos % 7)
    got = interchange(small, HOOK, base, source, B, pos, 0.6, source_positions=src_pos, batch_size=2)
    assert (got - want).abs().max() < 1e-5
    assert (got - small(base)).abs().max() > 0.1  # the intervention did something
    # the source rows, through the cache
    assert (collect_activations(small, HOOK, source, src_pos) - s).abs().max() < 1e-6


def test_full_basis_strength_one_takes_the_source_row_and_strength_zero_leaves_the_base(small: GPT) -> None:
    base, source = tokens(4, 2), tokens(4, 3)
    s = collect_activations(small, HOOK, source, 3)
    full = interchange(small, HOOK, base, source, torch.eye(D), positions=3)
    assert (full - _by_hand(small, base, s, torch.full((4,), 3))).abs().max() < 1e-4
    still = interchange(small, HOOK, base, source, random_basis(D, 5), positions=3, strength=0.0)
    assert (still - small(base)).abs().max() < 1e-5
    same = interchange(small, HOOK, base, base, random_basis(D, 5), positions=3)
    assert (same - small(base)).abs().max() < 1e-5


def test_the_placebo_moves_as_far_as_the_interchange_inside_its_own_subspace(small: GPT) -> None:
    base, source = tokens(4, 4), tokens(4, 5)
    B, P = random_basis(D, 2, seed=1), random_basis(D, 3, seed=9)
    # with the placebo basis equal to the basis, it is the interchange itself
    a = norm_matched_placebo(small, HOOK, base, source, B, 4, 0.8, placebo_basis=B)
    assert (a - interchange(small, HOOK, base, source, B, 4, 0.8)).abs().max() < 1e-4
    h = collect_activations(small, HOOK, base, 4)
    s = collect_activations(small, HOOK, source, 4)
    move = ((s - h) @ P) @ P.T
    distance = (0.8 * ((s - h) @ B) @ B.T).norm(dim=-1, keepdim=True)
    want = _by_hand(small, base, h + move * distance / move.norm(dim=-1, keepdim=True), torch.full((4,), 4))
    got = norm_matched_placebo(small, HOOK, base, source, B, 4, 0.8, placebo_basis=P)
    assert (got - want).abs().max() < 1e-4
    # the default placebo basis is random_basis(d, rank, seed)
    by_seed = norm_matched_placebo(small, HOOK, base, source, B, 4, 0.8, seed=9)
    assert (
        by_seed - norm_matched_placebo(small, HOOK, base, source, B, 4, 0.8, placebo_basis=random_basis(D, 2, 9))
    ).abs().max() < 1e-6


def test_task_logits_are_what_interchange_returns(small: GPT) -> None:
    base, source = tokens(3, 6), tokens(3, 7)
    B = random_basis(D, 2)
    full = interchange(small, HOOK, base, source, B)
    task = interchange(small, HOOK, base, source, B, task_logits=lambda t: small(t)[:, -1, [3, 8]])
    assert task.shape == (3, 2) and torch.allclose(task, full[:, -1, [3, 8]], atol=1e-6)


# ----------------------------------------------------------------------------
# bases
# ----------------------------------------------------------------------------
def test_bases_are_orthonormal_seeded_and_leave_the_global_random_state_alone() -> None:
    state = torch.random.get_rng_state()
    B = random_basis(D, 4, seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(B, random_basis(D, 4, seed=7)) and not torch.equal(B, random_basis(D, 4, seed=8))
    assert torch.allclose(B.T @ B, torch.eye(4), atol=1e-5)
    assert orthonormal_basis(torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 0.0]])).shape == (3, 1)


def test_mean_difference_basis_is_the_difference_of_the_class_means() -> None:
    acts = torch.randn(30, 6, generator=torch.Generator().manual_seed(0))
    labels = ["a", "b", "c"] * 10
    two = mean_difference_basis(acts[:20], labels[:20] and [0, 1] * 10)
    diff = acts[:20][1::2].mean(0) - acts[:20][0::2].mean(0)
    assert abs(abs(float(two[:, 0] @ diff / diff.norm())) - 1.0) < 1e-5
    three = mean_difference_basis(acts, labels)
    assert three.shape == (6, 2) and torch.allclose(three.T @ three, torch.eye(2), atol=1e-5)


# ----------------------------------------------------------------------------
# DAS on a planted variable
# ----------------------------------------------------------------------------
def test_das_finds_the_planted_direction_and_the_placebo_stays_at_chance(planted: tuple[GPT, torch.Tensor]) -> None:
    model, u = planted
    gen = torch.Generator().manual_seed(1)
    base, source, targets = pairs(256, gen)
    test_base, test_source, test_targets = pairs(128, gen)

    def task(t: torch.Tensor) -> torch.Tensor:
        return model(t)[:, -1, :2]

    with torch.no_grad():
        assert bool((task(test_base).argmax(-1) == (test_base[:, -1] >= 11).long()).all())  # the model knows the answer
    flags = [p.requires_grad for p in model.parameters()]
    state = torch.random.get_rng_state()
    result = fit_das(model, HOOK, base, source, targets, task, rank=1, epochs=10, batch_size=64, progress=False)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert [p.requires_grad for p in model.parameters()] == flags
    assert result.losses[-1] < 0.1 * result.losses[0] and result.hook == HOOK and result.rank == 1
    assert abs(float(result.basis[:, 0] @ u)) > 0.8  # it found u

    accuracy = (
        interchange(model, HOOK, test_base, test_source, result.basis, task_logits=task).argmax(-1) == test_targets
    )
    placebo = norm_matched_placebo(model, HOOK, test_base, test_source, result.basis, task_logits=task).argmax(-1)
    chance = float((test_targets == (test_base[:, -1] >= 11).long()).float().mean())  # pairs where base = source
    print(f"DAS held-out interchange accuracy {accuracy.float().mean():.3f}, "
          f"placebo {(placebo == test_targets).float().mean():.3f}, chance {chance:.3f}")  # fmt: skip
    assert accuracy.float().mean() >= 0.9
    assert abs(float((placebo == test_targets).float().mean()) - chance) < 0.1
    # the same seed, the same fit
    again = fit_das(model, HOOK, base[:64], source[:64], targets[:64], task, rank=1, epochs=1, progress=False, seed=3)
    twice = fit_das(model, HOOK, base[:64], source[:64], targets[:64], task, rank=1, epochs=1, progress=False, seed=3)
    assert torch.equal(again.basis, twice.basis) and torch.allclose(
        again.basis.T @ again.basis, torch.eye(1), atol=1e-5
    )


# ----------------------------------------------------------------------------
# sparse probing
# ----------------------------------------------------------------------------
def test_sparse_probing_picks_the_planted_features_and_splits_each_class() -> None:
    gen = torch.Generator().manual_seed(0)
    labels = (torch.rand(70, generator=gen) < 0.4).long()
    features = torch.randn(70, 40, generator=gen)
    features[:, 7] += 3.0 * labels
    features[:, 22] -= 2.0 * labels
    probe = sparse_probing(features, labels, k=2, seed=1)
    assert probe.selected_features.tolist() == [7, 22]
    assert probe.coefficients[0] > 0 > probe.coefficients[1] and probe.accuracy >= 0.9
    n_pos, n_neg = int(labels.sum()), int((1 - labels).sum())
    test = labels[probe.test_indices]
    assert int(test.sum()) == math.ceil(0.3 * n_pos) and int((1 - test).sum()) == math.ceil(0.3 * n_neg)
    assert sorted(torch.cat([probe.train_indices, probe.test_indices]).tolist()) == list(range(70))
    assert probe.newton_decrement <= 1e-12
    held_out = probe.predict(features[probe.test_indices]) >= 0
    assert probe.accuracy == float((held_out == test.bool()).double().mean())
    again = sparse_probing(features, labels, k=2, seed=1)
    assert torch.equal(again.coefficients, probe.coefficients)
    assert not torch.equal(sparse_probing(features, labels, k=2, seed=2).test_indices, probe.test_indices)
    # L-BFGS stopped after 2 iterations: the Newton steps still reach the optimum
    short = sparse_probing(features, labels, k=5, seed=1, max_iter=2)
    full = sparse_probing(features, labels, k=5, seed=1)
    assert short.newton_decrement <= 1e-12 and torch.allclose(short.coefficients, full.coefficients, atol=1e-6)


# ----------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------
def test_bad_inputs_name_the_argument(small: GPT) -> None:
    base, source = tokens(2, 0), tokens(2, 1)
    B = random_basis(D, 2)
    with pytest.raises(KeyError, match=r"did you mean 'blocks.1.hook_resid_pre'"):
        interchange(small, "blocks.1.hook_resid_pr", base, source, B)
    with pytest.raises(ValueError, match=r"basis has shape \(16, 2\), expected \[32, rank\]"):
        interchange(small, HOOK, base, source, random_basis(16, 2))
    with pytest.raises(ValueError, match="basis is not orthonormal"):
        interchange(small, HOOK, base, source, 2.0 * B)
    with pytest.raises(ValueError, match=r"positions\[1\]=7 is out of range: positions are 0..6"):
        interchange(small, HOOK, base, source, B, positions=[0, 7])
    with pytest.raises(ValueError, match=r"source_positions\[0\]=-8 is out of range"):
        interchange(small, HOOK, base, source, B, source_positions=-8)
    with pytest.raises(ValueError, match="source has 1 rows, base 2"):
        interchange(small, HOOK, base, source[:1], B)
    with pytest.raises(
        ValueError, match=r"'blocks.0.attn.hook_z' holds shape \(2, 7, 4, 8\), expected \[batch, pos, d\]"
    ):
        interchange(small, "blocks.0.attn.hook_z", base, source, random_basis(8, 1))
    with pytest.raises(ValueError, match="fired 2 times"):
        interchange(small, HOOK, base, source, B, task_logits=lambda t: small(t) + small(t))
    with pytest.raises(ValueError, match="placebo_basis is not orthonormal"):
        norm_matched_placebo(small, HOOK, base, source, B, placebo_basis=B + 1.0)
    with pytest.raises(TypeError, match="strength must be a number"):
        interchange(small, HOOK, base, source, B, strength="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"base: token id 50 at \[batch, posn\] = \[1, 6\] is out of range"):
        interchange(small, HOOK, base + 1, source, B)
    with pytest.raises(TypeError, match="basis must be a tensor"):
        check_basis([[1.0]], D)


def test_bad_das_and_probing_inputs_name_the_argument(small: GPT) -> None:
    base, source = tokens(4, 0), tokens(4, 1)

    def task(t: torch.Tensor) -> torch.Tensor:
        return small(t)[:, -1, :2]

    with pytest.raises(ValueError, match="targets must be class indices 0..1"):
        fit_das(small, HOOK, base, source, torch.tensor([0, 1, 2, 0]), task, rank=1, progress=False)
    with pytest.raises(ValueError, match="one row per pair, got 4, 4, 3"):
        fit_das(small, HOOK, base, source, torch.tensor([0, 1, 0]), task, rank=1, progress=False)
    with pytest.raises(
        ValueError, match=r"rank=33 is out of range: ranks at blocks.1.hook_resid_pre \(d=32\) are 1..32"
    ):
        fit_das(small, HOOK, base, source, torch.tensor([0, 1, 1, 0]), task, rank=33, progress=False)
    with pytest.raises(KeyError, match="did you mean"):
        fit_das(small, "blocks.1.hook_mlp_outt", base, source, torch.tensor([0, 1, 1, 0]), task, rank=1)
    features, labels = torch.randn(20, 5), torch.arange(20) % 2
    with pytest.raises(ValueError, match="labels must hold exactly two classes .binary., got \\[0, 1, 2\\]"):
        sparse_probing(features, torch.arange(20) % 3, k=2)
    with pytest.raises(ValueError, match="k=6 is out of range: k values for 5 features are 1..5"):
        sparse_probing(features, labels, k=6)
    with pytest.raises(TypeError, match="labels must be bool or integer class labels, got dtype torch.float32"):
        sparse_probing(features, labels.float(), k=2)
    with pytest.raises(ValueError, match=r"labels has shape \(19,\), expected \[20\]"):
        sparse_probing(features, labels[:19], k=2)
    with pytest.raises(ValueError, match="test_fraction=1.0 is out of range"):
        sparse_probing(features, labels, k=2, test_fraction=1.0)
    with pytest.raises(ValueError, match="positive_label=3 is not one of"):
        sparse_probing(features, labels, k=2, positive_label=3)
    with pytest.raises(ValueError, match="features must hold finite"):
        sparse_probing(features / 0.0, labels, k=2)


def test_fit_das_trains_under_a_callers_no_grad():
    """Notebooks switch gradients off globally (torch.set_grad_enabled(False)); DAS must still train."""
    model = GPT.from_pretrained("tiny-gpt2")
    ids = [model.to_single_token(w) for w in (" he", " she")]
    base, source = model.to_tokens(["Then he", "Then she"]), model.to_tokens(["Then she", "Then he"])
    task = lambda t: model(t)[:, -1, ids]  # noqa: E731
    with torch.no_grad():
        quiet = fit_das(
            model,
            "blocks.0.hook_resid_post",
            base,
            source,
            torch.tensor([1, 0]),
            task,
            rank=1,
            epochs=2,
            progress=False,
        )
    loud = fit_das(
        model, "blocks.0.hook_resid_post", base, source, torch.tensor([1, 0]), task, rank=1, epochs=2, progress=False
    )
    assert torch.equal(quiet.basis, loud.basis) and quiet.losses == loud.losses
