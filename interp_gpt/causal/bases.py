"""Subspaces to intervene on: orthonormal bases `[d_model, rank]`, their check, and the fixed ones.

A basis is a plain tensor whose columns are orthonormal (transformer-lens 4.3's convention):
`orthonormal_basis` extracts one from any matrix (its left singular vectors), `random_basis` draws a
seeded one (the baseline, and the placebo's subspace), `mean_difference_basis` spans the centred
class means (for two classes, the difference-in-means direction). `check_basis` is what every
intervention runs first, so a wrong width or a basis that is not orthonormal fails by name.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from ..checks import check_int_in_range, check_seed, check_type

__all__ = ["check_basis", "mean_difference_basis", "orthonormal_basis", "random_basis"]

ORTHONORMAL_TOL = 1e-4  # |B^T B - I| allowed, for a basis computed in float32


def check_basis(basis: Any, d_model: int, arg: str = "basis", caller: str | None = None) -> Tensor:
    """`basis` itself if it is a finite `[d_model, rank]` tensor with orthonormal columns (1 <= rank <= d_model).

    Example:
        >>> check_basis(torch.eye(4)[:, :2], 4).shape
        torch.Size([4, 2])
        >>> check_basis(2 * torch.eye(4)[:, :2], 4)
        Traceback (most recent call last):
        ...
        ValueError: basis is not orthonormal: |basis.T @ basis - I| reaches 3 (tolerance 0.0001); ...
    """
    where = f"{caller}: " if caller else ""
    basis = check_type(basis, Tensor, arg, "a tensor [d_model, rank] with orthonormal columns", caller)
    if basis.ndim != 2 or basis.shape[0] != d_model or not 1 <= basis.shape[1] <= d_model:
        raise ValueError(
            f"{where}{arg} has shape {tuple(basis.shape)}, expected [{d_model}, rank] with 1 <= rank <= {d_model} "
            f"([d_model, rank]: one column per direction, d_model={d_model} at this hook)"
        )
    if not basis.is_floating_point() or not bool(torch.isfinite(basis).all()):
        raise ValueError(f"{where}{arg} must hold finite real numbers, got dtype {basis.dtype}")
    b = basis.detach().double()
    err = float((b.T @ b - torch.eye(b.shape[1], dtype=torch.float64)).abs().max())
    if err > ORTHONORMAL_TOL:
        raise ValueError(
            f"{where}{arg} is not orthonormal: |{arg}.T @ {arg} - I| reaches {err:.3g} (tolerance {ORTHONORMAL_TOL}); "
            "make one with orthonormal_basis(matrix)"
        )
    return basis


def orthonormal_basis(matrix: Float[Tensor, "d_model width"], rank: int | None = None) -> Float[Tensor, "d_model rank"]:
    """An orthonormal basis of `matrix`'s column space: its leading left singular vectors.

    The numerical rank counts the singular values above `max(shape) * eps(float32)` times the largest
    (transformer-lens' rule); `rank` keeps that many leading directions and may not exceed it.

    Example:
        >>> orthonormal_basis(torch.tensor([[3.0, 6.0], [4.0, 8.0], [0.0, 0.0]])).shape   # rank 1: columns parallel
        torch.Size([3, 1])
    """
    matrix = check_type(matrix, Tensor, "matrix", "a tensor [d_model, width]")
    if matrix.ndim != 2 or 0 in matrix.shape:
        raise ValueError(f"matrix has shape {tuple(matrix.shape)}, expected a non-empty [d_model, width]")
    if not matrix.is_floating_point() or not bool(torch.isfinite(matrix).all()):
        raise ValueError(f"matrix must hold finite real numbers, got dtype {matrix.dtype}")
    work = matrix.detach().to(torch.float64 if matrix.dtype == torch.float64 else torch.float32)
    left, singular, _ = torch.linalg.svd(work, full_matrices=False)
    threshold = float(singular[0]) * max(work.shape) * torch.finfo(work.dtype).eps
    measured = int((singular > threshold).sum())
    if measured == 0:
        raise ValueError(f"matrix of shape {tuple(matrix.shape)} has numerical rank 0 (all zero?)")
    if rank is None:
        return left[:, :measured]
    rank = check_int_in_range(rank, "rank", 1, measured, f"ranks of this matrix (its numerical rank is {measured})")
    return left[:, :rank]


def random_basis(d_model: int, rank: int, seed: int = 0) -> Float[Tensor, "d_model rank"]:
    """A seeded random orthonormal basis `[d_model, rank]`: the baseline an aligned basis should beat.

    transformer-lens 4.3's `random_basis`: a `[d_model, rank]` Gaussian from a generator seeded with
    `seed` (the global random state is untouched), orthonormalised by `orthonormal_basis`.

    Example:
        >>> B = random_basis(64, 2, seed=0)
        >>> torch.allclose(B.T @ B, torch.eye(2), atol=1e-5)
        True
    """
    d_model = check_int_in_range(d_model, "d_model", 1, None)
    rank = check_int_in_range(rank, "rank", 1, d_model, f"ranks for d_model={d_model}")
    generator = torch.Generator().manual_seed(check_seed(seed, "seed", "random_basis"))
    return orthonormal_basis(torch.randn(d_model, rank, generator=generator), rank=rank)


def mean_difference_basis(
    acts: Float[Tensor, "batch d_model"], labels: Sequence[Hashable] | Tensor | np.ndarray
) -> Float[Tensor, "d_model n_classes_minus_1"]:
    """The span of the centred class means of `acts`: for two classes, the difference-in-means direction.

    `labels` holds each row's class (any hashable values, told apart by Python equality: 1 and "1" are two
    classes; a list, a numpy array or a 1-D tensor; at least two classes). Returns an orthonormal
    basis of rank n_classes - 1 (transformer-lens 4.3's `mean_difference_basis`).

    Example:
        >>> _, cache = model.run_with_cache(model.to_tokens(["The cat sat", "The dog ran"]))
        >>> acts = cache["blocks.1.hook_resid_post"][:, -1]          # [2, d_model]
        >>> mean_difference_basis(acts, [0, 1]).shape
        torch.Size([128, 1])
    """
    acts = check_type(acts, Tensor, "acts", "a tensor [batch, d_model]")
    if acts.ndim != 2 or 0 in acts.shape:
        raise ValueError(f"acts has shape {tuple(acts.shape)}, expected a non-empty [batch, d_model]")
    groups = _label_groups(labels, acts.shape[0])
    if len(groups) < 2:
        raise ValueError(f"labels must hold at least two classes, got only {list(groups)}")
    x = acts.detach().float().cpu()
    means = torch.stack([x[rows].mean(0) for rows in groups.values()])
    return orthonormal_basis((means - means.mean(0)).T, rank=len(groups) - 1)


def _label_groups(labels: Any, n: int) -> dict[Hashable, list[int]]:
    """The rows of each class, classes told apart by Python equality (1 and "1" are two classes, 1 and 1.0
    one), sorted where the labels sort (as numpy's unique would) and in order of appearance where not."""
    if isinstance(labels, (Tensor, np.ndarray)):
        if labels.ndim != 1:
            raise ValueError(f"labels has shape {tuple(labels.shape)}, expected [{n}] (one label per row of acts)")
        items = labels.detach().cpu().tolist() if isinstance(labels, Tensor) else labels.tolist()
    elif isinstance(labels, Sequence) and not isinstance(labels, (str, bytes)):
        items = list(labels)
    else:
        raise TypeError(f"labels must be a sequence of class labels (one per row of acts), got {type(labels).__name__}")
    if len(items) != n:
        raise ValueError(f"labels has {len(items)} entries, expected {n} (one label per row of acts)")
    groups: dict[Hashable, list[int]] = {}
    for i, label in enumerate(items):
        try:
            groups.setdefault(label, []).append(i)
        except TypeError:
            raise TypeError(
                f"labels[{i}]={label!r} is not hashable ({type(label).__name__}); classes are told apart by "
                "Python equality: use hashable labels (ints, strings, tuples, frozensets)"
            ) from None
    try:
        return dict(sorted(groups.items(), key=lambda kv: kv[0]))  # type: ignore[arg-type,return-value]
    except TypeError:  # labels that do not sort (str and None, frozensets): first appearance
        return groups
