"""Feature absorption on a planted hierarchy: does the SAE's latent for a parent feature stay silent
when a child is present, leaving a child's latent to carry the parent too?

Definition (`absorption_score`), for each parent feature p with child features C(p) in the model's
hierarchy:

* the parent's latent l(p) is the latent whose decoder row has the largest cosine with p's true
  vector; each child c gets its latent l(c) the same way;
* an event is a sample in which p is active and at least one child in C(p) is active;
* the event is absorbed when l(p) is 0 while, for some active child c, l(c) is not 0;
* absorption(p) = absorbed events / events; the score is its mean over the parents with events.

A perfect SAE (one latent per feature, each firing exactly when its feature is active) scores 0; one
whose parent latent fires only when no child does, the children's latents taking the parent's
direction instead, scores 1.

Example:
    >>> model = planted_hierarchy_model(n_parents=2, n_children=3, seed=0)
    >>> absorption_score(sae, model, n_samples=5000)["absorption"]   # sae: one trained on model.sample(...)
    0.02
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .dictionary import FeatureDictionary
from .distributions import ConstantFiringProbabilityConfig
from .evaluate import cosine_similarities, sae_decoder
from .generator import torch_generator
from .hierarchy import Hierarchy, HierarchyNode
from .synthetic_model import SyntheticModel, SyntheticModelConfig

__all__ = ["absorption_score", "planted_hierarchy_model"]


def planted_hierarchy_model(
    n_parents: int = 2,
    n_children: int = 3,
    n_free: int = 0,
    hidden_dim: int | None = None,
    parent_probability: float = 0.25,
    child_probability: float = 0.5,
    mutually_exclusive: bool = True,
    std_firing_magnitudes: float = 0.0,
    seed: int = 0,
) -> SyntheticModel:
    """A synthetic model with a planted hierarchy: features 0..n_parents-1 are parents; parent p's children are
    n_parents + p * n_children + (0..n_children-1) (exclusive of each other if `mutually_exclusive`); then
    `n_free` features outside the hierarchy. Parents and free features fire with `parent_probability`; a child
    fires with `child_probability` given its parent (before exclusion). The dictionary's rows are orthonormal
    when hidden_dim >= num_features (the default hidden_dim is num_features), random unit vectors otherwise.

    Example:
        >>> planted_hierarchy_model(2, 3).hierarchy.children_of()
        {0: [2, 3, 4], 1: [5, 6, 7]}
    """
    for name, v, low in (("n_parents", n_parents, 1), ("n_children", n_children, 1), ("n_free", n_free, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"planted_hierarchy_model: {name}={v!r} is out of range: expected an int >= {low}")
    if mutually_exclusive and n_children < 2:
        raise ValueError(f"planted_hierarchy_model: mutually_exclusive needs n_children >= 2, got {n_children}")
    n = n_parents * (1 + n_children) + n_free
    d = n if hidden_dim is None else hidden_dim
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"planted_hierarchy_model: hidden_dim={hidden_dim!r} is out of range: expected an int >= 1")
    for name, p in (("parent_probability", parent_probability), ("child_probability", child_probability)):
        if not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"planted_hierarchy_model: {name}={p!r} is out of range: expected a probability in [0, 1]")
    roots = [
        HierarchyNode(
            p,
            [HierarchyNode(n_parents + p * n_children + k) for k in range(n_children)],
            mutually_exclusive_children=mutually_exclusive,
        )
        for p in range(n_parents)
    ]
    g = torch.Generator().manual_seed(seed)
    if d >= n:
        q, _ = torch.linalg.qr(torch.randn(d, n, generator=g))  # [d, n], orthonormal columns
        vectors = q.T.contiguous()
    else:
        vectors = torch.randn(n, d, generator=g)
        vectors = vectors / vectors.norm(dim=1, keepdim=True)
    probs = torch.full((n,), float(parent_probability))
    probs[n_parents : n_parents * (1 + n_children)] = float(child_probability)
    cfg = SyntheticModelConfig(
        num_features=n,
        hidden_dim=d,
        firing_probability=ConstantFiringProbabilityConfig(float(parent_probability)),
        std_firing_magnitudes=float(std_firing_magnitudes),
        bias=False,
        seed=seed,
    )
    return SyntheticModel(cfg, FeatureDictionary.from_vectors(vectors), Hierarchy(roots), firing_probabilities=probs)


@torch.no_grad()
def absorption_score(
    sae: Any,
    model: SyntheticModel,
    n_samples: int = 10_000,
    seed: int | None = 0,
    batch_size: int | None = None,
    parents: list[int] | None = None,
) -> dict[str, Any]:
    """Absorption of `parents` (default: every feature with children in `model.hierarchy`) by `sae`, on
    `n_samples` samples drawn with `seed` (see the module's docstring for the definition).

    Returns {"absorption": the mean over parents with events (nan if none had one), "per_parent": {p: rate},
    "events": {p: count}, "parent_latents": {p: l(p)}, "child_latents": {c: l(c)}}.
    """
    w_dec = sae_decoder(sae)
    if not isinstance(model, SyntheticModel):
        raise TypeError(f"absorption_score: model must be a SyntheticModel, got {type(model).__name__}")
    if model.hierarchy is None:
        raise ValueError("absorption_score: model has no hierarchy; plant one (planted_hierarchy_model)")
    if w_dec.shape[1] != model.hidden_dim:
        raise ValueError(f"sae reads d_in={w_dec.shape[1]}, but the model's hidden_dim is {model.hidden_dim}")
    kids = model.hierarchy.children_of()
    parents = sorted(kids) if parents is None else list(parents)
    if bad := [p for p in parents if p not in kids]:
        raise ValueError(f"parents: {bad} have no children in the model's hierarchy (parents: {sorted(kids)})")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples={n_samples!r} is out of range: expected an int >= 1")
    batch_size = n_samples if batch_size is None else batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is out of range: expected an int >= 1")
    latent_of = cosine_similarities(w_dec.float().cpu(), model.feature_vectors.float().cpu()).argmax(
        dim=0
    )  # [features]
    events = dict.fromkeys(parents, 0)
    absorbed = dict.fromkeys(parents, 0)
    g, done = torch_generator(model.device, seed, None), 0
    while done < n_samples:
        b = min(batch_size, n_samples - done)
        x, feature_acts = model.sample_with_features(b, generator=g)
        on: Tensor = sae.encode(x.to(w_dec.device, w_dec.dtype)).cpu() != 0
        active = feature_acts.cpu() > 0
        for p in parents:
            child_active = active[:, kids[p]]
            event = active[:, p] & child_active.any(dim=1)
            child_latent_on = (child_active & on[:, latent_of[kids[p]]]).any(dim=1)
            events[p] += int(event.sum())
            absorbed[p] += int((event & ~on[:, latent_of[p]] & child_latent_on).sum())
        done += b
    per_parent = {p: absorbed[p] / events[p] for p in parents if events[p]}
    return {
        "absorption": sum(per_parent.values()) / len(per_parent) if per_parent else float("nan"),
        "per_parent": per_parent,
        "events": events,
        "parent_latents": {p: int(latent_of[p]) for p in parents},
        "child_latents": {c: int(latent_of[c]) for p in parents for c in kids[p]},
    }
