"""`SyntheticModel`: a `FeatureDictionary` and an `ActivationGenerator` made from one
`SyntheticModelConfig`, as sae-lens' `SyntheticModel` makes them (same fields, same seeds: the
firing probabilities draw with `seed`, the std and mean magnitudes with `seed + 1` and `seed + 2`,
the hierarchy with `seed + 3`, the correlation with `seed + 4`, the dictionary with `seed`).

Example:
    >>> cfg = SyntheticModelConfig(num_features=32, hidden_dim=16, seed=0,
    ...                            hierarchy=HierarchyConfig(total_root_nodes=4, branching_factor=2, max_depth=1))
    >>> model = SyntheticModel(cfg)
    >>> hidden, features = model.sample_with_features(1000, seed=1)   # [1000, 16], [1000, 32]
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from .dictionary import FeatureDictionary, OrthogonalizationConfig
from .distributions import (
    FiringProbabilityConfig,
    LowRankCorrelationMatrix,
    MagnitudeConfig,
    ZipfianFiringProbabilityConfig,
    firing_probability_from_dict,
    generate_magnitudes,
    generate_random_low_rank_correlation_matrix,
    magnitude_from_dict,
)
from .generator import ActivationGenerator, torch_generator
from .hierarchy import Hierarchy, HierarchyConfig, generate_hierarchy

__all__ = ["LowRankCorrelationConfig", "SyntheticModelConfig", "SyntheticModel"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class LowRankCorrelationConfig:
    """A random low-rank correlation of firing (see `generate_random_low_rank_correlation_matrix`)."""

    rank: int = 32
    correlation_scale: float = 0.1
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """sae-lens' JSON for these settings (the `correlation` entry of a synthetic model's config)."""
        return {"rank": self.rank, "correlation_scale": self.correlation_scale, "seed": self.seed}


def _sub(cls: type, d: Any, key: str) -> Any:
    """A nested config dict as `cls`, its unknown keys refused by name."""
    if d is None or isinstance(d, cls):
        return d
    if not isinstance(d, dict):
        raise TypeError(f"{key} must be a dict (or null), got {type(d).__name__} ({d!r})")
    known = {f.name for f in dataclasses.fields(cls)}
    if unknown := sorted(set(d) - known):
        raise ValueError(f"{key}: unknown fields {unknown}; expected some of {sorted(known)}")
    return cls(**d)


@dataclass
class SyntheticModelConfig:
    """sae-lens' `SyntheticModelConfig`, field for field (these are the keys of synthetic_model_config.json).

    Attributes:
        num_features, hidden_dim: the dictionary's shape `[num_features, hidden_dim]` (hidden_dim is an SAE's d_in).
        firing_probability: how often each feature fires (zipfian by default).
        hierarchy: a generated forest, or None.
        orthogonalization: push the dictionary's rows apart, or None (random unit rows).
        correlation: a random low-rank correlation of firing, or None (independent).
        std_firing_magnitudes, mean_firing_magnitudes: a number for all features or a magnitude config.
        bias: the dictionary's bias: False, True (norm 1) or its norm. sae-lens' default is 1.0.
        dtype: of the feature activations. seed: of everything above (None: random).
    """

    num_features: int
    hidden_dim: int
    firing_probability: FiringProbabilityConfig = field(default_factory=ZipfianFiringProbabilityConfig)
    hierarchy: HierarchyConfig | None = None
    orthogonalization: OrthogonalizationConfig | None = None
    correlation: LowRankCorrelationConfig | None = None
    std_firing_magnitudes: float | MagnitudeConfig = 0.0
    mean_firing_magnitudes: float | MagnitudeConfig = 1.0
    bias: bool | float = 1.0
    dtype: str = "float32"
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_features", "hidden_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SyntheticModelConfig: {name}={v!r} is out of range: expected an int >= 1")
        if self.dtype not in _DTYPES:
            raise ValueError(
                f"SyntheticModelConfig: dtype={self.dtype!r} is unknown; expected one of {sorted(_DTYPES)}"
            )
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"SyntheticModelConfig: seed={self.seed!r} is out of range: expected an int >= 0 or None")
        if not isinstance(self.bias, bool) and (not isinstance(self.bias, (int, float)) or not self.bias >= 0):
            raise ValueError(f"SyntheticModelConfig: bias={self.bias!r}: expected True, False or a norm >= 0")
        if not hasattr(self.firing_probability, "generate"):
            raise TypeError(
                f"SyntheticModelConfig: firing_probability must be a firing-probability config, got {self.firing_probability!r}"
            )
        for name, cls in (
            ("hierarchy", HierarchyConfig),
            ("orthogonalization", OrthogonalizationConfig),
            ("correlation", LowRankCorrelationConfig),
        ):
            if (v := getattr(self, name)) is not None and not isinstance(v, cls):
                raise TypeError(f"SyntheticModelConfig: {name} must be a {cls.__name__} or None, got {v!r}")
        for name in ("std_firing_magnitudes", "mean_firing_magnitudes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) or hasattr(v, "generate")):
                raise TypeError(f"SyntheticModelConfig: {name} must be a number or a magnitude config, got {v!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        """`dtype` as a torch dtype (`"float32"` -> `torch.float32`)."""
        return _DTYPES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        """The JSON sae-lens writes (and reads back with `SyntheticModelConfig.from_dict`)."""

        def mag(m: float | MagnitudeConfig) -> Any:
            return m if isinstance(m, (int, float)) else m.to_dict()

        return {
            "num_features": self.num_features,
            "hidden_dim": self.hidden_dim,
            "firing_probability": self.firing_probability.to_dict(),
            "hierarchy": None if self.hierarchy is None else self.hierarchy.to_dict(),
            "orthogonalization": None if self.orthogonalization is None else self.orthogonalization.to_dict(),
            "correlation": None if self.correlation is None else self.correlation.to_dict(),
            "std_firing_magnitudes": mag(self.std_firing_magnitudes),
            "mean_firing_magnitudes": mag(self.mean_firing_magnitudes),
            "bias": self.bias,
            "dtype": self.dtype,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SyntheticModelConfig:
        """The config a sae-lens dict describes; unknown keys are refused by name."""
        if not isinstance(d, dict):
            raise TypeError(f"synthetic model config must be a dict, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(d) - known):
            raise ValueError(f"synthetic model config: unknown keys {unknown}; expected some of {sorted(known)}")
        if missing := [k for k in ("num_features", "hidden_dim") if k not in d]:
            raise ValueError(f"synthetic model config: missing {missing}")
        d = dict(d)
        if "firing_probability" in d:
            d["firing_probability"] = firing_probability_from_dict(d["firing_probability"])
        for key in ("std_firing_magnitudes", "mean_firing_magnitudes"):
            if key in d:
                d[key] = magnitude_from_dict(d[key])
        d["hierarchy"] = _sub(HierarchyConfig, d.get("hierarchy"), "hierarchy")
        d["orthogonalization"] = _sub(OrthogonalizationConfig, d.get("orthogonalization"), "orthogonalization")
        d["correlation"] = _sub(LowRankCorrelationConfig, d.get("correlation"), "correlation")
        return cls(**d)


def _offset(seed: int | None, k: int) -> int | None:
    return None if seed is None else seed + k


class SyntheticModel:
    """Synthetic hidden activations with known features: `sample(n)` `[n, hidden_dim]`, and
    `sample_with_features(n)` for them together with the true feature activations `[n, num_features]`.

    Every part is made from `cfg` unless given: `feature_dict`, `hierarchy`, `correlation_matrix` (low-rank),
    `firing_probabilities` (`[num_features]`, used as they are: no hierarchy compensation). The magnitudes always
    come from `cfg` (so that a saved model says them).
    """

    def __init__(
        self,
        cfg: SyntheticModelConfig,
        feature_dict: FeatureDictionary | None = None,
        hierarchy: Hierarchy | None = None,
        correlation_matrix: LowRankCorrelationMatrix | None = None,
        firing_probabilities: Tensor | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        if not isinstance(cfg, SyntheticModelConfig):
            raise TypeError(f"cfg must be a SyntheticModelConfig, got {type(cfg).__name__}")
        self.cfg, self.device, n, seed = cfg, torch.device(device), cfg.num_features, cfg.seed
        if hierarchy is None and cfg.hierarchy is not None:
            hierarchy = generate_hierarchy(n, cfg.hierarchy, seed=_offset(seed, 3))
        self.hierarchy = hierarchy
        if correlation_matrix is None and cfg.correlation is not None:
            c = cfg.correlation
            correlation_matrix = generate_random_low_rank_correlation_matrix(
                n, c.rank, c.correlation_scale, seed=_offset(seed, 4), device=self.device, dtype=cfg.torch_dtype
            )
        self.correlation_matrix = correlation_matrix
        if feature_dict is None:
            feature_dict = FeatureDictionary(n, cfg.hidden_dim, cfg.bias, cfg.orthogonalization, self.device, seed)
        if (feature_dict.num_features, feature_dict.hidden_dim) != (n, cfg.hidden_dim):
            raise ValueError(
                f"feature_dict is [{feature_dict.num_features}, {feature_dict.hidden_dim}], expected "
                f"[{n}, {cfg.hidden_dim}] (cfg.num_features, cfg.hidden_dim)"
            )
        self.feature_dict = feature_dict.to(self.device)
        if firing_probabilities is None:
            firing_probabilities = cfg.firing_probability.generate(n, seed=seed)
            if hierarchy is not None and cfg.hierarchy is not None and cfg.hierarchy.compensate_probabilities:
                factors = hierarchy.compute_probability_correction_factors(firing_probabilities)
                corrected = firing_probabilities * factors
                if n_clamped := int(((corrected >= 1) & (firing_probabilities < 1)).sum()):
                    warnings.warn(
                        f"SyntheticModel: the hierarchy's compensation took {n_clamped} firing probabilities to 1 "
                        f"(largest {corrected.max().item():.3f} before clamping); lower the base probabilities",
                        stacklevel=2,
                    )
                firing_probabilities = corrected.clamp(max=1.0)
        self.activation_generator = ActivationGenerator(
            n,
            firing_probabilities,
            generate_magnitudes(n, cfg.std_firing_magnitudes, seed=_offset(seed, 1)),
            generate_magnitudes(n, cfg.mean_firing_magnitudes, seed=_offset(seed, 2)),
            hierarchy=hierarchy,
            correlation_matrix=correlation_matrix,
            device=self.device,
            dtype=cfg.torch_dtype,
        )

    @property
    def num_features(self) -> int:
        """The number of true features (`cfg.num_features`)."""
        return self.cfg.num_features

    @property
    def hidden_dim(self) -> int:
        """The width of the hidden activations (`cfg.hidden_dim`)."""
        return self.cfg.hidden_dim

    @property
    def feature_vectors(self) -> Float[Tensor, "num_features hidden_dim"]:
        """The true feature directions `[num_features, hidden_dim]` (detached; unit rows when the model made them)."""
        return self.feature_dict.feature_vectors.detach()

    @torch.no_grad()
    def sample_with_features(
        self, batch_size: int, seed: int | None = None, generator: torch.Generator | None = None
    ) -> tuple[Float[Tensor, "batch_size hidden_dim"], Float[Tensor, "batch_size num_features"]]:
        """(hidden activations, true feature activations). `seed` / `generator` as in `ActivationGenerator.sample`."""
        feature_acts = self.activation_generator.sample(
            batch_size, generator=torch_generator(self.device, seed, generator)
        )
        return self.feature_dict(feature_acts).detach(), feature_acts

    def sample(
        self, batch_size: int, seed: int | None = None, generator: torch.Generator | None = None
    ) -> Float[Tensor, "batch_size hidden_dim"]:
        """Hidden activations `[batch_size, hidden_dim]`, ready to train an SAE on."""
        return self.sample_with_features(batch_size, seed, generator)[0]

    def __repr__(self) -> str:
        return (
            f"SyntheticModel(num_features={self.num_features}, hidden_dim={self.hidden_dim}, "
            f"hierarchy={self.hierarchy is not None}, correlation={self.correlation_matrix is not None})"
        )
