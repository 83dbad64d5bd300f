"""k-sparse binary probing (Gurnee et al., 2023): which k features (neurons) best separate two classes.

transformer-lens 4.3's `fit_sparse_probe`, on the same definition, in its order:
1. split each class on its own (negatives first): a seeded `randperm` of the class's rows, the first
   `ceil(test_fraction * n)` held out (at least one, and at least one left to train on);
2. score every feature by the difference of its class means on the training rows, and keep the `k`
   features with the largest |score| (ties: the lower index first);
3. fit a logistic regression on those `k` features of the training rows, in float64: class-weighted
   ("balanced") binary cross-entropy + `0.5 * l2_strength * |w|^2` (the intercept is not penalised),
   by L-BFGS (strong Wolfe) from zero, then damped Newton steps until the Newton decrement is <= 1e-12;
4. read the held-out accuracy at logit 0.
A probe's accuracy says a feature set is decodable, not that the model uses it: pair it with an
interchange on `neuron_basis`-style bases, or with a random-feature control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from ..checks import check_float, check_int, check_int_in_range, check_seed, check_type

__all__ = ["SparseProbe", "sparse_probing"]

_LBFGS_TOL_GRAD = 1e-7
_NEWTON_RIDGE = 1e-12  # relative to each pivot of the equilibrated Hessian
_ARMIJO = 1e-4
_HALVINGS = 60
_NEWTON_STEPS = 25
_DECREMENT_TOL = 1e-12


@dataclass(frozen=True)
class SparseProbe:
    """A k-sparse probe from `sparse_probing` (tensors on the CPU; floats in float64).

    `selected_features` `[k]` (by decreasing |score|), `coefficients` `[k]` aligned with them, `intercept`;
    `feature_scores` `[n_features]` (training class-mean differences, positive minus negative);
    `train_indices` / `test_indices` (rows of `features`); `accuracy` on the held-out rows; the fit's
    final `objective` and `newton_decrement`.

    `predict(features)` gives the probe's logits for rows of the full feature matrix:
        >>> probe = sparse_probing(torch.randn(40, 8), torch.arange(40) % 2, k=2)
        >>> probe.predict(torch.randn(3, 8)).shape
        torch.Size([3])
    """

    selected_features: Int[Tensor, " k"]
    coefficients: Float[Tensor, " k"]
    intercept: Float[Tensor, ""]
    feature_scores: Float[Tensor, " n_features"]
    train_indices: Int[Tensor, " n_train"]
    test_indices: Int[Tensor, " n_test"]
    accuracy: float
    positive_label: int
    objective: float
    newton_decrement: float

    def predict(self, features: Float[Tensor, "batch n_features"]) -> Float[Tensor, " batch"]:
        """The probe's logits (positive: the positive class) for rows of `features` `[batch, n_features]`."""
        x = features.detach().cpu().double()[:, self.selected_features]
        return x @ self.coefficients + self.intercept


def _split(positive: Tensor, fraction: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Per class, negatives first: a seeded permutation, its first ceil(fraction * n) rows held out."""
    train, test = [], []
    for cls in (False, True):
        rows = torch.where(positive == cls)[0]
        shuffled = rows[torch.randperm(len(rows), generator=generator)]
        n_test = min(max(math.ceil(fraction * len(rows)), 1), len(rows) - 1)
        test.append(shuffled[:n_test])
        train.append(shuffled[n_test:])
    return torch.cat(train), torch.cat(test)


def _loss(x: Tensor, y: Tensor, params: Tensor, weights: Tensor, l2: float) -> Tensor:
    w = params[:-1]
    bce = F.binary_cross_entropy_with_logits(x @ w + params[-1], y, reduction="none")
    return (weights * bce).mean() + 0.5 * l2 * w.square().sum()


def _grad(x: Tensor, y: Tensor, params: Tensor, weights: Tensor, l2: float) -> Tensor:
    w = params[:-1]
    r = weights * (torch.sigmoid(x @ w + params[-1]) - y) / len(y)
    return torch.cat((x.T @ r + l2 * w, r.sum().reshape(1)))


def _newton(x: Tensor, y: Tensor, params: Tensor, weights: Tensor, l2: float) -> tuple[Tensor, Tensor, float]:
    """The gradient, the Newton direction H^-1 g and the decrement g.H^-1 g / 2 at `params`."""
    design = torch.cat((x, torch.ones(len(y), 1, dtype=torch.float64)), dim=1)
    p = torch.sigmoid(design @ params)
    g = _grad(x, y, params, weights, l2)
    curvature = weights * p * (1.0 - p) / len(y)
    H = (design * curvature[:, None]).T @ design
    H.diagonal()[: x.shape[1]] += l2
    # A saturated fit leaves the (unpenalised) intercept with ~0 curvature: solve the Jacobi-scaled
    # matrix with a small ridge relative to each pivot.
    diag = H.diagonal()
    scale = torch.where(diag > 0, diag.rsqrt(), torch.ones_like(diag))
    scaled = scale[:, None] * H * scale[None, :]
    scaled.diagonal().add_(_NEWTON_RIDGE)
    factor, info = torch.linalg.cholesky_ex(scaled)
    if int(info) != 0:
        raise RuntimeError("sparse_probing: the fit did not converge (the Hessian has no Cholesky factor)")
    direction = scale * torch.cholesky_solve((scale * g)[:, None], factor)[:, 0]
    decrement = 0.5 * float(g @ direction)
    if not math.isfinite(decrement) or decrement < 0:
        raise RuntimeError(f"sparse_probing: the fit did not converge (Newton decrement {decrement!r})")
    return g, direction, decrement


def _fit(x: Tensor, y: Tensor, weights: Tensor, l2: float, max_iter: int) -> tuple[Tensor, float, float]:
    """L-BFGS from zero, then damped Newton: (parameters [k + 1], objective, final decrement)."""
    params = torch.zeros(x.shape[1] + 1, dtype=torch.float64, requires_grad=True)
    lbfgs = torch.optim.LBFGS(
        [params],
        max_iter=max_iter,
        max_eval=max_iter * 5 // 4,
        tolerance_grad=_LBFGS_TOL_GRAD,
        tolerance_change=0.0,
        line_search_fn="strong_wolfe",
    )

    def closure() -> Tensor:
        lbfgs.zero_grad()
        value = _loss(x, y, params, weights, l2)
        value.backward()
        return value

    lbfgs.step(closure)  # type: ignore[no-untyped-call]
    current = params.detach()
    value = float(_loss(x, y, current, weights, l2))
    for steps in range(_NEWTON_STEPS + 1):
        g, direction, decrement = _newton(x, y, current, weights, l2)
        if decrement <= _DECREMENT_TOL:
            return current, value, decrement
        if steps == _NEWTON_STEPS:
            break
        slope, step = float(g @ direction), 1.0
        for _ in range(_HALVINGS):
            candidate = current - step * direction
            candidate_value = float(_loss(x, y, candidate, weights, l2))
            if math.isfinite(candidate_value) and candidate_value <= value - _ARMIJO * step * slope:
                break
            step *= 0.5
        else:
            raise RuntimeError("sparse_probing: the fit did not converge (the Newton line search found no descent)")
        current, value = candidate, candidate_value
    raise RuntimeError(
        f"sparse_probing: the fit did not converge (Newton decrement {decrement:.3g} after {_NEWTON_STEPS} steps)"
    )


def _labels(labels: Any, n: int, positive_label: Any) -> Tensor:
    caller = "sparse_probing"
    labels = check_type(labels, Tensor, "labels", "a tensor of binary labels [n_examples]", caller)
    if labels.is_floating_point() or labels.is_complex():
        raise TypeError(f"{caller}: labels must be bool or integer class labels, got dtype {labels.dtype}")
    if tuple(labels.shape) != (n,):
        raise ValueError(
            f"{caller}: labels has shape {tuple(labels.shape)}, expected [{n}] (one label per row of features)"
        )
    classes = labels.detach().cpu().long().unique().tolist()
    if len(classes) != 2:
        raise ValueError(f"{caller}: labels must hold exactly two classes (binary), got {classes}")
    if isinstance(positive_label, bool):  # as transformer-lens' `int | bool`: True is class 1, False class 0
        positive_label = int(positive_label)
    positive_label = check_int(positive_label, "positive_label", caller)
    if positive_label not in classes:
        raise ValueError(f"{caller}: positive_label={positive_label} is not one of the labels' classes {classes}")
    positive = labels.detach().cpu().long() == positive_label
    fewest = int(min(positive.sum(), (~positive).sum()))
    if fewest < 2:
        raise ValueError(f"{caller}: each class needs at least 2 examples (one to train on, one to test), got {fewest}")
    return positive


def sparse_probing(
    features: Float[Tensor, "n_examples n_features"],
    labels: Int[Tensor, " n_examples"],
    k: int,
    *,
    seed: int = 0,
    test_fraction: float = 0.3,
    positive_label: int | bool = 1,
    l2_strength: float = 1e-2,
    class_weight: str | None = "balanced",
    max_iter: int = 200,
) -> SparseProbe:
    """Fit a k-sparse binary logistic probe: the `k` features with the largest training class-mean
    difference, a logistic regression on them, its held-out accuracy (transformer-lens 4.3's `fit_sparse_probe`).

    Args:
        features: `[n_examples, n_features]` finite floats, e.g. MLP neurons at one position per prompt
            (`collect_activations(model, "blocks.0.mlp.hook_post", tokens)`).
        labels: `[n_examples]` two classes (bool or integers); `positive_label` names the positive one
            (an int, or a bool: True is 1, False 0).
        k: features to keep, 1..n_features.
        seed: seeds the per-class train/test split (a local generator; the global random state is untouched).
        test_fraction: held out per class, in (0, 1).
        l2_strength: the penalty `0.5 * l2_strength * |w|^2`; class_weight: "balanced" or None.
        max_iter: L-BFGS iterations before the Newton refinement.

    Example:
        >>> tokens = model.to_tokens(["The cat sat", "A dog ran", "The cat ran", "A dog sat"] * 5)
        >>> neurons = collect_activations(model, "blocks.0.mlp.hook_post", tokens)   # [20, d_mlp]
        >>> probe = sparse_probing(neurons, torch.tensor([1, 0, 1, 0] * 5), k=3)   # label: starts with "The"
        >>> probe.selected_features.shape, probe.accuracy
        (torch.Size([3]), 1.0)
    """
    caller = "sparse_probing"
    features = check_type(features, Tensor, "features", "a tensor [n_examples, n_features]", caller)
    if features.ndim != 2 or 0 in features.shape:
        raise ValueError(
            f"{caller}: features has shape {tuple(features.shape)}, expected a non-empty [n_examples, n_features]"
        )
    if not features.is_floating_point() or not bool(torch.isfinite(features).all()):
        raise ValueError(f"{caller}: features must hold finite real numbers, got dtype {features.dtype}")
    n, n_features = features.shape
    positive = _labels(labels, n, positive_label)
    k = check_int_in_range(k, "k", 1, n_features, f"k values for {n_features} features", caller=caller)
    seed = check_seed(seed, "seed", caller)
    test_fraction = check_float(test_fraction, "test_fraction", 0.0, 1.0, caller=caller)
    if test_fraction >= 1.0:
        raise ValueError(f"{caller}: test_fraction={test_fraction!r} is out of range: expected a number in (0, 1)")
    l2 = check_float(l2_strength, "l2_strength", 0.0, caller=caller)
    if class_weight not in ("balanced", None):
        raise ValueError(f"{caller}: class_weight must be 'balanced' or None, got {class_weight!r}")
    max_iter = check_int_in_range(max_iter, "max_iter", 1, None, caller=caller)
    x_all = features.detach().cpu()

    # 1. the split, 2. the features
    train, test = _split(positive, test_fraction, torch.Generator().manual_seed(seed))
    work = x_all[train].to(torch.float64 if x_all.dtype == torch.float64 else torch.float32)
    y_train = positive[train]
    scores = (work[y_train].mean(0) - work[~y_train].mean(0)).double()
    selected = torch.argsort(scores.abs(), descending=True, stable=True)[:k]

    # 3. the fit
    x_train = x_all[train][:, selected].double()
    y = y_train.double()
    if class_weight is None:
        weights = torch.ones_like(y)
    else:
        n_pos = y.sum()
        weights = torch.where(y == 1, len(y) / (2 * n_pos), len(y) / (2 * (len(y) - n_pos)))
    params, objective, decrement = _fit(x_train, y, weights, l2, max_iter)

    # 4. the held-out accuracy
    held_out = x_all[test][:, selected].double() @ params[:-1] + params[-1]
    accuracy = float(((held_out >= 0) == positive[test]).double().mean())
    return SparseProbe(
        selected_features=selected,
        coefficients=params[:-1].clone(),
        intercept=params[-1].clone(),
        feature_scores=scores,
        train_indices=train,
        test_indices=test,
        accuracy=accuracy,
        positive_label=int(positive_label),
        objective=objective,
        newton_decrement=decrement,
    )
