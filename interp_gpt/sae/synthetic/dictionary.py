"""The true features: a `FeatureDictionary` maps feature activations `[n, num_features]` to hidden
activations `[n, hidden_dim]` = feature_acts @ feature_vectors + bias, as sae-lens' does.

Its rows are unit vectors drawn at random (seeded), optionally pushed towards orthogonality by
`orthogonalize_embeddings` (sae-lens' gradient descent on the off-diagonal dot products, with Adam).

Example:
    >>> fd = FeatureDictionary(num_features=8, hidden_dim=16, seed=0)
    >>> fd(torch.eye(8)).shape                  # each feature alone: its own vector
    torch.Size([8, 16])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

__all__ = ["OrthogonalizationConfig", "orthogonalize_embeddings", "FeatureDictionary"]


@dataclass(frozen=True)
class OrthogonalizationConfig:
    """sae-lens' orthogonalisation settings: Adam steps, learning rate, rows per chunk (memory only)."""

    num_steps: int = 200
    lr: float = 0.01
    chunk_size: int = 1024

    def __post_init__(self) -> None:
        for name, low in (("num_steps", 0), ("chunk_size", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"OrthogonalizationConfig: {name}={v!r} is out of range: expected an int >= {low}")
        if not self.lr > 0:
            raise ValueError(f"OrthogonalizationConfig: lr={self.lr!r} is out of range: expected a number > 0")

    def to_dict(self) -> dict[str, Any]:
        """sae-lens' JSON for these settings (the `orthogonalization` entry of a synthetic model's config)."""
        return {"num_steps": self.num_steps, "lr": self.lr, "chunk_size": self.chunk_size}


def _unit_rows(x: Tensor) -> Tensor:
    return x / x.norm(p=2, dim=1, keepdim=True).clamp(min=1e-8)


def orthogonalize_embeddings(
    embeddings: Float[Tensor, "n d"], num_steps: int = 200, lr: float = 0.01, chunk_size: int = 1024
) -> Float[Tensor, "n d"]:
    """Unit rows made as orthogonal as Adam gets them in `num_steps` steps, minimising
    sum_{i != j} (e_i . e_j)**2 + n * sum_i (e_i . e_i - 1)**2 (sae-lens' loss), then normalised.
    `chunk_size` rows of the dot-product matrix at a time keep memory O(chunk_size * n)."""
    n = embeddings.shape[0]
    e = _unit_rows(embeddings.detach().clone()).requires_grad_(True)
    opt = torch.optim.Adam([e], lr=lr)
    for _ in range(num_steps):
        opt.zero_grad()
        for start in range(0, n, chunk_size):
            dots = e[start : start + chunk_size] @ e.T  # [chunk, n]
            rows = torch.arange(dots.shape[0], device=e.device)
            off_diagonal = torch.ones_like(dots, dtype=torch.bool)
            off_diagonal[rows, start + rows] = False
            diag = dots[rows, start + rows]
            (dots[off_diagonal].pow(2).sum() + n * (diag - 1).pow(2).sum()).backward()
        opt.step()
    with torch.no_grad():
        return _unit_rows(e).detach().clone()


class FeatureDictionary(nn.Module):
    """The true feature directions `feature_vectors` `[num_features, hidden_dim]` (unit rows) and a `bias`
    `[hidden_dim]` (zeros unless asked for).

    Args:
        bias: False for none, True for a random direction of norm 1, a number for that norm.
        orthogonalize: an `OrthogonalizationConfig` (sae-lens' default for a bare dictionary) or None.
        seed: seeds one generator that draws the vectors, then the bias (as sae-lens draws them).
    """

    feature_vectors: nn.Parameter
    bias: nn.Parameter

    def __init__(
        self,
        num_features: int,
        hidden_dim: int,
        bias: bool | float = False,
        orthogonalize: OrthogonalizationConfig | None = OrthogonalizationConfig(),
        device: str | torch.device = "cpu",
        seed: int | None = None,
    ) -> None:
        super().__init__()
        for name, v in (("num_features", num_features), ("hidden_dim", hidden_dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"FeatureDictionary: {name}={v!r} is out of range: expected an int >= 1")
        if not isinstance(bias, bool) and (not isinstance(bias, (int, float)) or not bias >= 0):
            raise ValueError(f"FeatureDictionary: bias={bias!r}: expected True, False or a norm >= 0")
        self.num_features, self.hidden_dim = num_features, hidden_dim
        g = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        self.feature_vectors = nn.Parameter(
            _unit_rows(torch.randn(num_features, hidden_dim, device=device, generator=g))
        )
        if bias:
            b = torch.randn(hidden_dim, device=device, generator=g)
            self.bias = nn.Parameter(b / b.norm().clamp(min=1e-8) * (1.0 if bias is True else float(bias)))
        else:
            self.bias = nn.Parameter(torch.zeros(hidden_dim, device=device), requires_grad=False)
        if orthogonalize is not None:
            o = orthogonalize
            self.feature_vectors.data = orthogonalize_embeddings(self.feature_vectors, o.num_steps, o.lr, o.chunk_size)

    @classmethod
    def from_vectors(
        cls, feature_vectors: Float[Tensor, "num_features hidden_dim"], bias: Float[Tensor, " hidden_dim"] | None = None
    ) -> FeatureDictionary:
        """A dictionary holding these vectors (kept as given) and bias (zeros if None)."""
        if not isinstance(feature_vectors, Tensor) or feature_vectors.ndim != 2 or 0 in feature_vectors.shape:
            got = (
                tuple(feature_vectors.shape) if isinstance(feature_vectors, Tensor) else type(feature_vectors).__name__
            )
            raise ValueError(f"feature_vectors: expected a tensor [num_features, hidden_dim], got {got}")
        if not feature_vectors.is_floating_point() or not bool(feature_vectors.isfinite().all()):
            raise ValueError("feature_vectors: expected finite floating-point values")
        n, d = feature_vectors.shape
        if bool((feature_vectors.norm(dim=1) == 0).any()):
            raise ValueError(
                f"feature_vectors: rows {(feature_vectors.norm(dim=1) == 0).nonzero().flatten().tolist()} are zero"
            )
        if bias is not None and (
            not isinstance(bias, Tensor) or tuple(bias.shape) != (d,) or not bool(bias.isfinite().all())
        ):
            got = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
            raise ValueError(f"bias: expected a finite tensor [{d}] (hidden_dim), got {got}")
        fd = cls(n, d, bias=False, orthogonalize=None, device=feature_vectors.device, seed=0)
        fd.feature_vectors.data = feature_vectors.detach().clone()
        if bias is not None:
            fd.bias = nn.Parameter(bias.detach().clone().to(feature_vectors), requires_grad=bool(bias.ne(0).any()))
        return fd

    def forward(self, feature_acts: Float[Tensor, "... num_features"]) -> Float[Tensor, "... hidden_dim"]:
        """Hidden activations `[..., hidden_dim]`: `feature_acts @ feature_vectors + bias`, in the dtype of the
        feature vectors."""
        if feature_acts.shape[-1] != self.num_features:
            raise ValueError(
                f"feature_acts has shape {tuple(feature_acts.shape)}, expected [..., {self.num_features}] (num_features)"
            )
        return feature_acts.to(self.feature_vectors.dtype) @ self.feature_vectors + self.bias
