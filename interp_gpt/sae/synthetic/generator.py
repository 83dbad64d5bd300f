"""`ActivationGenerator`: samples of true feature activations `[batch, num_features]`, as sae-lens' does.

One sample, in sae-lens' order of random draws (so a seeded run equals sae-lens' after
`torch.manual_seed` with the same seed, number for number):

1. which features fire: independently, Bernoulli(p_i); or, given a correlation matrix C (full or
   low-rank), through a Gaussian copula: z ~ N(0, C) and feature i fires where z_i > Phi^-1(1 - p_i),
   so each still fires with probability p_i but together as C says;
2. how strongly: relu(mean_i + std_i * N(0, 1)) for each firing feature;
3. the hierarchy's rules (a child only with its parent, exclusive siblings), then a ReLU.

Example:
    >>> gen = ActivationGenerator(4, firing_probabilities=0.25, std_firing_magnitudes=0.1)
    >>> acts = gen.sample(1000, seed=0)           # [1000, 4]; about a quarter of the entries near 1
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Union

import torch
from jaxtyping import Float
from torch import Tensor

from .distributions import LowRankCorrelationMatrix
from .hierarchy import Hierarchy, HierarchyNode

__all__ = ["ActivationGenerator", "CorrelationInput", "per_feature", "torch_generator"]

CorrelationInput = Union[Tensor, LowRankCorrelationMatrix, tuple[Tensor, Tensor]]


def per_feature(
    value: Tensor | float,
    num_features: int,
    arg: str,
    device: torch.device,
    dtype: torch.dtype,
    low: float = -math.inf,
    high: float = math.inf,
    expected: str = "finite values",
) -> Float[Tensor, " num_features"]:
    """A number for every feature, or a tensor `[num_features]`, as finite values in [low, high], named in errors."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Tensor)):
        raise TypeError(f"{arg} must be a number or a tensor [{num_features}], got {type(value).__name__}")
    t = value if isinstance(value, Tensor) else torch.full((num_features,), float(value))
    if tuple(t.shape) != (num_features,):
        raise ValueError(f"{arg} has shape {tuple(t.shape)}, expected [{num_features}] (num_features) or a number")
    t = t.to(device, dtype)
    bad = ~torch.isfinite(t) | (t < low) | (t > high)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"{arg}[{i}]={t[i].item():.6g} is out of range: expected {expected}")
    return t


def torch_generator(
    device: torch.device | str, seed: int | None, generator: torch.Generator | None
) -> torch.Generator | None:
    """The generator a sampler draws from: `generator`, or a new one seeded with `seed`, or None (torch's global)."""
    if generator is not None and seed is not None:
        raise ValueError("seed and generator: give one of them, not both")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} is out of range: expected an int >= 0")
        return torch.Generator(device=device).manual_seed(seed)
    return generator


class ActivationGenerator:
    """Samples true feature activations (see the module's docstring for the rule).

    Args:
        firing_probabilities: p_i in [0, 1], one number for all features or `[num_features]`.
        std_firing_magnitudes: the magnitude's standard deviation (>= 0) when firing.
        mean_firing_magnitudes: the magnitude's mean when firing.
        hierarchy: a `Hierarchy` (or its root node(s)); its feature indices must be < num_features.
        correlation_matrix: a full correlation matrix `[num_features, num_features]` (unit diagonal, positive
            definite) or a low-rank one, `(factor [num_features, rank], diag [num_features])` with diag > 0.
    """

    def __init__(
        self,
        num_features: int,
        firing_probabilities: Tensor | float,
        std_firing_magnitudes: Tensor | float = 0.0,
        mean_firing_magnitudes: Tensor | float = 1.0,
        hierarchy: Hierarchy | HierarchyNode | Sequence[HierarchyNode] | None = None,
        correlation_matrix: CorrelationInput | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features={num_features!r} is out of range: expected an int >= 1")
        n, self.device, self.dtype = num_features, torch.device(device), dtype
        self.num_features = n
        self.firing_probabilities = per_feature(
            firing_probabilities, n, "firing_probabilities", self.device, dtype, 0.0, 1.0, "probabilities in [0, 1]"
        )
        self.std_firing_magnitudes = per_feature(
            std_firing_magnitudes, n, "std_firing_magnitudes", self.device, dtype, 0.0, expected="finite values >= 0"
        )
        self.mean_firing_magnitudes = per_feature(
            mean_firing_magnitudes, n, "mean_firing_magnitudes", self.device, dtype
        )
        self.hierarchy = (
            None if hierarchy is None else hierarchy if isinstance(hierarchy, Hierarchy) else Hierarchy(hierarchy)
        )
        if self.hierarchy is not None:
            self.hierarchy.check_fits(n)
            scaled = self.hierarchy.rescaling_parents
            if scaled and bool((self.mean_firing_magnitudes[scaled] <= 0).any()):
                raise ValueError(
                    f"mean_firing_magnitudes must be > 0 for the parents whose children scale with them ({scaled})"
                )
        self.correlation_matrix: Tensor | None = None
        self.low_rank_correlation: LowRankCorrelationMatrix | None = None
        self._cholesky: Tensor | None = None
        self._diag_sqrt: Tensor | None = None
        if correlation_matrix is not None:
            self._set_correlation(correlation_matrix)
        # Phi^-1(1 - p) = sqrt(2) erfinv(1 - 2p): feature i fires where its Gaussian exceeds this
        self.thresholds = math.sqrt(2) * torch.erfinv(1 - 2 * self.firing_probabilities)

    def _set_correlation(self, corr: CorrelationInput) -> None:
        n = self.num_features
        if isinstance(corr, Tensor):
            if tuple(corr.shape) != (n, n):
                raise ValueError(f"correlation_matrix has shape {tuple(corr.shape)}, expected [{n}, {n}]")
            if not torch.allclose(torch.diag(corr), torch.ones(n, dtype=corr.dtype, device=corr.device)):
                raise ValueError("correlation_matrix: its diagonal must be all 1s (a correlation matrix)")
            if not torch.allclose(corr, corr.T):
                raise ValueError("correlation_matrix: it must be symmetric")
            cov = corr.to(self.device, self.dtype)
            chol, info = torch.linalg.cholesky_ex(cov)
            if int(info) != 0:
                raise ValueError("correlation_matrix: it is not positive definite")
            self.correlation_matrix, self._cholesky = cov, chol
            return
        if not isinstance(corr, tuple) or len(corr) != 2 or not all(isinstance(t, Tensor) for t in corr):
            raise TypeError(
                f"correlation_matrix must be a tensor [{n}, {n}] or (factor [{n}, rank], diag [{n}]), got {type(corr).__name__}"
            )
        factor, diag = corr
        if factor.ndim != 2 or factor.shape[0] != n:
            raise ValueError(f"correlation_factor has shape {tuple(factor.shape)}, expected [{n}, rank]")
        if tuple(diag.shape) != (n,):
            raise ValueError(f"correlation_diag has shape {tuple(diag.shape)}, expected [{n}]")
        if not bool((diag > 0).all()) or not bool(factor.isfinite().all()):
            raise ValueError("correlation_diag must be > 0 everywhere (and correlation_factor finite)")
        self.low_rank_correlation = LowRankCorrelationMatrix(factor.to(self.device), diag.to(self.device))
        self._diag_sqrt = self.low_rank_correlation.correlation_diag.sqrt()

    @torch.no_grad()
    def sample(
        self, batch_size: int, seed: int | None = None, generator: torch.Generator | None = None
    ) -> Float[Tensor, "batch_size num_features"]:
        """`batch_size` samples of feature activations (non-negative). `seed` (or a `generator` on the
        generator's device) makes them reproducible; with neither they come from torch's global generator
        (as sae-lens' do: `torch.manual_seed(s)` there equals `seed=s` here)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size={batch_size!r} is out of range: expected an int >= 0")
        g = torch_generator(self.device, seed, generator)
        n, dev = self.num_features, self.device
        if self._cholesky is not None:  # z = L eps, eps ~ N(0, I): as torch's MultivariateNormal draws it
            eps = torch.randn(batch_size, n, device=dev, dtype=self.thresholds.dtype, generator=g)
            z = torch.matmul(self._cholesky, eps.unsqueeze(-1)).squeeze(-1)
            rows, cols = (z > self.thresholds).nonzero(as_tuple=True)
        elif self.low_rank_correlation is not None and self._diag_sqrt is not None:
            factor = self.low_rank_correlation.correlation_factor
            eps = torch.randn(batch_size, factor.shape[1], device=dev, dtype=factor.dtype, generator=g)
            eta = torch.randn(batch_size, n, device=dev, dtype=self._diag_sqrt.dtype, generator=g)
            z = eps @ factor.T + eta * self._diag_sqrt
            rows, cols = (z > self.thresholds).nonzero(as_tuple=True)
        else:
            fires = torch.bernoulli(self.firing_probabilities.unsqueeze(0).expand(batch_size, -1), generator=g)
            rows, cols = fires.nonzero(as_tuple=True)
        noise = torch.randn(cols.shape[0], device=dev, dtype=self.dtype, generator=g)
        acts = torch.zeros(batch_size, n, device=dev, dtype=self.dtype)
        acts[rows, cols] = (self.mean_firing_magnitudes[cols] + noise * self.std_firing_magnitudes[cols]).relu()
        if self.hierarchy is not None:
            acts = self.hierarchy.apply(acts, self.mean_firing_magnitudes, g).relu()
        return acts

    def __repr__(self) -> str:
        corr = "full" if self._cholesky is not None else "low-rank" if self.low_rank_correlation is not None else "none"
        return f"ActivationGenerator(num_features={self.num_features}, correlation={corr}, hierarchy={self.hierarchy is not None})"
