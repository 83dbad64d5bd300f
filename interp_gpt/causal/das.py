"""Distributed alignment search (DAS; Geiger et al., 2024): learn the subspace whose interchange makes the
model produce what a high-level causal model predicts.

`targets[i]` is the class the high-level model predicts for base `i` with the aligned variable taken from
source `i`. The phases (transformer-lens 4.3's `fit_das`, in its order and with its seeds):
1. collect the source activations at the hook (through `model.run_with_cache`, in batches);
2. initialise a rank-`rank` subspace whose basis stays orthonormal (`torch.nn.utils.parametrizations.orthogonal`
   on a `Linear(rank, d)`, initialised from the CPU generator seeded with `seed` inside a fork that restores it);
3. for each epoch (a progress bar), shuffle the pairs (`numpy.random.default_rng(seed)`), and for each batch
   run the base tokens with the interchange at the hook, take the task logits, and step Adam on the
   cross-entropy against `targets`; the model's parameters are frozen during the fit and restored after.
Check a learned subspace against `norm_matched_placebo` and `random_basis`: DAS also finds effects in
random models and fits arbitrary labels (Arora et al., 2024).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.nn.utils.parametrizations import orthogonal
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_float, check_int_in_range, check_seed, check_type
from .interchange import (
    Positions,
    TaskLogits,
    check_position_pair,
    check_runs,
    check_strength,
    chunks,
    collect_activations,
    intervened,
    subspace_move,
)

if TYPE_CHECKING:
    from ..model.gpt import GPT

__all__ = ["DASResult", "fit_das"]


@dataclass(frozen=True)
class DASResult:
    """A subspace learned by `fit_das`: `basis` `[d, rank]` (orthonormal, detached), the mean training loss
    of each epoch, and where it was trained.

    Use it as `interchange(model, result.hook, base, source, result.basis, ...)`; see `fit_das` for an example.
    """

    basis: Float[Tensor, "d rank"]
    losses: tuple[float, ...]
    hook: str
    rank: int


def _subspace(d: int, rank: int, seed: int) -> nn.Module:
    """A `Linear(rank, d)` whose `[d, rank]` weight stays orthonormal, initialised from the CPU generator
    seeded with `seed` (restored afterwards: the caller's random stream is untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return orthogonal(nn.Linear(rank, d, bias=False))


def _weight(subspace: nn.Module) -> Tensor:
    """The subspace's orthonormal basis `[d, rank]` (the parametrised weight, recomputed on each read)."""
    return cast(Tensor, subspace.weight)


@torch.enable_grad()  # trains under a caller's torch.no_grad() / set_grad_enabled(False) too
def fit_das(
    model: GPT,
    hook: str,
    base: Int[Tensor, "batch pos"],
    source: Int[Tensor, "batch src_pos"],
    targets: Int[Tensor, " batch"],
    task_logits: TaskLogits,
    *,
    rank: int,
    base_positions: Positions = -1,
    source_positions: Positions | None = None,
    epochs: int = 20,
    batch_size: int = 128,
    lr: float = 1e-2,
    strength: float = 1.0,
    seed: int = 0,
    progress: bool = True,
) -> DASResult:
    """Learn the rank-`rank` subspace at `hook` whose interchange makes `task_logits` predict `targets` (DAS).

    Args:
        base: token ids, one pair per row with `source`.
        source: token ids, the run whose activation is read.
        targets: the high-level model's class for each pair under the interchange (an index into the task logits).
        task_logits: runs the model once on a batch of tokens and returns `[batch, n_classes]`,
            e.g. `lambda t: model(t)[:, -1, answer_ids]`.
        base_positions: where to intervene (an int for every row or one per row; negative counts from the end).
        source_positions: where to read the source (the same forms; default `base_positions`).
        epochs: passes over the pairs (Adam).
        batch_size: pairs per step.
        lr: Adam's learning rate.
        strength: the interchange's strength during training (1: take the source's coordinates).
        seed: sets the initial basis and the batch order, so a fit is repeatable.
        progress: show a progress bar over the epochs.

    Returns a `DASResult`; evaluate it with `interchange(..., result.basis, task_logits=...)` on held-out pairs
    and against `norm_matched_placebo`.

    Example:
        >>> ids = [model.to_single_token(w) for w in (" he", " she")]
        >>> base, source = model.to_tokens(["Then he", "Then she"]), model.to_tokens(["Then she", "Then he"])
        >>> targets = torch.tensor([1, 0])                  # the source's pronoun
        >>> task = lambda t: model(t)[:, -1, ids]
        >>> result = fit_das(model, "blocks.0.hook_resid_post", base, source, targets, task, rank=1, epochs=2,
        ...                  progress=False)
        >>> result.basis.shape
        torch.Size([128, 1])
    """
    caller = "fit_das"
    model, hook, base, source = check_runs(model, hook, base, source, caller)
    targets = _check_targets(targets, base, source, task_logits, caller)
    rank = check_int_in_range(rank, "rank", 1, None, caller=caller)
    epochs = check_int_in_range(epochs, "epochs", 1, None, caller=caller)
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None, caller=caller)
    lr = check_float(lr, "lr", 0.0, caller=caller)
    strength = check_strength(strength, caller)
    seed = check_seed(seed, "seed", caller)  # before any work: torch and numpy's default_rng both take it
    pos, src_pos = check_position_pair(base, source, base_positions, source_positions, "base_positions", caller)

    # Under a caller's torch.inference_mode() too: the fit leaves it (as it leaves no_grad), and takes copies
    # of inference tensors, which autograd may not save for backward.
    with torch.inference_mode(False):
        base, source, targets, pos, src_pos = (
            t.clone() if t.is_inference() else t for t in (base, source, targets, pos, src_pos)
        )
        return _fit(model, hook, base, source, targets, task_logits, rank, (pos, src_pos), epochs, batch_size, lr,
                    strength, seed, progress)  # fmt: skip


def _fit(
    model: GPT,
    hook: str,
    base: Tensor,
    source: Tensor,
    targets: Tensor,
    task_logits: TaskLogits,
    rank: int,
    positions: tuple[Tensor, Tensor],
    epochs: int,
    batch_size: int,
    lr: float,
    strength: float,
    seed: int,
    progress: bool,
) -> DASResult:
    """Phases 1-3 on checked arguments, outside inference mode."""
    caller = "fit_das"
    pos, src_pos = positions
    # 1. the source activations
    src = collect_activations(model, hook, source, src_pos, batch_size=batch_size)
    d = src.shape[-1]
    rank = check_int_in_range(rank, "rank", 1, d, f"ranks at {hook} (d={d})", caller=caller)
    labels = targets.long().cpu()
    with torch.no_grad():
        n_classes = task_logits(base[:1]).shape[-1]
    if bool(((labels < 0) | (labels >= n_classes)).any()):
        raise ValueError(
            f"{caller}: targets must be class indices 0..{n_classes - 1} (task_logits gives {n_classes}), got {labels.unique().tolist()}"
        )

    # 2. the subspace, seeded
    rng = np.random.default_rng(seed)
    subspace = _subspace(d, rank, seed).to(model.W_E.device)
    optimizer = torch.optim.Adam(subspace.parameters(), lr=lr)

    # 3. the epochs
    losses = _train(
        model,
        hook,
        subspace,
        optimizer,
        rng,
        (base, src, pos, labels),
        task_logits,
        epochs,
        batch_size,
        strength,
        progress,
    )
    return DASResult(_weight(subspace).detach().clone(), tuple(losses), hook, rank)


def _check_targets(targets: Any, base: Tensor, source: Tensor, task_logits: Any, caller: str) -> Tensor:
    """Refuse targets that are no class indices, one per pair, or a task_logits that is no function."""
    targets = check_type(targets, Tensor, "targets", "a tensor of class indices [batch]", caller)
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool or targets.ndim != 1:
        raise TypeError(
            f"{caller}: targets must be class indices [batch] (integers), got {targets.dtype} {tuple(targets.shape)}"
        )
    if not len(base) == len(source) == len(targets):
        raise ValueError(
            f"{caller}: base, source and targets must have one row per pair, got {len(base)}, {len(source)}, {len(targets)}"
        )
    if not callable(task_logits):
        raise TypeError(
            f"{caller}: task_logits must be a function tokens -> [batch, n_classes], got {type(task_logits).__name__}"
        )
    return targets


def _train(
    model: GPT,
    hook: str,
    subspace: nn.Module,
    optimizer: torch.optim.Optimizer,
    rng: np.random.Generator,
    pairs: tuple[Tensor, Tensor, Tensor, Tensor],
    task_logits: TaskLogits,
    epochs: int,
    batch_size: int,
    strength: float,
    progress: bool,
) -> list[float]:
    """Phase 3: the epochs of Adam on the cross-entropy of the interchanged runs' task logits against the
    labels, the model's parameters frozen (and restored after); returns each epoch's mean loss. `pairs`:
    (base tokens, source activations, base positions, labels)."""
    base, src, pos, labels = pairs

    def intervention(h: Tensor, s: Tensor) -> Tensor:
        return h + subspace_move(h, s, _weight(subspace), strength)

    flags = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    losses = []
    try:
        for _ in tqdm(range(epochs), desc="DAS epochs", disable=not progress):
            order = torch.as_tensor(rng.permutation(len(labels)))
            total = 0.0
            for part in chunks(len(order), batch_size):
                idx = order[part]
                optimizer.zero_grad()
                logits = intervened(model, hook, intervention, base[idx], src[idx], pos[idx], task_logits, "fit_das")
                loss = F.cross_entropy(logits, labels[idx].to(logits.device), reduction="sum") / len(idx)
                loss.backward()
                total += loss.item() * len(idx)
                optimizer.step()
            losses.append(total / len(order))
    finally:
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)
    return losses
