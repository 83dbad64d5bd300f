"""The per-feature numbers a synthetic model is made of, with sae-lens' definitions and JSON names:
firing probabilities (zipfian, linear, random, constant), firing magnitudes (constant, linear,
exponential, folded_normal) and the correlation of firing (a low-rank factor, or a full matrix).

Each config is a small dataclass with `generate(num_features, seed)` and `to_dict()`; its dict holds
sae-lens' `generator_name`, so `synthetic_model_config.json` reads the same in both libraries.

Example:
    >>> ZipfianFiringProbabilityConfig(exponent=1.0, max_prob=0.3, min_prob=0.01).generate(4)
    tensor([0.3000, 0.1067, 0.0422, 0.0100])
    >>> generate_magnitudes(3, LinearMagnitudeConfig(start=1.0, end=2.0))
    tensor([1.0000, 1.5000, 2.0000])
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Union

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = [
    "ZipfianFiringProbabilityConfig",
    "LinearFiringProbabilityConfig",
    "RandomFiringProbabilityConfig",
    "ConstantFiringProbabilityConfig",
    "FiringProbabilityConfig",
    "ConstantMagnitudeConfig",
    "LinearMagnitudeConfig",
    "ExponentialMagnitudeConfig",
    "FoldedNormalMagnitudeConfig",
    "MagnitudeConfig",
    "firing_probability_from_dict",
    "magnitude_from_dict",
    "generate_magnitudes",
    "LowRankCorrelationMatrix",
    "generate_random_low_rank_correlation_matrix",
    "create_correlation_matrix_from_correlations",
]


def _fail(where: str, field: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"{where}: {field}={value!r} is out of range: expected {expected}")


def _check_num_features(num_features: Any, where: str) -> int:
    if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
        raise ValueError(f"{where}: num_features={num_features!r} is out of range: expected an int >= 1")
    return num_features


def _cpu_generator(seed: int | None) -> torch.Generator:
    """sae-lens' habit for its seeded generators: a fresh CPU generator, seeded only when a seed is given
    (so `seed=None` draws the same numbers every time: torch's default seed)."""
    g = torch.Generator()
    return g.manual_seed(seed) if seed is not None else g


class _Named:
    """`to_dict` with sae-lens' `generator_name` key; `from_dict` through the family's registry."""

    generator_name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """The config as sae-lens writes it in JSON: its fields plus `generator_name` (read back by
        `firing_probability_from_dict` / `magnitude_from_dict`)."""
        return {**dataclasses.asdict(self), "generator_name": self.generator_name}  # type: ignore[call-overload]


def _from_dict(d: Any, registry: dict[str, type], what: str) -> Any:
    if not isinstance(d, dict):
        raise TypeError(f"{what} must be a dict with a generator_name, got {type(d).__name__} ({d!r})")
    d = dict(d)
    name = d.pop("generator_name", None)
    if name not in registry:
        raise ValueError(f"{what}: generator_name={name!r} is unknown; expected one of {sorted(registry)}")
    cls = registry[name]
    known = {f.name for f in dataclasses.fields(cls)}
    if unknown := sorted(set(d) - known):
        raise ValueError(f"{what} ({name}): unknown fields {unknown}; expected some of {sorted(known)}")
    return cls(**d)


# ----------------------------------------------------------------------------
# firing probabilities: P(feature i fires) per sample, before hierarchy and correlation
# ----------------------------------------------------------------------------
def _check_prob_range(where: str, min_prob: float, max_prob: float, strict: bool) -> None:
    ok = 0 < min_prob < max_prob <= 1 if strict else 0 < min_prob <= max_prob <= 1
    if not ok:
        rel = "<" if strict else "<="
        raise _fail(where, "(min_prob, max_prob)", (min_prob, max_prob), f"0 < min_prob {rel} max_prob <= 1")


@dataclass(frozen=True)
class ZipfianFiringProbabilityConfig(_Named):
    """p_i proportional to 1 / i**exponent (i = 1..n), scaled linearly onto [min_prob, max_prob]: a few features
    fire often, most rarely. sae-lens' default for a synthetic model."""

    exponent: float = 1.0
    max_prob: float = 0.3
    min_prob: float = 0.01
    generator_name: ClassVar[str] = "zipfian"

    def __post_init__(self) -> None:
        if not self.exponent > 0:
            raise _fail("ZipfianFiringProbabilityConfig", "exponent", self.exponent, "a number > 0")
        _check_prob_range("ZipfianFiringProbabilityConfig", self.min_prob, self.max_prob, strict=True)

    def generate(self, num_features: int, seed: int | None = None) -> Float[Tensor, " num_features"]:
        """Firing probabilities `[num_features]` (float32), feature 0 the most likely (max_prob), the last
        the least (min_prob); a single feature gets max_prob. `seed` is unused (no randomness)."""
        n = _check_num_features(num_features, "ZipfianFiringProbabilityConfig.generate")
        if n == 1:
            return torch.tensor([self.max_prob])
        p = 1.0 / torch.arange(1, n + 1, dtype=torch.float32) ** self.exponent
        lo, hi = p.min(), p.max()
        return self.min_prob + (self.max_prob - self.min_prob) * (p - lo) / (hi - lo)


@dataclass(frozen=True)
class LinearFiringProbabilityConfig(_Named):
    """p_i falls linearly from max_prob (feature 0) to min_prob (the last feature)."""

    max_prob: float = 0.3
    min_prob: float = 0.01
    generator_name: ClassVar[str] = "linear"

    def __post_init__(self) -> None:
        _check_prob_range("LinearFiringProbabilityConfig", self.min_prob, self.max_prob, strict=False)

    def generate(self, num_features: int, seed: int | None = None) -> Float[Tensor, " num_features"]:
        """Firing probabilities `[num_features]` (float32), from max_prob down to min_prob; a single feature
        gets max_prob. `seed` is unused (no randomness)."""
        n = _check_num_features(num_features, "LinearFiringProbabilityConfig.generate")
        return torch.tensor([self.max_prob]) if n == 1 else torch.linspace(self.max_prob, self.min_prob, n)


@dataclass(frozen=True)
class RandomFiringProbabilityConfig(_Named):
    """p_i uniform in [min_prob, max_prob], drawn from a CPU generator seeded with `seed`."""

    max_prob: float = 0.5
    min_prob: float = 0.01
    generator_name: ClassVar[str] = "random"

    def __post_init__(self) -> None:
        _check_prob_range("RandomFiringProbabilityConfig", self.min_prob, self.max_prob, strict=True)

    def generate(self, num_features: int, seed: int | None = None) -> Float[Tensor, " num_features"]:
        """Firing probabilities `[num_features]` (float32), uniform in [min_prob, max_prob]; `seed=None` uses
        torch's default seed, so it draws the same values every time (as sae-lens does)."""
        n = _check_num_features(num_features, "RandomFiringProbabilityConfig.generate")
        u = torch.rand(n, generator=_cpu_generator(seed), dtype=torch.float32)
        return self.min_prob + (self.max_prob - self.min_prob) * u


@dataclass(frozen=True)
class ConstantFiringProbabilityConfig(_Named):
    """Every feature fires with `probability`."""

    probability: float = 0.1
    generator_name: ClassVar[str] = "constant"

    def __post_init__(self) -> None:
        if not 0 <= self.probability <= 1:
            raise _fail("ConstantFiringProbabilityConfig", "probability", self.probability, "0 <= probability <= 1")

    def generate(self, num_features: int, seed: int | None = None) -> Float[Tensor, " num_features"]:
        """Firing probabilities `[num_features]` (float32), all `probability`. `seed` is unused."""
        n = _check_num_features(num_features, "ConstantFiringProbabilityConfig.generate")
        return torch.full((n,), self.probability, dtype=torch.float32)


FiringProbabilityConfig = Union[
    ZipfianFiringProbabilityConfig,
    LinearFiringProbabilityConfig,
    RandomFiringProbabilityConfig,
    ConstantFiringProbabilityConfig,
]
_FIRING: dict[str, type] = {
    c.generator_name: c
    for c in (
        ZipfianFiringProbabilityConfig,
        LinearFiringProbabilityConfig,
        RandomFiringProbabilityConfig,
        ConstantFiringProbabilityConfig,
    )
}


def firing_probability_from_dict(d: dict[str, Any]) -> FiringProbabilityConfig:
    """The firing-probability config a sae-lens dict describes (`{"generator_name": "zipfian", ...}`)."""
    return _from_dict(d, _FIRING, "firing_probability")  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------
# firing magnitudes: per-feature mean and std of the value a feature takes when it fires
# ----------------------------------------------------------------------------
def _check_start_end(where: str, start: float, end: float) -> None:
    if not (start > 0 and end > 0):
        raise _fail(where, "(start, end)", (start, end), "start > 0 and end > 0")


@dataclass(frozen=True)
class ConstantMagnitudeConfig(_Named):
    """Every feature gets `value`."""

    value: float = 1.0
    generator_name: ClassVar[str] = "constant"

    def generate(self, num_features: int, seed: int | None = None) -> Float[Tensor, " num_features"]:
        """Magnitudes `[num_features]` (float32), all `value`. `seed` is unused."""
        return torch.full((num_features,), self.value, dtype=torch.float32)


@dataclass(frozen=True)
class LinearMagnitudeConfig(_Named):
    """start + (end - start) * i / (n - 1) for feature i."""

    start: float
    end: float
    generator_name: ClassVar[str] = "linear"

    def __post_init__(self) -> None:
        _check_start_end("LinearMagnitudeConfig", self.start, self.end)

    def generate(self, num_features: int, seed: int | None = None) -> Float[Tensor, " num_features"]:
        """Magnitudes `[num_features]` (float32), evenly spaced from start to end; a single feature gets
        start. `seed` is unused."""
        if num_features == 1:
            return torch.tensor([self.start], dtype=torch.float32)
        return torch.linspace(self.start, self.end, num_features)


@dataclass(frozen=True)
class ExponentialMagnitudeConfig(_Named):
    """start * (end / start) ** (i / (n - 1)) for feature i."""

    start: float
    end: float
    generator_name: ClassVar[str] = "exponential"

    def __post_init__(self) -> None:
        _check_start_end("ExponentialMagnitudeConfig", self.start, self.end)

    def generate(self, num_features: int, seed: int | None = None) -> Float[Tensor, " num_features"]:
        """Magnitudes `[num_features]` (float32), a geometric sequence from start to end; a single feature
        gets start. `seed` is unused."""
        if num_features == 1:
            return torch.tensor([self.start], dtype=torch.float32)
        return self.start * (self.end / self.start) ** torch.linspace(0, 1, num_features)


@dataclass(frozen=True)
class FoldedNormalMagnitudeConfig(_Named):
    """|N(mean, std**2)| per feature, clamped to [min_value, max_value] where given. With `seed=None` it
    draws from torch's global generator (as sae-lens does)."""

    mean: float = 0.0
    std: float = 0.1
    min_value: float | None = None
    max_value: float | None = None
    generator_name: ClassVar[str] = "folded_normal"

    def __post_init__(self) -> None:
        w = "FoldedNormalMagnitudeConfig"
        if not self.std > 0:
            raise _fail(w, "std", self.std, "std > 0")
        if self.min_value is not None and self.min_value < 0:
            raise _fail(w, "min_value", self.min_value, "min_value >= 0")
        if self.max_value is not None and self.max_value <= 0:
            raise _fail(w, "max_value", self.max_value, "max_value > 0")
        if self.min_value is not None and self.max_value is not None and self.min_value > self.max_value:
            raise _fail(w, "(min_value, max_value)", (self.min_value, self.max_value), "min_value <= max_value")

    def generate(self, num_features: int, seed: int | None = None) -> Float[Tensor, " num_features"]:
        """Magnitudes `[num_features]` (float32, >= 0): |mean + std * N(0, 1)|, clamped where bounds are
        given; from a CPU generator seeded with `seed`, or torch's global generator when `seed` is None."""
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        x = (self.mean + torch.randn(num_features, generator=g) * self.std).abs()
        if self.min_value is not None or self.max_value is not None:
            x = x.clamp(min=self.min_value, max=self.max_value)
        return x


MagnitudeConfig = Union[
    ConstantMagnitudeConfig, LinearMagnitudeConfig, ExponentialMagnitudeConfig, FoldedNormalMagnitudeConfig
]
_MAGNITUDE: dict[str, type] = {
    c.generator_name: c
    for c in (ConstantMagnitudeConfig, LinearMagnitudeConfig, ExponentialMagnitudeConfig, FoldedNormalMagnitudeConfig)
}


def magnitude_from_dict(d: Any) -> float | MagnitudeConfig:
    """A magnitude as sae-lens writes it: a number (the same for every feature) or a config dict."""
    if isinstance(d, bool) or not isinstance(d, (int, float, dict)):
        raise TypeError(f"magnitude must be a number or a config dict, got {type(d).__name__} ({d!r})")
    return float(d) if isinstance(d, (int, float)) else _from_dict(d, _MAGNITUDE, "magnitude")


def generate_magnitudes(
    num_features: int, config: float | MagnitudeConfig, seed: int | None = None
) -> Float[Tensor, " num_features"]:
    """Per-feature magnitudes `[num_features]` (float32): a number for all, or a config's values."""
    if isinstance(config, (int, float)) and not isinstance(config, bool):
        return torch.full((num_features,), float(config), dtype=torch.float32)
    if not isinstance(config, tuple(_MAGNITUDE.values())):
        raise TypeError(f"magnitude must be a number or a MagnitudeConfig, got {type(config).__name__}")
    return config.generate(num_features, seed=seed)  # type: ignore[union-attr]


# ----------------------------------------------------------------------------
# correlation of firing: a Gaussian copula; feature i fires where z_i > Phi^-1(1 - p_i)
# ----------------------------------------------------------------------------
class LowRankCorrelationMatrix(NamedTuple):
    """The correlation `factor @ factor.T + diag(diag)` kept as its parts: `factor` `[num_features, rank]` and
    `diag` `[num_features]` (chosen so the diagonal is 1). O(n * rank) memory, for many features."""

    correlation_factor: Tensor
    correlation_diag: Tensor


_MIN_DIAG = 0.01  # sae-lens' floor on the diagonal term: the factor never holds more than 99% of a variance


def generate_random_low_rank_correlation_matrix(
    num_features: int,
    rank: int,
    correlation_scale: float = 0.075,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> LowRankCorrelationMatrix:
    """A random low-rank correlation: factor ~ N(0, correlation_scale**2) `[num_features, rank]`, rows whose
    squared norm would leave less than 0.01 of the diagonal rescaled to 0.99 (with a warning), and
    diag = 1 - the rows' squared norms. Seeded as sae-lens seeds it (a fresh generator on `device`).

    Example:
        >>> corr = generate_random_low_rank_correlation_matrix(100, rank=4, correlation_scale=0.2, seed=0)
        >>> (corr.correlation_factor.pow(2).sum(1) + corr.correlation_diag).allclose(torch.ones(100))
        True
    """
    num_features = _check_num_features(num_features, "generate_random_low_rank_correlation_matrix")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise _fail("generate_random_low_rank_correlation_matrix", "rank", rank, "an int >= 1")
    if not (
        isinstance(correlation_scale, (int, float)) and correlation_scale >= 0 and math.isfinite(correlation_scale)
    ):
        raise _fail(
            "generate_random_low_rank_correlation_matrix", "correlation_scale", correlation_scale, "a number >= 0"
        )
    g = torch.Generator(device=device)
    if seed is not None:
        g.manual_seed(seed)
    factor = torch.randn(num_features, rank, generator=g, device=device, dtype=dtype) * correlation_scale
    sq = factor.pow(2).sum(dim=1)
    capped = 1 - sq < _MIN_DIAG
    factor[capped, :] *= torch.sqrt((1 - _MIN_DIAG) / sq[capped].unsqueeze(1))
    if n_capped := int(capped.sum()):
        warnings.warn(
            f"generate_random_low_rank_correlation_matrix: {n_capped} / {num_features} rows were capped; "
            "lower rank or correlation_scale to avoid it",
            stacklevel=2,
        )
    return LowRankCorrelationMatrix(factor, 1 - factor.pow(2).sum(dim=1))


def create_correlation_matrix_from_correlations(
    num_features: int, correlations: dict[tuple[int, int], float] | None = None, default_correlation: float = 0.0
) -> Float[Tensor, "num_features num_features"]:
    """A full correlation matrix with the given pairwise correlations (`{(i, j): c}`) and `default_correlation`
    elsewhere. One that is not positive definite is moved to the nearest one with eigenvalues >= 1e-6 and a
    unit diagonal (as sae-lens does), which changes the requested values a little.

    Example:
        >>> create_correlation_matrix_from_correlations(3, {(0, 1): 0.5})[0, 1]
        tensor(0.5000)
    """
    num_features = _check_num_features(num_features, "create_correlation_matrix_from_correlations")
    eye = torch.eye(num_features)
    m = eye + default_correlation * (1 - eye)
    for (i, j), c in (correlations or {}).items():
        for k in (i, j):
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < num_features:
                raise ValueError(
                    f"correlations: feature index {k!r} in pair {(i, j)} is out of range: "
                    f"features are 0..{num_features - 1}"
                )
        if i == j or not -1 <= c <= 1:
            raise ValueError(f"correlations[{(i, j)}]={c!r}: expected two different features and -1 <= c <= 1")
        m[i, j] = m[j, i] = c
    m = (m + m.T) / 2
    if bool((torch.linalg.eigvalsh(m) < -1e-6).any()):
        vals, vecs = torch.linalg.eigh(m)
        m = vecs @ torch.diag(vals.clamp(min=1e-6)) @ vecs.T
        d = torch.diag(m).clamp(min=1e-8)
        m = m / torch.sqrt(d.unsqueeze(0) * d.unsqueeze(1))
        m.fill_diagonal_(1.0)
    return m
