"""Synthetic ground truth for SAEs (interp_gpt.sae.synthetic): equal to sae-lens 6.54's `sae_lens.synthetic`
number for number (a seeded sample equals sae-lens' after `torch.manual_seed` with the same seed, exactly),
its folder format both ways, its scores on the same SAE; and, without sae-lens, the statistics the samples
must have, the scores of SAEs whose answer is known, and bad input refused by name.

The comparisons need sae-lens, which pins transformer-lens < 4: CI installs it in its transformer-lens 3.9
venv (.venv-tl3); elsewhere they skip and say so.
"""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from interp_gpt.checkpoints.sources import CheckpointError
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.synthetic import (
    ActivationGenerator,
    ConstantFiringProbabilityConfig,
    ExponentialMagnitudeConfig,
    FeatureDictionary,
    FoldedNormalMagnitudeConfig,
    Hierarchy,
    HierarchyConfig,
    HierarchyNode,
    LinearFiringProbabilityConfig,
    LinearMagnitudeConfig,
    RandomFiringProbabilityConfig,
    SyntheticModel,
    SyntheticModelConfig,
    ZipfianFiringProbabilityConfig,
    absorption_score,
    classification_metrics,
    create_correlation_matrix_from_correlations,
    evaluate_synthetic,
    feature_uniqueness,
    generate_hierarchy,
    generate_random_low_rank_correlation_matrix,
    linear_sum_assignment,
    load_synthetic_model,
    mean_correlation_coefficient,
    planted_hierarchy_model,
    save_synthetic_model,
)

try:
    import sae_lens
    from sae_lens import synthetic as S
except ImportError:  # sae-lens needs transformer-lens < 4
    sae_lens = S = None

needs_sae_lens = pytest.mark.skipif(
    sae_lens is None, reason="sae-lens is not installed here; CI's transformer-lens 3.9 venv (.venv-tl3) has it"
)

# Model configs as sae-lens' JSON says them: the defaults, and one with every part switched on.
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": dict(num_features=30, hidden_dim=10, seed=1),
    "everything": dict(
        num_features=40,
        hidden_dim=12,
        firing_probability={"generator_name": "random", "max_prob": 0.6, "min_prob": 0.1},
        hierarchy={
            "total_root_nodes": 3,
            "branching_factor": [2, 4],
            "max_depth": 2,
            "mutually_exclusive_portion": 0.6,
            "compensate_probabilities": True,
        },
        correlation={"rank": 3, "correlation_scale": 0.3, "seed": None},
        std_firing_magnitudes={"generator_name": "folded_normal", "mean": 0.2, "std": 0.1},
        mean_firing_magnitudes={"generator_name": "linear", "start": 1.0, "end": 3.0},
        orthogonalization={"num_steps": 5, "lr": 0.01, "chunk_size": 7},
        bias=0.5,
        seed=5,
    ),  # fmt: skip
    "scaled_children": dict(
        num_features=25,
        hidden_dim=8,
        firing_probability={"generator_name": "linear", "max_prob": 0.7, "min_prob": 0.2},
        hierarchy={
            "total_root_nodes": 2,
            "branching_factor": 3,
            "max_depth": 2,
            "mutually_exclusive_portion": 1.0,
            "mutually_exclusive_min_depth": 1,
            "scale_children_by_parent": True,
        },
        std_firing_magnitudes=0.3,
        mean_firing_magnitudes={"generator_name": "exponential", "start": 0.5, "end": 2.0},
        bias=True,
        seed=9,
    ),  # fmt: skip
}


def ours_and_theirs(name: str) -> tuple[SyntheticModel, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the compensation's clamping warning
        ours = SyntheticModel(SyntheticModelConfig.from_dict(CONFIGS[name]))
    assert S is not None
    return ours, S.SyntheticModel(S.SyntheticModelConfig.from_dict(ours.cfg.to_dict()))  # our JSON, read by sae-lens


def sae_lens_twin(sae: SAE) -> Any:
    """sae-lens' SAE of the same config, holding the same tensors (as in test_sae.py)."""
    assert sae_lens is not None
    twin = sae_lens.SAE.from_dict(sae.cfg.to_dict())
    twin.load_state_dict(sae.state_dict(), strict=True)
    return twin


def sae_with(w_enc: torch.Tensor, w_dec: torch.Tensor, b_enc: torch.Tensor | None = None) -> SAE:
    """A standard (ReLU) SAE with these weights, b_dec = 0."""
    sae = SAE(SAEConfig(d_in=w_enc.shape[0], d_sae=w_enc.shape[1]))
    with torch.no_grad():
        sae.W_enc.copy_(w_enc)
        sae.W_dec.copy_(w_dec)
        sae.b_enc.copy_(torch.zeros(w_enc.shape[1]) if b_enc is None else b_enc)
        sae.b_dec.zero_()
    return sae


def ideal_sae(model: SyntheticModel) -> SAE:
    """Encoder and decoder the true features; an encoder bias of -1e-5 keeps float noise (F F^T is I only up to
    ~1e-7) from firing a latent whose feature is off."""
    f = model.feature_vectors
    return sae_with(f.T.clone(), f.clone(), torch.full((f.shape[0],), -1e-5))


def noisy_sae(model: SyntheticModel, d_sae: int, seed: int) -> SAE:
    """Some latents near true features, the rest random; non-zero encoder biases (some latents dead)."""
    g = torch.Generator().manual_seed(seed)
    f = model.feature_vectors
    w_dec = torch.randn(d_sae, f.shape[1], generator=g)
    k = min(d_sae, f.shape[0]) // 2
    w_dec[:k] = f[:k] + 0.2 * torch.randn(k, f.shape[1], generator=g)
    b_enc = -0.3 * torch.rand(d_sae, generator=g)
    b_enc[-2:] = -100.0  # dead
    return sae_with(w_dec.T.clone(), w_dec, b_enc)


# ----------------------------------------------------------------------------
# Equal to sae-lens
# ----------------------------------------------------------------------------
@needs_sae_lens
def test_firing_probabilities_and_magnitudes_equal_sae_lens() -> None:
    assert S is not None
    pairs = [
        (ZipfianFiringProbabilityConfig(exponent=1.3, max_prob=0.4), S.ZipfianFiringProbabilityConfig(exponent=1.3, max_prob=0.4)),
        (LinearFiringProbabilityConfig(), S.LinearFiringProbabilityConfig()),
        (RandomFiringProbabilityConfig(), S.RandomFiringProbabilityConfig()),
        (ConstantFiringProbabilityConfig(0.2), S.ConstantFiringProbabilityConfig(0.2)),
        (LinearMagnitudeConfig(1.0, 4.0), S.LinearMagnitudeConfig(1.0, 4.0)),
        (ExponentialMagnitudeConfig(0.5, 8.0), S.ExponentialMagnitudeConfig(0.5, 8.0)),
        (FoldedNormalMagnitudeConfig(1.0, 0.5, 0.2, 1.5), S.FoldedNormalMagnitudeConfig(1.0, 0.5, 0.2, 1.5)),
    ]  # fmt: skip
    for ours, theirs in pairs:
        assert ours.to_dict() == theirs.to_dict()
        for n, seed in ((1, 3), (17, 3), (17, None)):
            if seed is None and isinstance(ours, FoldedNormalMagnitudeConfig):
                continue  # draws from the global generator
            assert torch.equal(ours.generate(n, seed=seed), theirs.generate(n, seed=seed)), (ours, n, seed)


@needs_sae_lens
def test_correlations_equal_sae_lens() -> None:
    assert S is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n, rank, scale in ((20, 3, 0.2), (10, 4, 0.9)):  # the second caps rows
            ours = generate_random_low_rank_correlation_matrix(n, rank, scale, seed=7)
            theirs = S.generate_random_low_rank_correlation_matrix(n, rank, scale, seed=7)
            assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    for pairs, default in (({(0, 1): 0.5, (2, 3): -0.3}, 0.0), ({(0, 1): 0.9, (1, 2): 0.9, (0, 2): -0.9}, 0.1)):
        ours_m = create_correlation_matrix_from_correlations(4, pairs, default)
        torch.testing.assert_close(ours_m, S.create_correlation_matrix_from_correlations(4, pairs, default))


@needs_sae_lens
@pytest.mark.parametrize("seed", [0, 4])
def test_generated_hierarchy_equals_sae_lens(seed: int) -> None:
    assert S is not None
    for kw in (
        dict(total_root_nodes=3, branching_factor=(2, 4), max_depth=3, mutually_exclusive_portion=0.5),
        dict(total_root_nodes=5, branching_factor=3, max_depth=2, mutually_exclusive_portion=0.7,
             mutually_exclusive_min_depth=1, mutually_exclusive_max_depth=1, scale_children_by_parent=True),
    ):  # fmt: skip
        ours = generate_hierarchy(60, HierarchyConfig(**kw), seed=seed)  # type: ignore[arg-type]
        theirs = S.generate_hierarchy(60, S.HierarchyConfig(**kw), seed=seed)
        assert ours.to_dict() == theirs.to_dict()
        assert any(n.mutually_exclusive_children for n in ours.nodes())
        probs = torch.rand(60, generator=torch.Generator().manual_seed(seed)) * 0.5 + 0.1
        assert torch.equal(
            ours.compute_probability_correction_factors(probs), theirs.compute_probability_correction_factors(probs)
        )


@needs_sae_lens
@pytest.mark.parametrize("name", list(CONFIGS))
def test_synthetic_model_equals_sae_lens_sample_for_sample(name: str) -> None:
    """Same config: the same dictionary, probabilities, magnitudes, hierarchy, correlation; and the same seed
    (ours: seed=s; sae-lens: torch.manual_seed(s)) gives the same samples, exactly."""
    ours, theirs = ours_and_theirs(name)
    assert ours.cfg.to_dict() == theirs.cfg.to_dict()
    assert torch.equal(ours.feature_vectors, theirs.feature_dict.feature_vectors.detach())
    assert torch.equal(ours.feature_dict.bias, theirs.feature_dict.bias)
    for field in ("firing_probabilities", "std_firing_magnitudes", "mean_firing_magnitudes"):
        assert torch.equal(getattr(ours.activation_generator, field), getattr(theirs.activation_generator, field)), (
            field
        )
    assert (ours.hierarchy is None) == (theirs.hierarchy is None)
    if ours.hierarchy is not None:
        assert ours.hierarchy.to_dict() == theirs.hierarchy.to_dict()
    for seed in (0, 3):
        torch.manual_seed(seed)
        hidden_t, feats_t = theirs.sample_with_features(2000)
        hidden_o, feats_o = ours.sample_with_features(2000, seed=seed)
        assert torch.equal(feats_o, feats_t) and torch.equal(hidden_o, hidden_t)
        assert 0.01 < (feats_o > 0).float().mean() < 0.9  # a non-trivial sample


@needs_sae_lens
def test_hand_built_hierarchy_and_full_correlation_equal_sae_lens() -> None:
    """Grouping nodes (no feature), exclusion at two depths, children that scale with their parent, a full
    correlation matrix: sae-lens' ActivationGenerator with its hierarchy_modifier, sample for sample."""
    assert S is not None

    def tree(node_cls: Any) -> list[Any]:
        N = node_cls
        return [
            N(0, [N(2, [N(5), N(6), N(7)], mutually_exclusive_children=True), N(3), N(4, [N(8), N(9)], scale_children_by_parent=True)],
              mutually_exclusive_children=True),
            N(None, [N(10, [N(12), N(13)], mutually_exclusive_children=True), N(11)], mutually_exclusive_children=True),
        ]  # fmt: skip

    n = 16
    corr = create_correlation_matrix_from_correlations(n, {(0, 1): 0.6, (2, 3): 0.5, (5, 6): 0.7, (10, 11): -0.4})
    probs = torch.linspace(0.7, 0.3, n)
    kw: dict[str, Any] = dict(std_firing_magnitudes=0.2, mean_firing_magnitudes=torch.linspace(1.0, 2.0, n))
    for c in (None, corr, generate_random_low_rank_correlation_matrix(n, 2, 0.3, seed=1)):
        ours = ActivationGenerator(n, probs, hierarchy=tree(HierarchyNode), correlation_matrix=c, **kw)
        theirs = S.ActivationGenerator(
            n, probs, modify_activations=S.hierarchy_modifier(tree(S.HierarchyNode)), correlation_matrix=c, **kw
        )
        torch.manual_seed(11)
        expected = theirs.sample(3000)
        got = ours.sample(3000, seed=11)
        assert torch.equal(got, expected)
        assert ((got[:, 5:8] > 0).sum(1) <= 1).all() and (got[:, 10:12] > 0).all(1).logical_not().all()


@needs_sae_lens
def test_our_files_load_in_sae_lens_and_theirs_here(tmp_path: Path) -> None:
    for name in ("everything", "scaled_children"):
        ours, theirs = ours_and_theirs(name)
        save_synthetic_model(ours, tmp_path / f"ours_{name}")
        theirs.save(tmp_path / f"theirs_{name}")
        assert sorted(p.name for p in (tmp_path / f"ours_{name}").iterdir()) == sorted(
            p.name for p in (tmp_path / f"theirs_{name}").iterdir()
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            back_there = S.SyntheticModel.load_from_disk(tmp_path / f"ours_{name}")  # type: ignore[union-attr]
            back_here = load_synthetic_model(tmp_path / f"theirs_{name}")
        for a, b in ((back_there, theirs), (back_here, ours)):  # each loaded model equals the original
            torch.manual_seed(2)
            x_a = a.sample_with_features(500) if a is back_there else a.sample_with_features(500, seed=2)
            torch.manual_seed(2)
            x_b = b.sample_with_features(500) if b is theirs else b.sample_with_features(500, seed=2)
            assert torch.equal(x_a[0], x_b[0]) and torch.equal(x_a[1], x_b[1])
        assert back_here.cfg.to_dict() == theirs.cfg.to_dict() and back_there.cfg.to_dict() == ours.cfg.to_dict()


@needs_sae_lens
def test_scores_equal_sae_lens_functions() -> None:
    assert S is not None
    g = torch.Generator().manual_seed(0)
    for n_a, n_b in ((12, 12), (20, 9), (7, 15)):
        a, b = torch.randn(n_a, 6, generator=g), torch.randn(n_b, 6, generator=g)
        assert mean_correlation_coefficient(a, b) == pytest.approx(S.mean_correlation_coefficient(a, b), abs=1e-6)
        assert feature_uniqueness(a, b) == S.feature_uniqueness(a, b)
        latents = torch.relu(torch.randn(300, n_a, generator=g))
        acts = torch.relu(torch.randn(300, n_b, generator=g) - 0.5)
        theirs = S.compute_classification_metrics(latents, acts, a, b)
        assert classification_metrics(latents, acts, a, b) == pytest.approx(vars(theirs), abs=1e-7)
    from scipy.optimize import linear_sum_assignment as scipy_lsa

    for shape in ((30, 30), (40, 25), (25, 60)):
        cost = torch.rand(shape, generator=g).numpy()
        rows, cols = linear_sum_assignment(cost)
        r2, c2 = scipy_lsa(cost)
        assert cost[rows, cols].sum() == pytest.approx(cost[r2, c2].sum(), abs=1e-9)
        assert len(set(rows)) == len(rows) == len(set(cols)) == min(shape)


@needs_sae_lens
@pytest.mark.parametrize("name", ["everything", "scaled_children"])
def test_evaluation_equals_sae_lens(name: str) -> None:
    """The same SAE (our weights in sae-lens' SAE), the same samples: sae-lens' eval_sae_on_synthetic_data."""
    assert S is not None
    ours, theirs = ours_and_theirs(name)
    for sae, scale in ((noisy_sae(ours, 24, seed=1), None), (ideal_sae(ours), 2.0)):
        twin = sae_lens_twin(sae)
        torch.manual_seed(4)
        scaler = sae_lens.training.activation_scaler.ActivationScaler(scale)  # type: ignore[union-attr]
        n, batch = 1500, 400  # batches of different sizes: the streaming sums are exercised
        expected = S.eval_sae_on_synthetic_data(
            twin, theirs.feature_dict, theirs.activation_generator, n, batch, scaler
        )
        got = evaluate_synthetic(sae, ours, n_samples=n, seed=4, batch_size=batch, scaling_factor=scale)
        want = expected.to_dict()
        assert got.keys() == want.keys()
        assert got["dead_latents"] == want["dead_latents"]
        for key in ("true_l0", "sae_l0", "shrinkage", "explained_variance", "mcc", "uniqueness"):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), key
        assert got["classification"] == pytest.approx(want["classification"], rel=1e-6, abs=1e-7)


# ----------------------------------------------------------------------------
# The samples' statistics (no sae-lens)
# ----------------------------------------------------------------------------
def test_firing_rates_and_magnitudes_are_as_configured() -> None:
    n, batch = 6, 40_000
    probs = torch.tensor([0.05, 0.1, 0.2, 0.4, 0.6, 0.9])
    mean, std = torch.linspace(2.0, 5.0, n), torch.linspace(0.1, 0.6, n)
    acts = ActivationGenerator(n, probs, std, mean).sample(batch, seed=0)
    rates = (acts > 0).float().mean(0)
    assert (rates - probs).abs().max() < 4 * (0.25 / batch) ** 0.5
    for i in range(n):
        vals = acts[:, i][acts[:, i] > 0]
        assert vals.mean() == pytest.approx(mean[i].item(), abs=0.02)
        assert vals.std() == pytest.approx(std[i].item(), rel=0.05)


def test_correlated_firing_keeps_rates_and_couples_features() -> None:
    n, batch = 4, 40_000
    corr = create_correlation_matrix_from_correlations(n, {(0, 1): 0.9, (2, 3): -0.9})
    acts = ActivationGenerator(n, 0.3, correlation_matrix=corr).sample(batch, seed=1)
    on = (acts > 0).float()
    assert (on.mean(0) - 0.3).abs().max() < 0.01  # rates kept
    assert (on[:, 0] * on[:, 1]).mean() > 0.2  # together far more often than 0.3 * 0.3
    assert (on[:, 2] * on[:, 3]).mean() < 0.01  # apart
    lowrank = generate_random_low_rank_correlation_matrix(n, 1, 0.0, seed=0)  # scale 0: independent
    on = (ActivationGenerator(n, 0.3, correlation_matrix=lowrank).sample(batch, seed=2) > 0).float()
    assert abs((on[:, 0] * on[:, 1]).mean() - 0.09) < 0.01


def test_hierarchy_gates_children_and_excludes_siblings() -> None:
    h = Hierarchy.from_children({0: [2, 3, 4], 2: [5, 6], 1: [7]}, mutually_exclusive=[0])
    gen = ActivationGenerator(8, 0.5, hierarchy=h)
    acts = gen.sample(5000, seed=0)
    on = acts > 0
    for child, parent in h.parent_of().items():
        assert not (on[:, child] & ~on[:, parent]).any()
        assert (on[:, child] & on[:, parent]).any()
    assert ((on[:, 2:5]).sum(1) <= 1).all() and ((on[:, 2:5]).sum(1) == 1).any()
    assert (on[:, 5] & on[:, 6]).any()  # not exclusive
    assert torch.equal(acts, gen.sample(5000, seed=0)) and not torch.equal(acts, gen.sample(5000, seed=1))
    assert h.children_of() == {0: [2, 3, 4], 1: [7], 2: [5, 6]}


def test_children_scale_with_their_parent() -> None:
    h = Hierarchy([HierarchyNode(0, [HierarchyNode(1)], scale_children_by_parent=True)])
    acts = h.apply(torch.tensor([[3.0, 2.0], [0.0, 2.0]]), mean_firing_magnitudes=torch.tensor([1.5, 1.0]))
    assert torch.equal(acts, torch.tensor([[3.0, 4.0], [0.0, 0.0]]))


def test_dictionary_rows_are_unit_and_orthogonalised() -> None:
    plain = FeatureDictionary(12, 16, orthogonalize=None, seed=0)
    ortho = FeatureDictionary(12, 16, seed=0)
    for fd in (plain, ortho):
        torch.testing.assert_close(fd.feature_vectors.norm(dim=1), torch.ones(12))

    def off_diagonal(fd: FeatureDictionary) -> float:
        gram = fd.feature_vectors @ fd.feature_vectors.T
        return float((gram - torch.eye(12)).abs().max().detach())

    assert off_diagonal(ortho) < 0.05 < off_diagonal(plain)
    biased = FeatureDictionary(3, 5, bias=2.0, orthogonalize=None, seed=0)
    assert biased.bias.norm().item() == pytest.approx(2.0)
    torch.testing.assert_close(biased(torch.eye(3)), biased.feature_vectors + biased.bias)


# ----------------------------------------------------------------------------
# Scores with known answers (no sae-lens)
# ----------------------------------------------------------------------------
def test_linear_sum_assignment_is_optimal() -> None:
    g = torch.Generator().manual_seed(0)
    for shape in ((5, 5), (4, 6), (6, 4), (1, 3)):
        cost = torch.rand(shape, generator=g).numpy()
        rows, cols = linear_sum_assignment(cost)
        k, (n, m) = min(shape), shape
        best = min(
            sum(cost[r, c] for r, c in zip(rs, cs, strict=True))
            for rs in itertools.combinations(range(n), k)
            for cs in itertools.permutations(range(m), k)
        )
        assert cost[rows, cols].sum() == pytest.approx(best) and list(rows) == sorted(rows)


def test_an_ideal_sae_scores_perfectly_and_a_random_one_does_not() -> None:
    model = planted_hierarchy_model(n_parents=2, n_children=3, n_free=4, seed=0)
    scores = evaluate_synthetic(ideal_sae(model), model, n_samples=2000, seed=0, batch_size=512)
    assert scores["mcc"] == pytest.approx(1.0) and scores["uniqueness"] == 1.0
    assert scores["classification"] == pytest.approx(
        {"precision": 1.0, "recall": 1.0, "f1_score": 1.0, "accuracy": 1.0}
    )
    assert scores["explained_variance"] == pytest.approx(1.0, abs=1e-5) and scores["shrinkage"] == pytest.approx(
        1.0, abs=1e-4
    )
    assert scores["sae_l0"] == scores["true_l0"] > 0 and scores["dead_latents"] == 0
    g = torch.Generator().manual_seed(1)
    w = torch.randn(model.hidden_dim, model.num_features, generator=g)
    rand = evaluate_synthetic(sae_with(w, w.T.clone()), model, n_samples=2000, seed=0)
    assert rand["mcc"] < 0.8 and rand["classification"]["precision"] < 0.8
    perm = torch.randperm(model.num_features, generator=g)  # the latents' order does not matter
    f = model.feature_vectors[perm]
    assert evaluate_synthetic(sae_with(f.T.clone(), -f), model, n_samples=500)["mcc"] == pytest.approx(1.0)


def test_absorption_is_zero_for_an_ideal_sae_and_one_for_an_absorbing_sae() -> None:
    model = planted_hierarchy_model(n_parents=2, n_children=3, n_free=2, seed=0)
    ideal = absorption_score(ideal_sae(model), model, n_samples=3000, seed=1)
    assert ideal["absorption"] == 0.0 and all(e > 100 for e in ideal["events"].values())
    assert ideal["parent_latents"] == {0: 0, 1: 1}
    f = model.feature_vectors
    w_enc, w_dec = f.T.clone(), f.clone()
    for p, kids in model.hierarchy.children_of().items():  # type: ignore[union-attr]
        w_enc[:, p] = f[p] - f[kids].sum(0)  # the parent's latent is silent when a child is there
        w_dec[kids] = f[kids] + 0.5 * f[p]  # the children's latents carry the parent
    absorbing = absorption_score(
        sae_with(w_enc, w_dec, torch.full((w_dec.shape[0],), -1e-5)), model, n_samples=3000, seed=1
    )
    assert absorbing["absorption"] == 1.0 and absorbing["parent_latents"] == ideal["parent_latents"]
    assert absorbing["child_latents"] == {c: c for c in range(2, 8)}
    with pytest.raises(ValueError, match=r"parents: \[9\] have no children"):
        absorption_score(ideal_sae(model), model, parents=[9])
    flat = SyntheticModel(SyntheticModelConfig(num_features=4, hidden_dim=4, seed=0))
    with pytest.raises(ValueError, match="model has no hierarchy"):
        absorption_score(ideal_sae(flat), flat)


# ----------------------------------------------------------------------------
# Files and bad input (no sae-lens)
# ----------------------------------------------------------------------------
def test_file_round_trip(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SyntheticModel(SyntheticModelConfig.from_dict(CONFIGS["everything"]))
    folder = save_synthetic_model(model, tmp_path / "m")
    back = load_synthetic_model(folder)
    assert back.cfg == model.cfg and back.hierarchy == model.hierarchy
    assert json.loads((folder / "synthetic_model_config.json").read_text()) == CONFIGS["everything"] | {
        "dtype": "float32", "hierarchy": model.cfg.hierarchy.to_dict(),  # type: ignore[union-attr]
        "firing_probability": model.cfg.firing_probability.to_dict(),
        "std_firing_magnitudes": model.cfg.std_firing_magnitudes.to_dict(),  # type: ignore[union-attr]
        "mean_firing_magnitudes": model.cfg.mean_firing_magnitudes.to_dict(),  # type: ignore[union-attr]
    }  # fmt: skip
    for a, b in zip(back.sample_with_features(300, seed=5), model.sample_with_features(300, seed=5), strict=True):
        assert torch.equal(a, b)
    planted = planted_hierarchy_model(seed=3)
    save_synthetic_model(planted, folder)  # over the old one: its hierarchy.json is the new one's
    again = load_synthetic_model(folder)
    assert again.hierarchy == planted.hierarchy and torch.equal(again.feature_vectors, planted.feature_vectors)
    flat = SyntheticModel(SyntheticModelConfig(num_features=5, hidden_dim=3, seed=0))
    save_synthetic_model(flat, folder)
    assert not (folder / "hierarchy.json").exists() and load_synthetic_model(folder).hierarchy is None


def test_bad_files_are_refused_by_name(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    model = planted_hierarchy_model(seed=0)
    folder = save_synthetic_model(model, tmp_path / "m")
    w_path = folder / "synthetic_model.safetensors"
    original = load_file(w_path)
    with pytest.raises(FileNotFoundError, match="missing synthetic_model_config.json, synthetic_model.safetensors"):
        load_synthetic_model(tmp_path / "nothing")
    save_file({k: v for k, v in original.items() if k != "bias"}, w_path)
    with pytest.raises(CheckpointError, match=r"missing \['bias'\]"):
        load_synthetic_model(folder)
    save_file(original | {"firing_probabilities": original["firing_probabilities"] + 1}, w_path)
    with pytest.raises(CheckpointError, match=r"firing_probabilities\[0\]=1.25 is out of range"):
        load_synthetic_model(folder)
    save_file(original | {"feature_vectors": original["feature_vectors"][:, :3].contiguous()}, w_path)
    with pytest.raises(CheckpointError, match="mis-shaped feature_vectors"):
        load_synthetic_model(folder)
    save_synthetic_model(model, folder)
    (folder / "hierarchy.json").write_text(json.dumps({"roots": [{"feature_index": 99}]}))
    with pytest.raises(CheckpointError, match="other JSON files"):  # another hierarchy than the weights were saved with
        load_synthetic_model(folder)
    save_file(original, w_path)  # without our digest (as sae-lens writes it): the hierarchy itself is checked
    with pytest.raises(CheckpointError, match="feature_index=99 is out of range: features are 0..7"):
        load_synthetic_model(folder)


def test_bad_input_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"a cycle: 0 -> 1 -> 2 -> 0"):
        Hierarchy.from_children({0: [1], 1: [2], 2: [0]})
    a = HierarchyNode(0)
    b = HierarchyNode(1, [a])
    a.children = [b]
    with pytest.raises(ValueError, match="a cycle: feature_index=1 -> feature_index=0 -> feature_index=1"):
        Hierarchy([b])
    with pytest.raises(ValueError, match="feature_index=3 appears twice"):
        Hierarchy([HierarchyNode(0, [HierarchyNode(3)]), HierarchyNode(3)])
    with pytest.raises(ValueError, match="feature 2 has two parents"):
        Hierarchy.from_children({0: [2], 1: [2]})
    with pytest.raises(ValueError, match="mutually_exclusive_children needs at least 2 children"):
        HierarchyNode(0, [HierarchyNode(1)], mutually_exclusive_children=True)
    with pytest.raises(ValueError, match=r"hierarchy: feature_index=6 is out of range: features are 0..4"):
        ActivationGenerator(5, 0.1, hierarchy=Hierarchy.from_children({0: [6]}))
    with pytest.raises(
        ValueError, match=r"firing_probabilities\[2\]=1.5 is out of range: expected probabilities in \[0, 1\]"
    ):
        ActivationGenerator(3, torch.tensor([0.1, 0.2, 1.5]))
    with pytest.raises(ValueError, match=r"firing_probabilities\[0\]=-0.1 is out of range"):
        ActivationGenerator(3, -0.1)
    with pytest.raises(ValueError, match=r"std_firing_magnitudes\[0\]=-1 is out of range: expected finite values >= 0"):
        ActivationGenerator(3, 0.1, std_firing_magnitudes=-1.0)
    with pytest.raises(ValueError, match=r"firing_probabilities has shape \(2,\), expected \[3\]"):
        ActivationGenerator(3, torch.tensor([0.1, 0.2]))
    with pytest.raises(ValueError, match="not positive definite"):
        ActivationGenerator(
            3, 0.1, correlation_matrix=torch.tensor([[1.0, 0.9, 0.9], [0.9, 1.0, -0.9], [0.9, -0.9, 1.0]])
        )
    with pytest.raises(ValueError, match="diagonal must be all 1s"):
        ActivationGenerator(2, 0.1, correlation_matrix=2 * torch.eye(2))
    with pytest.raises(ValueError, match=r"ConstantFiringProbabilityConfig: probability=1.2 is out of range"):
        ConstantFiringProbabilityConfig(1.2)
    with pytest.raises(
        ValueError, match=r"mean_firing_magnitudes must be > 0 for the parents whose children scale with them \(\[0\]\)"
    ):
        ActivationGenerator(
            2,
            0.5,
            mean_firing_magnitudes=0.0,
            hierarchy=HierarchyNode(0, [HierarchyNode(1)], scale_children_by_parent=True),
        )
    with pytest.raises(ValueError, match=r"synthetic model config: unknown keys \['hiden_dim'\]"):
        SyntheticModelConfig.from_dict({"num_features": 3, "hiden_dim": 2})
    with pytest.raises(ValueError, match="generator_name='zipf' is unknown"):
        SyntheticModelConfig.from_dict(
            {"num_features": 3, "hidden_dim": 2, "firing_probability": {"generator_name": "zipf"}}
        )
    with pytest.raises(ValueError, match="HierarchyConfig: branching_factor=1 is out of range"):
        HierarchyConfig(branching_factor=1)
    model = planted_hierarchy_model()
    with pytest.raises(ValueError, match="sae reads d_in=3, but the model's hidden_dim is 8"):
        evaluate_synthetic(sae_with(torch.zeros(3, 4), torch.zeros(4, 3)), model)
    with pytest.raises(TypeError, match="Linear has no encode"):
        evaluate_synthetic(torch.nn.Linear(8, 8), model)
    with pytest.raises(ValueError, match="seed and generator: give one of them"):
        model.sample(3, seed=0, generator=torch.Generator())
    assert np.isfinite(mean_correlation_coefficient(torch.zeros(2, 3), torch.eye(3)))  # zero rows: cosine 0
