"""The benchmark on synthetic ground truth: every architecture trained on the same samples of one
`SyntheticModel` (superposition, a hierarchy, correlated firing), scored against its true features; and
on the same samples of a planted hierarchy, scored for absorption.

Why two models. `absorption_score` names a parent's latent by the largest cosine with the parent's true
vector. On the main model (256 features in 64 dimensions) the true vectors are not orthogonal, so a latent
that learned a mix of directions can be taken for the parent's, and the score mixes absorption with plain
misses. The planted model (`planted_hierarchy_model`) has orthonormal features, d_sae = its feature count,
and parents that nearly always fire with one of their (mutually exclusive) children: the parent's latent is
unambiguous, and the one way to fall silent there is to be absorbed. That is the number reported as
"absorption"; the main model's own hierarchy gives `absorption_main_model` beside it (JSON only).

Each seed trains every SAE from its own initialisation (`init_seed(seed)`: never the dictionary's seed) on its
own stream of samples; the models and the evaluation samples are the same for every seed and architecture.

Example:
    >>> results = synthetic_benchmark(SyntheticBench(steps=200), ["topk", "standard"], {}, seeds=[0, 1])
    >>> results["topk"][0]["mcc"]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from ...checks import check_float, check_int_in_range
from ..synthetic import (
    HierarchyConfig,
    LowRankCorrelationConfig,
    SyntheticModel,
    SyntheticModelConfig,
    absorption_score,
    evaluate_synthetic,
    planted_hierarchy_model,
)
from .recipes import activation_scale, build, deployed, init_seed, train_together

__all__ = ["SyntheticBench", "synthetic_benchmark", "synthetic_batches", "ground_truth", "EVAL_SEED"]

EVAL_SEED = 1_000_003  # the evaluation samples' seed (the training streams are seeded 1000 + seed, 2000 + seed)
HOOK = "synthetic"  # the hook name the SAEs carry (nothing is spliced)


@dataclass
class SyntheticBench:
    """The synthetic part of the benchmark: the models, the training budget, the evaluation.

    Example:
        >>> SyntheticBench(num_features=512, hidden_dim=128, steps=2000)
    """

    num_features: int = 256  # true features of the main model
    hidden_dim: int = 64  # its activations' width (an SAE's d_in): 4x superposition by default
    d_sae: int | None = None  # None: num_features
    hierarchy_roots: int | None = None  # trees of the main model's hierarchy (None: num_features // 8)
    branching_factor: int = 3
    correlation_rank: int = 16  # low-rank correlated firing (0: independent)
    correlation_scale: float = 0.1
    model_seed: int = 0  # of the main and the planted model
    steps: int = 500  # training steps per SAE, on each model
    batch_size: int = 1024
    lr: float = 3e-3
    target_l0: int | None = None  # on the main model (None: its true L0, rounded); the planted one: its true L0
    eval_samples: int = 20_000
    planted_parents: int = 4  # the planted hierarchy: parents, children per parent, free features
    planted_children: int = 4
    planted_free: int = 16
    planted_parent_probability: float = 0.1  # parents and free features fire this often
    planted_child_probability: float = 0.5  # a child, given its parent (children exclude each other)

    def __post_init__(self) -> None:
        where = "SyntheticBench"
        for name, low in (("num_features", 1), ("hidden_dim", 1), ("branching_factor", 2),
                          ("correlation_rank", 0), ("model_seed", 0), ("steps", 1), ("batch_size", 1),
                          ("eval_samples", 1), ("planted_parents", 1), ("planted_children", 2),
                          ("planted_free", 0)):  # fmt: skip
            setattr(self, name, check_int_in_range(getattr(self, name), name, low, None, caller=where))
        for name in ("d_sae", "target_l0", "hierarchy_roots"):
            if getattr(self, name) is not None:
                setattr(self, name, check_int_in_range(getattr(self, name), name, 1, None, caller=where))
        d_sae = self.d_sae or self.num_features
        if self.target_l0 is not None and self.target_l0 > d_sae:
            raise ValueError(f"{where}: target_l0={self.target_l0} is out of range: expected 1..d_sae={d_sae}")
        if self.roots * (1 + self.branching_factor) > self.num_features:
            raise ValueError(
                f"{where}: hierarchy_roots={self.roots} x (1 + branching_factor={self.branching_factor}) "
                f"features exceed num_features={self.num_features}"
            )
        if self.correlation_rank > self.num_features:
            raise ValueError(
                f"{where}: correlation_rank={self.correlation_rank} is out of range: expected 0..num_features="
                f"{self.num_features}"
            )
        self.lr = check_float(self.lr, "lr", 0.0, caller=where)
        self.correlation_scale = check_float(self.correlation_scale, "correlation_scale", 0.0, 1.0, caller=where)
        for name in ("planted_parent_probability", "planted_child_probability"):
            setattr(self, name, check_float(getattr(self, name), name, 0.0, 1.0, caller=where))

    @property
    def planted_features(self) -> int:
        """The planted hierarchy's features (and its SAEs' d_in and d_sae): parents, their children, free ones."""
        return self.planted_parents * (1 + self.planted_children) + self.planted_free

    @property
    def roots(self) -> int:
        """The hierarchy's trees (hierarchy_roots, or num_features // 8, at least 1)."""
        return self.hierarchy_roots or max(1, self.num_features // 8)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON."""
        return asdict(self)

    def main_model(self) -> SyntheticModel:
        """The main model: `num_features` random unit vectors in `hidden_dim` dimensions, Zipfian firing, a
        hierarchy of `roots` trees one level deep (exclusive children), low-rank correlations."""
        hierarchy = HierarchyConfig(self.roots, self.branching_factor, max_depth=1, mutually_exclusive_portion=1.0)
        correlation = (
            LowRankCorrelationConfig(self.correlation_rank, self.correlation_scale) if self.correlation_rank else None
        )
        cfg = SyntheticModelConfig(self.num_features, self.hidden_dim, hierarchy=hierarchy, correlation=correlation,
                                   seed=self.model_seed)  # fmt: skip
        return SyntheticModel(cfg)

    def planted_model(self) -> SyntheticModel:
        """The planted hierarchy the absorption is measured on (see the module's docstring)."""
        p_parent, p_child = self.planted_parent_probability, self.planted_child_probability
        shape = (self.planted_parents, self.planted_children, self.planted_free)
        return planted_hierarchy_model(
            *shape, parent_probability=p_parent, child_probability=p_child, seed=self.model_seed
        )


def synthetic_batches(model: SyntheticModel, batch_size: int, seed: int) -> Iterator[Tensor]:
    """Endless batches `[batch_size, hidden_dim]` of `model`'s activations from one seeded stream."""
    g = torch.Generator(device=model.device).manual_seed(seed)
    while True:
        yield model.sample(batch_size, generator=g)


def ground_truth(model: SyntheticModel, target_l0: int | None = None) -> tuple[float, int, float]:
    """(true L0, the target L0 (`target_l0`, or the true L0 rounded), the activation scale) of `model`, on the
    evaluation samples' first 8192."""
    x, feats = model.sample_with_features(8192, seed=EVAL_SEED)
    true_l0 = float((feats != 0).float().sum(-1).mean())
    return true_l0, target_l0 or max(1, round(true_l0)), activation_scale(x)


def _train(
    model: SyntheticModel,
    d_sae: int,
    target_l0: int,
    scale: float,
    recipes: Mapping[str, Mapping[str, Any]],
    cfg: SyntheticBench,
    seed: int,
    data_seed: int,
    bar: Any,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Every architecture trained on one stream of `model`'s samples: (deployed SAEs, errors)."""
    run = {"lr": cfg.lr, "seed": init_seed(seed), "log_every": cfg.steps}
    built = {a: build(a, r, model.hidden_dim, d_sae, target_l0, scale, HOOK, run) for a, r in recipes.items()}
    errors = train_together(built, synthetic_batches(model, cfg.batch_size, data_seed), cfg.steps, bar)
    return {a: deployed(sae) for a, (sae, _) in built.items() if a not in errors}, errors


def _flat(scores: dict[str, Any]) -> dict[str, Any]:
    """`evaluate_synthetic`'s result with its classification metrics at the top level."""
    out = {k: v for k, v in scores.items() if k != "classification"}
    return {**out, **scores.get("classification", {})}


def synthetic_benchmark(
    cfg: SyntheticBench,
    recipes: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
    bar: Any = None,
) -> dict[str, Any]:
    """Train every architecture of `recipes` (architecture -> its `recipe`) on the main model and on the
    planted hierarchy, once per seed, and score them. Returns {"main": {true_l0, target_l0, scale},
    "planted": {...}, "runs": {architecture: [per seed: {seed, mcc, uniqueness, precision, recall, f1_score,
    accuracy, shrinkage, sae_l0, true_l0, dead_latents, explained_variance, absorption, absorption_main_model,
    planted_sae_l0} or {seed, error}]}, "saes": {architecture: the last seed's SAE on the main model, as
    deployed}}. `bar`: a tqdm counting training steps (None: none)."""
    if bar is None:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        bar = tqdm(disable=True)
    main, planted = cfg.main_model(), cfg.planted_model()
    main_l0, main_target, main_scale = ground_truth(main, cfg.target_l0)
    planted_l0, planted_target, planted_scale = ground_truth(planted, None)  # its own true L0 always
    d_sae = cfg.d_sae or cfg.num_features
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in recipes}
    last: dict[str, Any] = {}
    n = cfg.eval_samples
    for seed in seeds:
        bar.set_description(f"synthetic, seed {seed}")
        saes, errors = _train(main, d_sae, main_target, main_scale, recipes, cfg, seed, 1000 + seed, bar)
        bar.set_description(f"planted hierarchy, seed {seed}")
        planted_saes, planted_errors = _train(planted, planted.num_features, planted_target, planted_scale, recipes,
                                              cfg, seed, 2000 + seed, bar)  # fmt: skip
        bar.set_description(f"scoring, seed {seed}")
        last = saes
        for arch in recipes:
            if arch in errors or arch in planted_errors:
                runs[arch].append({"seed": seed, "error": errors.get(arch) or planted_errors[arch]})
                continue
            sae, planted_sae = saes[arch], planted_saes[arch]
            scores = _flat(evaluate_synthetic(sae, main, n_samples=n, seed=EVAL_SEED, batch_size=min(n, 8192)))
            absorbed = absorption_score(planted_sae, planted, n_samples=n, seed=EVAL_SEED, batch_size=min(n, 8192))
            absorbed_main = absorption_score(sae, main, n_samples=n, seed=EVAL_SEED, batch_size=min(n, 8192))
            with torch.no_grad():
                x = planted.sample(min(n, 8192), seed=EVAL_SEED)
                planted_l0_sae = float((planted_sae.encode(x) != 0).float().sum(-1).mean())
            runs[arch].append({"seed": seed, **scores, "absorption": absorbed["absorption"],
                               "absorption_main_model": absorbed_main["absorption"],
                               "planted_sae_l0": planted_l0_sae})  # fmt: skip
    return {
        "main": {"true_l0": main_l0, "target_l0": main_target, "scale": main_scale, "d_sae": d_sae},
        "planted": {
            "true_l0": planted_l0,
            "target_l0": planted_target,
            "scale": planted_scale,
            "d_sae": planted.num_features,
            "num_features": planted.num_features,
        },  # fmt: skip
        "runs": runs,
        "saes": last,
    }
