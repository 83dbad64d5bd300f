"""Scores of an SAE against the true features, with sae-lens' definitions (`sae_lens.synthetic.evals`).

* MCC (`mean_correlation_coefficient`): |cosine| between the SAE's decoder rows and the true feature
  vectors; the one-to-one matching of min(d_sae, num_features) pairs with the largest total (the
  Hungarian algorithm, as scipy's `linear_sum_assignment`); the mean |cosine| over the matched pairs.
* uniqueness: each latent's best true feature (argmax |cosine| of its decoder row); the number of
  distinct features so chosen / d_sae.
* classification: each latent, as a detector of its best true feature (as above): TP, FP, FN, TN of
  "latent != 0" against "feature > 0" over the samples; precision, recall, F1 (0 where undefined),
  accuracy per latent; their means over latents.
* true_l0 / sae_l0: mean number of non-zero features / latents per sample; dead_latents: latents never
  non-zero; shrinkage: mean ||sae(x)|| / ||x|| over samples with ||x|| > 1e-6; explained_variance:
  1 - E||x - sae(x)||^2 / (E||x||^2 - ||E x||^2).

The SAE is duck-typed: `encode(x)`, `decode(f)` and `W_dec` `[d_sae, d_in]` are all it needs.

Example:
    >>> evaluate_synthetic(sae, model, n_samples=10_000, seed=0)["mcc"]   # 1.0: a latent on every true feature
    0.97
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from .generator import torch_generator
from .synthetic_model import SyntheticModel

__all__ = [
    "cosine_similarities",
    "linear_sum_assignment",
    "mean_correlation_coefficient",
    "feature_uniqueness",
    "classification_metrics",
    "evaluate_synthetic",
    "sae_decoder",
]


def cosine_similarities(a: Float[Tensor, "n d"], b: Float[Tensor, "m d"]) -> Float[Tensor, "n m"]:
    """Cosine of every row of `a` with every row of `b` (norms clamped at 1e-8: a zero row has cosine 0)."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"expected two matrices [n, d] and [m, d], got {tuple(a.shape)} and {tuple(b.shape)}")
    a = a / a.norm(dim=1, keepdim=True).clamp(min=1e-8)
    return a @ (b / b.norm(dim=1, keepdim=True).clamp(min=1e-8)).T


def linear_sum_assignment(cost: np.ndarray | Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The rows and columns of a one-to-one matching of min(n, m) pairs with the least total cost, as scipy's
    `linear_sum_assignment` (rows sorted). The shortest-augmenting-path Hungarian algorithm, O(n^2 m).

    Example:
        >>> linear_sum_assignment(np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0]]))
        (array([0, 1]), array([1, 0]))
    """
    c = cost.detach().cpu().double().numpy() if isinstance(cost, Tensor) else np.asarray(cost, dtype=np.float64)
    if c.ndim != 2:
        raise ValueError(f"cost: expected a matrix [n, m], got shape {c.shape}")
    if not np.isfinite(c).all():
        raise ValueError("cost: expected finite values")
    flip = c.shape[0] > c.shape[1]
    if flip:
        c = c.T
    n, m = c.shape
    u, v = np.zeros(n + 1), np.zeros(m + 1)  # potentials (index 0: the virtual start)
    owner = np.zeros(m + 1, dtype=np.int64)  # owner[j]: the row (1-based) matched to column j, 0 if none
    way = np.zeros(m + 1, dtype=np.int64)
    for i in range(1, n + 1):
        owner[0], j0 = i, 0
        dist, used = np.full(m + 1, np.inf), np.zeros(m + 1, dtype=bool)
        while True:  # grow the tree of tight edges until it reaches a free column
            used[j0] = True
            i0 = owner[j0]
            reduced = c[i0 - 1] - u[i0] - v[1:]
            better = ~used[1:] & (reduced < dist[1:])
            dist[1:][better], way[1:][better] = reduced[better], j0
            free_dist = np.where(used[1:], np.inf, dist[1:])
            j1 = int(np.argmin(free_dist)) + 1
            delta = free_dist[j1 - 1]
            u[owner[used]] += delta
            v[used] -= delta
            dist[~used] -= delta
            j0 = j1
            if owner[j0] == 0:
                break
        while j0:  # flip the path's matching
            j1 = way[j0]
            owner[j0] = owner[j1]
            j0 = j1
    cols = np.nonzero(owner[1:])[0]
    rows = owner[1:][cols] - 1
    if flip:
        rows, cols = cols, rows
    order = np.argsort(rows)
    return rows[order], cols[order]


def mean_correlation_coefficient(features_a: Float[Tensor, "n d"], features_b: Float[Tensor, "m d"]) -> float:
    """MCC: the mean |cosine| of the best one-to-one matching of the rows of `features_a` and `features_b`
    (1: every row has an exact match, up to sign)."""
    cos = cosine_similarities(features_a, features_b).abs()
    rows, cols = linear_sum_assignment((1 - cos).float())
    return float(cos[torch.as_tensor(rows), torch.as_tensor(cols)].mean())


def feature_uniqueness(sae_features: Float[Tensor, "d_sae d"], gt_features: Float[Tensor, "n d"]) -> float:
    """Distinct true features among the latents' best matches / the number of latents (0 for no latents)."""
    if sae_features.shape[0] == 0:
        return 0.0
    best = cosine_similarities(sae_features, gt_features).abs().argmax(dim=1)
    return len(best.unique()) / sae_features.shape[0]


class _Counts:
    """The streaming sums behind `evaluate_synthetic` (and `classification_metrics`)."""

    def __init__(self, w_dec: Tensor, features: Tensor) -> None:
        d_sae = w_dec.shape[0]
        self.best = (
            cosine_similarities(w_dec, features).abs().argmax(dim=1) if d_sae else torch.zeros(0, dtype=torch.long)
        )
        self.tp, self.fp, self.fn, self.tn = (torch.zeros(d_sae) for _ in range(4))
        self.fired = torch.zeros(d_sae, dtype=torch.bool)
        self.n = self.n_shrink = 0
        self.true_l0 = self.sae_l0 = self.shrink = self.sq = self.sq_res = 0.0
        self.sum_x: Tensor | None = None

    def add_firing(self, latents: Tensor, feature_acts: Tensor) -> None:
        on, truth = latents != 0, feature_acts[:, self.best.to(feature_acts.device)] > 0
        self.tp += (on & truth).float().sum(0).cpu()
        self.fp += (on & ~truth).float().sum(0).cpu()
        self.fn += (~on & truth).float().sum(0).cpu()
        self.tn += (~on & ~truth).float().sum(0).cpu()

    def add(self, x: Tensor, out: Tensor, latents: Tensor, feature_acts: Tensor) -> None:
        self.add_firing(latents, feature_acts)
        self.true_l0 += (feature_acts != 0).float().sum().item()
        self.sae_l0 += (latents != 0).float().sum().item()
        self.fired |= (latents != 0).any(dim=0).cpu()
        norms = x.norm(dim=-1)
        ok = norms > 1e-6
        if bool(ok.any()):
            self.shrink += (out.norm(dim=-1)[ok] / norms[ok]).sum().item()
            self.n_shrink += int(ok.sum().item())
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        s = xf.sum(dim=0).to("cpu", torch.float64)
        self.sum_x = s if self.sum_x is None else self.sum_x + s
        self.sq += xf.pow(2).sum().item()
        self.sq_res += (xf - out).pow(2).sum().item()
        self.n += x.shape[0]

    def classification(self) -> dict[str, float]:
        if self.tp.numel() == 0:
            return {"precision": 0.0, "recall": 0.0, "f1_score": 0.0, "accuracy": 0.0}
        tp, fp, fn, tn = self.tp, self.fp, self.fn, self.tn
        zero = torch.zeros_like(tp)
        precision = torch.where(tp + fp > 0, tp / (tp + fp), zero)
        recall = torch.where(tp + fn > 0, tp / (tp + fn), zero)
        f1 = torch.where(precision + recall > 0, 2 * precision * recall / (precision + recall), zero)
        accuracy = (tp + tn) / (tp + fp + fn + tn).clamp(min=1e-8)
        return {
            k: v.mean().item()
            for k, v in (("precision", precision), ("recall", recall), ("f1_score", f1), ("accuracy", accuracy))
        }

    def explained_variance(self) -> float:
        if self.n == 0 or self.sum_x is None:
            return 0.0
        total = self.sq / self.n - (self.sum_x / self.n).pow(2).sum().item()
        mse = self.sq_res / self.n
        if total < 1e-10:
            return 1.0 if mse < 1e-10 else 0.0
        return 1.0 - mse / total


def sae_decoder(sae: Any, arg: str = "sae") -> Tensor:
    """The SAE's decoder rows `W_dec` `[d_sae, d_in]`, checked to be there (duck typing, named in errors)."""
    for name in ("encode", "decode", "W_dec"):
        if not hasattr(sae, name):
            raise TypeError(
                f"{arg} must have encode, decode and W_dec [d_sae, d_in] (an SAE); {type(sae).__name__} has no {name}"
            )
    w = sae.W_dec
    if not isinstance(w, Tensor) or w.ndim != 2:
        raise ValueError(f"{arg}.W_dec: expected a tensor [d_sae, d_in], got {getattr(w, 'shape', type(w).__name__)}")
    return w.detach()


def classification_metrics(
    sae_latents: Float[Tensor, "n d_sae"],
    feature_acts: Float[Tensor, "n num_features"],
    sae_decoder_rows: Float[Tensor, "d_sae d_in"],
    feature_vectors: Float[Tensor, "num_features d_in"],
) -> dict[str, float]:
    """Each latent as a detector of its best-matching true feature: mean precision, recall, f1_score, accuracy."""
    counts = _Counts(sae_decoder_rows.detach().float().cpu(), feature_vectors.detach().float().cpu())
    counts.add_firing(sae_latents.cpu(), feature_acts.cpu())
    return counts.classification()


@torch.no_grad()
def evaluate_synthetic(
    sae: Any,
    model: SyntheticModel,
    n_samples: int = 100_000,
    seed: int | None = 0,
    batch_size: int | None = None,
    scaling_factor: float | None = None,
) -> dict[str, Any]:
    """Score `sae` on `n_samples` fresh samples of `model` (drawn with `seed`, in batches of `batch_size`):
    the keys and meanings of sae-lens' `eval_sae_on_synthetic_data(...).to_dict()` (see the module's
    docstring): true_l0, sae_l0, dead_latents, shrinkage, explained_variance, mcc, uniqueness and
    classification {precision, recall, f1_score, accuracy}. `scaling_factor` multiplies the activations
    the SAE sees and divides its output (sae-lens' ActivationScaler).

    With `seed=s` the samples equal those sae-lens draws after `torch.manual_seed(s)`; `seed=None` draws
    from torch's global generator.
    """
    w_dec = sae_decoder(sae)
    if not isinstance(model, SyntheticModel):
        raise TypeError(f"evaluate_synthetic: model must be a SyntheticModel, got {type(model).__name__}")
    if w_dec.shape[1] != model.hidden_dim:
        raise ValueError(f"sae reads d_in={w_dec.shape[1]}, but the model's hidden_dim is {model.hidden_dim}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples={n_samples!r} is out of range: expected an int >= 1")
    batch_size = n_samples if batch_size is None else batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is out of range: expected an int >= 1")
    if scaling_factor is not None and not (isinstance(scaling_factor, (int, float)) and scaling_factor > 0):
        raise ValueError(f"scaling_factor={scaling_factor!r} is out of range: expected a number > 0 or None")
    g = torch_generator(model.device, seed, None)
    was_training = getattr(sae, "training", None)
    if hasattr(sae, "eval"):
        sae.eval()
    try:
        counts = _Counts(w_dec.float().cpu(), model.feature_vectors.float().cpu())
        done = 0
        while done < n_samples:
            b = min(batch_size, n_samples - done)
            x, feature_acts = model.sample_with_features(b, generator=g)
            x_in = x.to(w_dec.device, w_dec.dtype)
            latents = sae.encode(x_in if scaling_factor is None else x_in * scaling_factor)
            out = sae.decode(latents)
            out = (out if scaling_factor is None else out / scaling_factor).to(x.device, x.dtype)
            counts.add(x, out, latents.to(x.device), feature_acts)
            done += b
    finally:
        if was_training and hasattr(sae, "train"):
            sae.train()
    return {
        "true_l0": counts.true_l0 / counts.n,
        "sae_l0": counts.sae_l0 / counts.n,
        "dead_latents": int((~counts.fired).sum().item()),
        "shrinkage": counts.shrink / counts.n_shrink if counts.n_shrink else 0.0,
        "explained_variance": counts.explained_variance(),
        "mcc": mean_correlation_coefficient(w_dec.float().cpu(), model.feature_vectors.float().cpu()),
        "uniqueness": feature_uniqueness(w_dec.float().cpu(), model.feature_vectors.float().cpu()),
        "classification": counts.classification(),
    }
