"""Interchange interventions on a linear subspace, and the norm-matched placebo.

An interchange intervention runs the *base* tokens and, at one hook point and one position per row,
sets the activation's coordinates inside an orthonormal basis `B` to those of the *source* run:

    h' = h + strength * ((src - h) @ B) @ B.T

(Geiger et al., 2021; transformer-lens 4.3's `SubspaceInterchange`). The phases, in order:
1. collect the source activations at the hook, through `model.run_with_cache`, batch by batch;
2. run the base tokens with a hook that replaces the activation at the chosen positions;
3. read the logits (or the task logits a `task_logits` function makes from a run).

`norm_matched_placebo` moves every base exactly as far as the interchange would, but inside a random
subspace (transformer-lens 4.3's `NormMatchedPlacebo`): an effect the placebo shares comes from the
size of the move, not from the subspace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..checks import callable_name, check_int_in_range, check_mask, check_seed, check_tokens, check_type
from .bases import check_basis, random_basis

if TYPE_CHECKING:
    from ..model.gpt import GPT

__all__ = ["collect_activations", "interchange", "norm_matched_placebo", "real_token_columns"]

TaskLogits = Callable[[Tensor], Tensor]
Positions = int | Sequence[int] | Tensor
# Maps (base rows [n, d], source rows [n, d]) to new base rows.
Intervention = Callable[[Tensor, Tensor], Tensor]


def check_gpt(model: Any, caller: str) -> GPT:
    """`model` itself if it is our GPT (the checks below and the hooks need its config and hook points)."""
    from ..model.gpt import GPT  # at call time: the model module sits below this package

    return check_type(model, GPT, "model", "a GPT (interp_gpt's model)", caller)


def check_token_rows(model: GPT, tokens: Any, arg: str, caller: str) -> Tensor:
    """Token ids `[batch, pos]` the model can run, on the model's device."""
    return check_tokens(tokens, model.cfg.d_vocab, model.cfg.n_ctx, arg, caller=caller).to(model.W_E.device)


def check_positions(positions: Any, n_batch: int, n_pos: int, arg: str, caller: str) -> Tensor:
    """One position per row as a long tensor in 0..n_pos-1, from an int (every row) or one int per row
    (negative counts from the end)."""
    pos = _position_ints(positions, n_batch, arg, caller)
    bad = (pos < -n_pos) | (pos >= n_pos)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{caller}: {arg}[{i}]={int(pos[i])} is out of range: positions are 0..{n_pos - 1} "
            "(negative counts from the end)"
        )
    return pos % n_pos


def real_token_columns(positions: Any, mask: Tensor, arg: str, caller: str, rows: str = "tokens") -> Tensor:
    """The one rule for padded batches: each row is read at its own `positions` (an int for every row, or one
    per row) counted in its real tokens, the 1s of `mask` `[batch, pos]` (left or right padding): p >= 0 is its
    p-th real token, p < 0 counts from its last real token, never a pad. Returns the columns, a long tensor
    `[batch]` (CPU); a position outside a row's real tokens is refused, naming `arg` and the row of `rows`.

    Example:
        >>> real_token_columns(-1, torch.tensor([[1, 1, 1], [1, 0, 0], [0, 1, 1]]), "positions", "example")
        tensor([2, 0, 2])
    """
    mask = mask.detach().cpu().long()
    pos = _position_ints(positions, mask.shape[0], arg, caller)
    lengths = mask.sum(1)
    rank = torch.where(pos < 0, lengths + pos, pos)
    bad = (rank < 0) | (rank >= lengths)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        name = arg if isinstance(positions, int) and not isinstance(positions, bool) else f"{arg}[{i}]"
        raise ValueError(
            f"{caller}: {name}={int(pos[i])} is outside {rows}[{i}] ({int(lengths[i])} real tokens: "
            f"0..{int(lengths[i]) - 1}, negative counts from its last; pads are never read)"
        )
    order = mask.cumsum(1) - 1  # each real token's rank in its row
    return ((order == rank[:, None]) & (mask == 1)).long().argmax(1)


def _position_ints(positions: Any, n_batch: int, arg: str, caller: str) -> Tensor:
    """One int per row `[n_batch]` (long, CPU), from an int (every row) or one int per row; not yet range-checked."""
    if isinstance(positions, bool) or positions is None:
        raise TypeError(f"{caller}: {arg} must be an int or one int per row, got {positions!r}")
    if isinstance(positions, int):
        pos = torch.full((n_batch,), positions, dtype=torch.long)
    else:
        pos = torch.as_tensor(positions)
        if pos.dtype == torch.bool or pos.is_floating_point() or pos.is_complex():
            raise TypeError(f"{caller}: {arg} must hold integer positions, got dtype {pos.dtype}")
        if pos.ndim == 0:  # a numpy or 0-d tensor int: every row
            pos = pos.expand(n_batch)
        if tuple(pos.shape) != (n_batch,):
            raise ValueError(
                f"{caller}: {arg} has shape {tuple(pos.shape)}, expected [{n_batch}] (one position per row)"
            )
        pos = pos.long().cpu()
    return pos


def check_position_pair(
    base: Tensor, source: Tensor, positions: Any, source_positions: Any, arg: str, caller: str
) -> tuple[Tensor, Tensor]:
    """(base positions, source positions) as `check_positions` gives them; `source_positions` None reads the
    source where the base is intervened on. `arg` names `positions` in errors."""
    pos = check_positions(positions, base.shape[0], base.shape[1], arg, caller)
    src = positions if source_positions is None else source_positions
    return pos, check_positions(src, source.shape[0], source.shape[1], "source_positions", caller)


def check_strength(strength: Any, caller: str) -> float:
    """`strength` as a finite float (any sign: 1 interchanges, 0 leaves the base); a 0-d tensor or a numpy
    scalar is its number, as `steer`'s coeff."""
    strength = strength.item() if getattr(strength, "ndim", None) == 0 else strength
    if isinstance(strength, bool) or not isinstance(strength, (int, float)):
        raise TypeError(f"{caller}: strength must be a number, got {type(strength).__name__} ({strength!r})")
    if not math.isfinite(strength):
        raise ValueError(f"{caller}: strength={strength!r} is out of range: expected a finite number")
    return float(strength)


def chunks(n: int, size: int) -> Iterator[slice]:
    """Slices of `size` rows (the last one shorter) covering 0..n-1."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def check_hook(model: GPT, hook: Any, caller: str) -> str:
    """`hook` itself if the model has a hook point of that name (a KeyError that suggests close names if not)."""
    if not isinstance(hook, str):
        raise TypeError(f"{caller}: hook must be a hook name (str), got {type(hook).__name__}")
    model.hook_points(hook)  # an unknown name: KeyError, with the close names
    return hook


def check_runs(model: Any, hook: Any, base: Any, source: Any, caller: str) -> tuple[GPT, str, Tensor, Tensor]:
    """(model, hook, base, source) checked, in that order: our GPT, one of its hooks, and the base and source
    token rows on its device (what `interchange`, `norm_matched_placebo` and `fit_das` run)."""
    model = check_gpt(model, caller)
    hook = check_hook(model, hook, caller)
    base = check_token_rows(model, base, "base", caller)
    source = check_token_rows(model, source, "source", caller)
    return model, hook, base, source


def _rows(act: Tensor, pos: Tensor, hook: str, caller: str) -> Tensor:
    """The `[batch, d]` rows of `act` `[batch, pos, d]` at one position per row."""
    if act.ndim != 3:
        raise ValueError(
            f"{caller}: hook {hook!r} holds shape {tuple(act.shape)}, expected [batch, pos, d] "
            "(interchange works on one vector per position: use a residual, MLP or attention-output hook)"
        )
    return act[torch.arange(act.shape[0], device=act.device), pos.to(act.device)]


@torch.no_grad()
def collect_activations(
    model: GPT,
    hook: str,
    tokens: Int[Tensor, "batch pos"] | Sequence[str],
    positions: Positions = -1,
    *,
    batch_size: int = 64,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, "batch d"]:
    """The activation at `hook`, at one position per row (`positions`: an int or one per row; negative
    counts from the end), collected with `model.run_with_cache` in batches of `batch_size`.

    Padded batches follow one rule (`contrastive_vector`'s): given prompts as a list of strings (padded on
    the right here), or token ids with their `attention_mask` (from `model.to_tokens(..., return_mask=True)`,
    either side), each row is read at its own `positions` counted in its real tokens, never at a pad, and the
    mask goes into the run. Token ids alone are read at those columns of the tensor as they are.

    Example:
        >>> collect_activations(model, "blocks.0.hook_resid_post", model.to_tokens(["The cat", "A dog"])).shape
        torch.Size([2, 128])
        >>> collect_activations(model, "blocks.0.hook_resid_post", ["The cat sat", "A dog"]).shape   # last real tokens
        torch.Size([2, 128])
    """
    caller = "collect_activations"
    model = check_gpt(model, caller)
    hook = check_hook(model, hook, caller)
    if isinstance(tokens, (list, tuple)) and tokens and all(isinstance(t, str) for t in tokens):
        if attention_mask is not None:
            raise ValueError(f"{caller}: attention_mask goes with token ids; prompts given as strings are padded here")
        tokens, attention_mask = model.to_tokens(list(tokens), padding_side="right", return_mask=True)
    tokens = check_token_rows(model, tokens, "tokens", caller)
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None, caller=caller)
    mask: Tensor | None = None
    if attention_mask is None:
        pos = check_positions(positions, tokens.shape[0], tokens.shape[1], "positions", caller)
    else:
        mask = check_mask(attention_mask, tuple(tokens.shape)).to(tokens.device)
        pos = real_token_columns(positions, mask, "positions", caller)
    out = []
    for idx in chunks(len(tokens), batch_size):
        if mask is None:
            _, cache = model.run_with_cache(tokens[idx], names_filter=hook)
        else:
            _, cache = model.run_with_cache(tokens[idx], attention_mask=mask[idx], names_filter=hook)
        out.append(_rows(cache[hook], pos[idx], hook, caller))
    return torch.cat(out)


def intervened(
    model: GPT,
    hook: str,
    intervention: Intervention,
    base: Tensor,
    source_acts: Tensor,
    pos: Tensor,
    task_logits: TaskLogits | None,
    caller: str,
) -> Tensor:
    """One forward of `base` with `intervention` applied at `hook` (differentiable): the task logits."""
    fired = 0
    name = hook

    def fn(act: Tensor, hook: Any) -> Tensor:  # transformer-lens' hook signature: the argument is named `hook`
        nonlocal fired
        fired += 1
        rows = _rows(act, pos, name, caller)
        out = act.clone()
        out[torch.arange(act.shape[0], device=act.device), pos.to(act.device)] = intervention(
            rows, source_acts.to(act.device, act.dtype)
        )
        return out

    with model.hooks(fwd_hooks=[(hook, fn)]):
        logits = model(base) if task_logits is None else task_logits(base)
    if fired != 1:  # a second firing would reuse the source rows of the first
        what = "task_logits " + callable_name(task_logits) if task_logits is not None else "the forward"
        raise ValueError(f"{caller}: hook {hook!r} fired {fired} times in one call of {what}, expected once")
    return logits


def subspace_move(base: Tensor, source: Tensor, B: Tensor, strength: float) -> Tensor:
    """`strength * ((source - base) @ B) @ B.T`: what the interchange adds to the base rows."""
    B = B.to(base.device, base.dtype)
    return strength * ((source - base) @ B) @ B.T


def _run(
    caller: str,
    model: Any,
    hook: Any,
    base: Any,
    source: Any,
    basis: Any,
    positions: Positions,
    source_positions: Positions | None,
    strength: Any,
    task_logits: TaskLogits | None,
    batch_size: Any,
    make: Callable[[Tensor], Intervention],
) -> Tensor:
    model, hook, base, source = check_runs(model, hook, base, source, caller)
    if len(source) != len(base):
        raise ValueError(f"{caller}: source has {len(source)} rows, base {len(base)}: expected one source per base")
    check_strength(strength, caller)
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None, caller=caller)
    if task_logits is not None and not callable(task_logits):
        raise TypeError(f"{caller}: task_logits must be a function tokens -> logits, got {type(task_logits).__name__}")
    pos, src_pos = check_position_pair(base, source, positions, source_positions, "positions", caller)
    src = collect_activations(model, hook, source, src_pos, batch_size=batch_size)
    basis = check_basis(basis, src.shape[-1], "basis", caller)
    intervention = make(basis)
    out = []
    with torch.no_grad():
        for idx in chunks(len(base), batch_size):
            out.append(intervened(model, hook, intervention, base[idx], src[idx], pos[idx], task_logits, caller))
    return torch.cat(out)


def interchange(
    model: GPT,
    hook: str,
    base: Int[Tensor, "batch pos"],
    source: Int[Tensor, "batch src_pos"],
    basis: Float[Tensor, "d rank"],
    positions: Positions = -1,
    strength: float = 1.0,
    *,
    source_positions: Positions | None = None,
    task_logits: TaskLogits | None = None,
    batch_size: int = 64,
) -> Tensor:
    """Run `base` with its activation at `hook` set, inside `basis`, to the `source` run's: `h + s((src - h) B) B^T`.

    Args:
        hook: a hook holding one vector per position (`[batch, pos, d]`: residual, MLP or attention outputs).
        base: token ids, the runs to intervene on.
        source: token ids, one source row per base row (lengths may differ).
        basis: an orthonormal `[d, rank]` basis (`orthonormal_basis`, `random_basis`, `mean_difference_basis`,
            `fit_das(...).basis`).
        positions: the base position to intervene at, one int for every row or one per row (negative counts
            from the end); `source_positions` (default: `positions`) the source position read.
        strength: 1 takes the source's coordinates, 0 leaves the base, other values scale the move.
        task_logits: a function that runs the model once on a batch of tokens and returns what to keep,
            e.g. `lambda t: model(t)[:, -1, answer_ids]`; None: the model's logits `[batch, pos, d_vocab]`.

    Returns what `task_logits` returns (or the logits), concatenated over batches of `batch_size`, without gradients.

    Example:
        >>> base, source = model.to_tokens(["The cat sat on the"]), model.to_tokens(["The dog ran to the"])
        >>> logits = interchange(model, "blocks.0.hook_resid_post", base, source, random_basis(model.cfg.d_model, 4))
        >>> logits.shape                                    # [batch, pos, d_vocab]
        torch.Size([1, 7, 2048])
    """
    s = check_strength(strength, "interchange")

    def make(B: Tensor) -> Intervention:
        return lambda h, src: h + subspace_move(h, src, B, s)

    return _run(
        "interchange", model, hook, base, source, basis, positions, source_positions, strength, task_logits,
        batch_size, make,
    )  # fmt: skip


def placebo_move(base: Tensor, source: Tensor, B: Tensor, P: Tensor, strength: float) -> Tensor:
    """The move `((source - base) @ P) @ P.T`, rescaled row by row to the interchange's distance."""
    distance = subspace_move(base, source, B, strength).norm(dim=-1, keepdim=True)
    P = P.to(base.device, base.dtype)
    move = ((source - base) @ P) @ P.T
    return move * (distance / move.norm(dim=-1, keepdim=True).clamp_min(1e-8))


def norm_matched_placebo(
    model: GPT,
    hook: str,
    base: Int[Tensor, "batch pos"],
    source: Int[Tensor, "batch src_pos"],
    basis: Float[Tensor, "d rank"],
    positions: Positions = -1,
    strength: float = 1.0,
    *,
    placebo_basis: Float[Tensor, "d placebo_rank"] | None = None,
    seed: int = 0,
    source_positions: Positions | None = None,
    task_logits: TaskLogits | None = None,
    batch_size: int = 64,
) -> Tensor:
    """The control for `interchange`: move each base row as far as the interchange in `basis` would, but inside
    a random subspace (transformer-lens 4.3's `NormMatchedPlacebo`).

    The move is `((src - h) P) P^T`, rescaled per row to the length of `strength * ((src - h) B) B^T`.
    `placebo_basis` is `P`; by default `random_basis(d, rank of basis, seed)`. The other arguments are
    `interchange`'s, and so is the return value.

    Example:
        >>> base, source = model.to_tokens(["The cat sat on the"]), model.to_tokens(["The dog ran to the"])
        >>> B = random_basis(model.cfg.d_model, 4, seed=1)
        >>> placebo = norm_matched_placebo(model, "blocks.0.hook_resid_post", base, source, B, seed=2)
        >>> placebo.shape
        torch.Size([1, 7, 2048])
    """
    caller = "norm_matched_placebo"
    s = check_strength(strength, caller)
    seed = check_seed(seed, "seed", caller)  # before the source runs

    def make(B: Tensor) -> Intervention:
        d, rank = B.shape
        P = (
            random_basis(d, rank, seed)
            if placebo_basis is None
            else check_basis(placebo_basis, d, "placebo_basis", caller)
        )
        return lambda h, src: h + placebo_move(h, src, B, P, s)

    return _run(
        caller, model, hook, base, source, basis, positions, source_positions, strength, task_logits, batch_size, make
    )
