"""Synthetic ground truth for SAEs, offline, with sae-lens' definitions (`sae_lens.synthetic`, 6.54):
activations built from known features, and scores of an SAE against them.

* `FeatureDictionary`: the true feature vectors `[num_features, hidden_dim]` (unit rows, optionally
  orthogonalised) and a bias; `ActivationGenerator`: true feature activations (firing probabilities,
  magnitudes, correlated firing, a `Hierarchy`); `SyntheticModel`: both, made from one
  `SyntheticModelConfig`. A seeded sample equals sae-lens' after `torch.manual_seed` with that seed.
* `save_synthetic_model` / `load_synthetic_model`: sae-lens' folder format, both ways.
* `evaluate_synthetic`: sae-lens' `eval_sae_on_synthetic_data` (MCC, uniqueness, classification,
  L0, dead latents, shrinkage, explained variance); `absorption_score` on a planted hierarchy.

Example:
    >>> from interp_gpt.sae import SAE, SAEConfig
    >>> from interp_gpt.sae.synthetic import SyntheticModel, SyntheticModelConfig, HierarchyConfig, evaluate_synthetic
    >>> model = SyntheticModel(SyntheticModelConfig(num_features=64, hidden_dim=32, bias=False, seed=0,
    ...     hierarchy=HierarchyConfig(total_root_nodes=8, branching_factor=2, max_depth=1)))
    >>> hidden, features = model.sample_with_features(4096, seed=1)      # [4096, 32], [4096, 64]
    >>> sae = SAE(SAEConfig(d_in=32, d_sae=64))                          # ... trained on model.sample(...)
    >>> evaluate_synthetic(sae, model, n_samples=10_000, seed=2)["mcc"]
    >>> from interp_gpt.sae.synthetic import planted_hierarchy_model, absorption_score
    >>> absorption_score(sae, planted_hierarchy_model(n_parents=2, n_children=3, hidden_dim=32))["absorption"]
"""

from .absorption import absorption_score, planted_hierarchy_model
from .dictionary import FeatureDictionary, OrthogonalizationConfig, orthogonalize_embeddings
from .distributions import (
    ConstantFiringProbabilityConfig,
    ConstantMagnitudeConfig,
    ExponentialMagnitudeConfig,
    FiringProbabilityConfig,
    FoldedNormalMagnitudeConfig,
    LinearFiringProbabilityConfig,
    LinearMagnitudeConfig,
    LowRankCorrelationMatrix,
    MagnitudeConfig,
    RandomFiringProbabilityConfig,
    ZipfianFiringProbabilityConfig,
    create_correlation_matrix_from_correlations,
    firing_probability_from_dict,
    generate_magnitudes,
    generate_random_low_rank_correlation_matrix,
    magnitude_from_dict,
)
from .evaluate import (
    classification_metrics,
    cosine_similarities,
    evaluate_synthetic,
    feature_uniqueness,
    linear_sum_assignment,
    mean_correlation_coefficient,
)
from .generator import ActivationGenerator
from .hierarchy import Hierarchy, HierarchyConfig, HierarchyNode, generate_hierarchy
from .io import (
    SYNTHETIC_MODEL_CONFIG_FILENAME,
    SYNTHETIC_MODEL_HIERARCHY_FILENAME,
    SYNTHETIC_MODEL_WEIGHTS_FILENAME,
    load_synthetic_model,
    save_synthetic_model,
)
from .synthetic_model import LowRankCorrelationConfig, SyntheticModel, SyntheticModelConfig

__all__ = [
    "FeatureDictionary",
    "OrthogonalizationConfig",
    "orthogonalize_embeddings",
    "ActivationGenerator",
    "Hierarchy",
    "HierarchyNode",
    "HierarchyConfig",
    "generate_hierarchy",
    "SyntheticModel",
    "SyntheticModelConfig",
    "LowRankCorrelationConfig",
    "LowRankCorrelationMatrix",
    "generate_random_low_rank_correlation_matrix",
    "create_correlation_matrix_from_correlations",
    "FiringProbabilityConfig",
    "ZipfianFiringProbabilityConfig",
    "LinearFiringProbabilityConfig",
    "RandomFiringProbabilityConfig",
    "ConstantFiringProbabilityConfig",
    "firing_probability_from_dict",
    "MagnitudeConfig",
    "ConstantMagnitudeConfig",
    "LinearMagnitudeConfig",
    "ExponentialMagnitudeConfig",
    "FoldedNormalMagnitudeConfig",
    "magnitude_from_dict",
    "generate_magnitudes",
    "save_synthetic_model",
    "load_synthetic_model",
    "SYNTHETIC_MODEL_CONFIG_FILENAME",
    "SYNTHETIC_MODEL_WEIGHTS_FILENAME",
    "SYNTHETIC_MODEL_HIERARCHY_FILENAME",
    "evaluate_synthetic",
    "mean_correlation_coefficient",
    "feature_uniqueness",
    "classification_metrics",
    "cosine_similarities",
    "linear_sum_assignment",
    "absorption_score",
    "planted_hierarchy_model",
]
