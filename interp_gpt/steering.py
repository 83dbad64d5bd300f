"""Steering: add a direction to an activation, or take it out, in every forward pass and in `generate`.

The phases of activation steering (Turner et al. 2023, "Activation Addition"; Rimsky et al. 2024,
"Steering Llama 2 via Contrastive Activation Addition"), in the order this module offers them:

1. find a direction: `contrastive_vector` (the mean activation on one set of prompts less that on
   another, at each prompt's last real token: CAA), or `sae_direction` (an SAE feature's decoder row);
2. move it between weights: `map_direction` (a direction found on processed weights used on raw ones,
   and back; exact, or refused by name);
3. steer with it: `with steer(model, hook, vector, ...):` every forward pass inside, `model.generate`
   with its key/value cache included, sees the hook's activation changed at each position.

`steer` is built on the model's hook points (`model.hooks(...)`): its hooks fire only in the thread
that entered it, and go when it exits, also when the body raises.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Union

import torch
from torch import Tensor

from .causal.interchange import real_token_columns
from .checks import check_float, check_index, check_int, check_int_in_range, check_str_list, check_type, is_centred
from .factored import carry_head_vector
from .utils import hook_shape

__all__ = ["Steering", "steer", "contrastive_vector", "sae_direction", "map_direction"]

Mode = Literal["add", "project_out", "ablate"]
Positions = Union[int, Sequence[int], slice, None]
Refuse = Callable[[str], Exception]
_MODES = ("add", "project_out", "ablate")
_DEFAULT_COEFF = {"add": 1.0, "project_out": 1.0, "ablate": 0.0}
# Hooks with no [batch, pos, ...] layout to steer at one position: patterns, scores, token ids.
_NO_VECTOR = re.compile(r".*(hook_attn_scores|hook_pattern)|hook_tokens")


@dataclass(frozen=True, eq=False)
class Steering:
    """One steering intervention, for `steer(model, [Steering(...), ...])` (several at once).

    `hook`, `vector`, `coeff`, `mode` and `positions` mean what they mean for `steer`.

    Example:
        >>> v = torch.randn(model.cfg.d_model)
        >>> specs = [Steering("blocks.0.hook_resid_post", v, coeff=4.0),
        ...          Steering("blocks.1.hook_resid_pre", v, mode="project_out")]
        >>> with steer(model, specs):
        ...     logits = model("The cat sat")
    """

    hook: str
    vector: Tensor
    coeff: float | None = None
    mode: Mode = "add"
    positions: Positions = None


# ----------------------------------------------------------------------------
# steer
# ----------------------------------------------------------------------------
def _site_shape(model: Any, hook: str) -> tuple[int, ...]:
    """The activation's shape at one position of `hook` (after [batch, pos]), from the config."""
    shape = hook_shape(model.cfg, hook)
    assert shape is not None, hook  # _check_hook refused the hooks with no vector per position
    return shape


def _check_hook(model: Any, hook: Any, caller: str, arg: str = "hook") -> str:
    if not isinstance(hook, str):
        raise TypeError(f"{caller}: {arg} must be a hook name (str), got {type(hook).__name__}")
    if hook not in model.hook_dict:
        raise KeyError(f"{caller}: {arg}: {model._unknown_hook_error(hook).args[0]}")
    if _NO_VECTOR.fullmatch(hook):
        raise ValueError(
            f"{caller}: {arg}={hook!r} holds no vector per position ([batch, head, q_pos, k_pos] or token ids); "
            "steer a hook such as blocks.L.hook_resid_pre, hook_attn_out or attn.hook_z"
        )
    return hook


def _check_vector(model: Any, hook: str, vector: Any, caller: str, arg: str = "vector") -> Tensor:
    """`vector` as a detached float tensor of the hook's per-position shape (refused by name otherwise)."""
    check_type(vector, Tensor, arg, "a tensor", caller)
    if not vector.is_floating_point():
        raise TypeError(f"{caller}: {arg} must be a floating-point tensor, got dtype {vector.dtype}")
    shape = _site_shape(model, hook)
    if tuple(vector.shape) != shape:
        cfg = model.cfg
        raise ValueError(
            f"{caller}: {arg} has shape {tuple(vector.shape)} ({vector.numel()} numbers), but {hook!r} holds "
            f"{list(shape)} per position ({math.prod(shape)} numbers; d_model={cfg.d_model}, n_heads={cfg.n_heads}, "
            f"d_head={cfg.d_head}, d_mlp={cfg.d_mlp})"
        )
    if not bool(torch.isfinite(vector).all()):
        raise ValueError(f"{caller}: {arg} holds non-finite values (nan or inf)")
    return vector.detach()


def _check_positions(positions: Any, n_ctx: int, caller: str) -> list[int] | slice | None:
    """None, a sorted list of absolute positions 0..n_ctx-1, or a slice of non-negative bounds."""
    if positions is None:
        return None
    why = (
        "positions count from the start of the sequence (0 is the first token, a prepended BOS); negative "
        "ones are refused: with a key/value cache each step sees only its new token, so 'the last position' "
        "would mean every generated token there and the prompt's last token in a full pass"
    )
    if isinstance(positions, slice):
        for name in ("start", "stop"):
            bound = getattr(positions, name)
            if bound is not None and check_int(bound, f"positions.{name}", caller) < 0:
                raise ValueError(f"{caller}: positions.{name}={bound!r} is negative; {why}")
        if positions.step is not None and check_int(positions.step, "positions.step", caller) < 1:
            raise ValueError(f"{caller}: positions.step={positions.step!r}: expected a step >= 1")
        return positions
    items = [positions] if not isinstance(positions, (list, tuple, range)) else list(positions)
    if not items:
        raise ValueError(f"{caller}: positions is empty; pass None to steer every position")
    out = []
    for p in items:
        if check_int(p, "positions", caller) < 0:
            raise ValueError(f"{caller}: positions: {p!r} is negative; {why}")
        out.append(check_int_in_range(p, "positions", 0, n_ctx - 1, f"positions (n_ctx={n_ctx})", caller=caller))
    return sorted(set(out))


def _position_mask(positions: list[int] | slice, offset: int, n: int, device: torch.device) -> Tensor:
    """Which of the `n` positions of this pass (absolute offset..offset+n-1) are steered: [n] bool."""
    where = torch.arange(offset, offset + n, device=device)
    if isinstance(positions, slice):
        start, step = positions.start or 0, positions.step or 1
        keep = (where >= start) & ((where - start) % step == 0)
        return keep if positions.stop is None else keep & (where < positions.stop)
    return torch.isin(where, torch.tensor(positions, device=device))


class _Offsets:
    """The number of positions a pass's key/value cache already holds, per thread, read by a torch
    forward pre-hook on the model (hooks see only the new positions' activations)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        cache = kwargs.get("past_kv_cache", args[9] if len(args) > 9 else None)  # forward's 10th argument
        self.local.offset = 0 if cache is None else int(cache.length)

    @property
    def offset(self) -> int:
        return int(getattr(self.local, "offset", 0))


def _steer_fn(
    vector: Tensor, mode: str, coeff: float, positions: list[int] | slice | None, offsets: _Offsets | None
) -> Any:
    """The hook function: x changed along `vector` as `mode` says, at `positions` (None: all)."""
    shape = tuple(vector.shape)
    unit = vector / vector.norm() if mode != "add" else vector
    made: dict[tuple[torch.dtype, torch.device], Tensor] = {}

    def fn(x: Tensor, hook: Any) -> Tensor:
        if tuple(x.shape[2:]) != shape:
            raise ValueError(
                f"steer: {hook.name} has shape {tuple(x.shape)}, the vector {shape} (expected [batch, pos, *vector.shape])"
            )
        key = (x.dtype, x.device)
        if key not in made:
            made[key] = unit.to(dtype=x.dtype, device=x.device)
        u = made[key]
        if mode == "add":
            delta = coeff * u.expand_as(x)
        else:
            along = (x * u).flatten(2).sum(-1).reshape(*x.shape[:2], *[1] * len(shape))  # the component along u
            delta = (coeff - along) * u if mode == "ablate" else -coeff * along * u
        if positions is not None:
            mask = _position_mask(positions, offsets.offset if offsets else 0, x.shape[1], x.device)
            delta = delta * mask.reshape(1, -1, *[1] * len(shape)).to(x.dtype)
        return x + delta

    return fn


@contextmanager
def steer(
    model: Any,
    hook: str | Sequence[Steering],
    vector: Tensor | None = None,
    coeff: float | None = None,
    mode: Mode = "add",
    positions: Positions = None,
) -> Iterator[Any]:
    """Steer `model` at `hook` with `vector` in every forward pass inside the `with` block, `generate`
    (with or without its key/value cache) included; the hooks go when the block exits, also on an error.

    `vector` has the hook's shape at one position: `[d_model]` for the residual stream, attn_out, mlp_out;
    `[n_heads, d_head]` for attn.hook_z / q / k / v; `[d_mlp]` for mlp.hook_pre / hook_post. With
    u = vector / |vector| (over all its numbers) and x the activation at a position:

    - `mode="add"`: x + coeff * vector (coeff defaults to 1);
    - `mode="project_out"`: x - coeff * (x . u) u; coeff defaults to 1, which leaves no component along u;
    - `mode="ablate"`: x + (coeff - x . u) u: the component along u is *set* to coeff, the same number at
      every position (default 0, zero-ablation, the same as project_out; for mean-ablation pass the mean
      of x . u over reference text, e.g. `(cache[hook] @ u).mean()`: `coeff` is a number, a 0-d tensor or a
      numpy scalar; a mean taken over each pass would differ between a full pass and the cache's steps).

    `positions` (default: every position): an int, a list of ints or a slice of non-negative bounds,
    counting the columns of the whole sequence from 0 (a prepended BOS is 0; with the key/value cache
    the positions it holds count, so `slice(n, None)` steers every token generated after an n-token
    prompt, and a cached step and a full pass steer the same tokens). Negative positions are refused (see
    the error). In a batch left-padded by `generate`, a column is a different token of each prompt.

    `hook` may instead be a list of `Steering`s (then leave the other arguments out): applied together,
    in the list's order. Contexts nest; each removes only its own hooks.

    Example:
        >>> v = torch.randn(model.cfg.d_model)
        >>> with steer(model, "blocks.0.hook_resid_post", v, coeff=8.0):
        ...     steered = model.generate("The cat", max_new_tokens=5, do_sample=False)
        >>> plain = model.generate("The cat", max_new_tokens=5, do_sample=False)
        >>> with steer(model, "blocks.1.attn.hook_z", torch.randn(model.cfg.n_heads, model.cfg.d_head), mode="project_out"):
        ...     logits = model("The cat sat")
    """
    caller = "steer"
    if isinstance(hook, str):
        specs = [Steering(hook, vector, coeff, mode, positions)]  # type: ignore[arg-type]
    elif isinstance(hook, (list, tuple)) and hook and all(isinstance(s, Steering) for s in hook):
        if vector is not None or coeff is not None or mode != "add" or positions is not None:
            raise ValueError(
                f"{caller}: given a list of Steering, leave vector, coeff, mode and positions out (each Steering has its own)"
            )
        specs = list(hook)
    else:
        raise TypeError(
            f"{caller}: hook must be a hook name (str) or a non-empty list of Steering, got {type(hook).__name__}"
        )
    fwd: list[tuple[str, Any]] = []
    offsets: _Offsets | None = None
    for i, spec in enumerate(specs):
        where = "" if len(specs) == 1 and isinstance(hook, str) else f"hook[{i}]."
        name = _check_hook(model, spec.hook, caller, f"{where}hook")
        if spec.mode not in _MODES:
            raise ValueError(f"{caller}: {where}mode={spec.mode!r}, expected 'add', 'project_out' or 'ablate'")
        v = _check_vector(model, name, spec.vector, caller, f"{where}vector")
        if spec.mode != "add" and float(v.norm()) == 0.0:
            raise ValueError(f"{caller}: {where}vector is zero: mode={spec.mode!r} needs a direction")
        c: Any = spec.coeff
        c = c.item() if getattr(c, "ndim", None) == 0 else c  # a 0-d tensor or a numpy scalar: its number
        c = _DEFAULT_COEFF[spec.mode] if c is None else check_float(c, f"{where}coeff", -float("inf"), caller=caller)
        pos = _check_positions(spec.positions, model.cfg.n_ctx, caller)
        if pos is not None and offsets is None:
            offsets = _Offsets()
        fwd.append((name, _steer_fn(v, spec.mode, c, pos, offsets)))
    with ExitStack() as stack:
        if offsets is not None:
            handle = model.register_forward_pre_hook(offsets, with_kwargs=True)
            stack.callback(handle.remove)
        stack.enter_context(model.hooks(fwd_hooks=fwd))
        yield model


# ----------------------------------------------------------------------------
# finding a direction
# ----------------------------------------------------------------------------
@torch.no_grad()
def contrastive_vector(
    model: Any,
    pos_prompts: Sequence[str],
    neg_prompts: Sequence[str],
    hook: str,
    position: int = -1,
    batch_size: int = 32,
) -> Tensor:
    """The mean activation at `hook` over `pos_prompts` less that over `neg_prompts` (contrastive
    activation addition), each prompt read at one position: its last real token (`position=-1`), or
    `position` counted in its own tokens (negative from its end). Prompts of unequal length are
    right-padded, `batch_size` at a time, and each is read at its own position, never at a pad.
    Returns the hook's shape at one position (`[d_model]` for the residual stream), ready for `steer`.

    Example:
        >>> v = contrastive_vector(model, ["I love it", "Wonderful"], ["I hate it", "Awful, awful"],
        ...                        "blocks.1.hook_resid_pre")
        >>> v.shape                              # tiny-gpt2's d_model
        torch.Size([128])
    """
    caller = "contrastive_vector"
    hook = _check_hook(model, hook, caller)
    pos = check_str_list(pos_prompts, "pos_prompts", caller, example='["I love this", "Great film"]')
    neg = check_str_list(neg_prompts, "neg_prompts", caller, example='["I hate this", "Awful film"]')
    for arg, prompts in (("pos_prompts", pos), ("neg_prompts", neg)):
        if not prompts:
            raise ValueError(f"{caller}: {arg} is empty; expected at least one prompt")
    position = check_int(position, "position", caller)
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None, caller=caller)
    diff = _mean_at(model, pos, hook, position, batch_size, "pos_prompts") - _mean_at(
        model, neg, hook, position, batch_size, "neg_prompts"
    )
    return diff.to(model.W_E.dtype)


def _mean_at(model: Any, prompts: list[str], hook: str, position: int, batch_size: int, arg: str) -> Tensor:
    """The mean activation at `hook` over `prompts`, each at its own `position` (float64)."""
    total: Tensor | None = None
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        tokens, mask = model.to_tokens(chunk, padding_side="right", return_mask=True)
        lengths = mask.sum(1)
        outside = ((lengths + position < 0) if position < 0 else (lengths <= position)).nonzero()
        if len(outside):
            i = int(outside[0])
            raise ValueError(
                f"contrastive_vector: position={position} is outside {arg}[{start + i}] "
                f"({chunk[i]!r}, {int(lengths[i])} tokens)"
            )
        # The one rule for padded batches (collect_activations' too): each row at its own real token.
        index = real_token_columns(position, mask, "position", "contrastive_vector", arg).to(tokens.device)
        _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=hook)
        acts = cache[hook][torch.arange(len(chunk), device=tokens.device), index]  # [chunk, *site]
        summed = acts.double().sum(0)
        total = summed if total is None else total + summed
    assert total is not None
    return total / len(prompts)


def sae_direction(model: Any, sae: Any, feature: int, resid: bool = True) -> tuple[str, Tensor]:
    """`(hook, vector)` that steer with feature `feature` of `sae`: its decoder row `sae.W_dec[feature]`
    (per unit of activation: a TopK SAE that rescales by the decoder norm divides it by its norm).

    For an SAE on the residual stream (or attn_out, mlp_out ...) that is the row at the SAE's hook. For an
    SAE on `attn.hook_z` (all heads, `reshape_activations="hook_z"`, d_in = n_heads * d_head; or one head,
    `cfg.metadata.hook_head_index`) the row is mapped through the layer's `W_O` to `blocks.L.hook_attn_out`
    `[d_model]`, and for one on `mlp.hook_post` through `W_out` to `blocks.L.hook_mlp_out`; adding it there
    adds exactly what adding the row at the SAE's hook would. With `resid=False` the row stays at the SAE's
    hook in that hook's shape (`[n_heads, d_head]` for hook_z; zero on the other heads of a one-head SAE),
    as it does for an SAE at any other hook (a one-head SAE on hook_q: `[n_heads, d_head]`, zero elsewhere).

    Example:
        >>> hook, v = sae_direction(model, sae, 3)
        >>> hook, v.shape
        ('blocks.1.hook_resid_pre', torch.Size([128]))
        >>> with steer(model, hook, v, coeff=5.0):
        ...     text = model.generate("The cat", max_new_tokens=4, do_sample=False)
    """
    from .sae.saes.splice import check_sae_fits

    caller = "sae_direction"
    name = check_sae_fits(model, sae)
    f = check_index(feature, sae.cfg.d_sae, "feature", "features", caller=caller)
    if not isinstance(resid, bool):
        raise TypeError(f"{caller}: resid must be True or False, got {resid!r}")
    shape = _site_shape(model, name)
    head = None
    if len(shape) == 2 and sae.cfg.reshape_activations != "hook_z":  # an SAE that reads one head
        head = sae.cfg.metadata.get("hook_head_index")
        if head is None:
            raise ValueError(
                f"{caller}: sae reads {name!r} one head at a time (d_in={sae.cfg.d_in}); set "
                f"sae.cfg.metadata.hook_head_index to its head (0..{shape[0] - 1})"
            )
        head = check_index(head, shape[0], "sae.cfg.metadata.hook_head_index", "heads", caller=caller)
    with torch.no_grad():
        row = sae.W_dec[f].detach().to(model.W_E.device, model.W_E.dtype)
        if sae.cfg.architecture == "topk" and sae.cfg.rescale_acts_by_decoder_norm:
            row = row / row.norm()  # decode divides the activation by |W_dec[f]| first
        layer = name.split(".")[1] if name.startswith("blocks.") else ""
        if resid and name.endswith("attn.hook_z"):  # z [n_heads, d_head] -> z.flatten(-2) @ W_O.flatten(0, 1)
            W_O = model.blocks[int(layer)].attn.W_O.detach()  # [n_heads, d_head, d_model]
            return f"blocks.{layer}.hook_attn_out", row @ (W_O.flatten(0, 1) if head is None else W_O[head])
        if resid and name.endswith("mlp.hook_post"):
            return f"blocks.{layer}.hook_mlp_out", row @ model.blocks[int(layer)].mlp.W_out.detach()
        if head is None:
            return name, row.reshape(shape).clone()
        vector = torch.zeros(shape, dtype=row.dtype, device=row.device)
        vector[head] = row
        return name, vector


# ----------------------------------------------------------------------------
# map_direction: processed weights <-> raw weights
# ----------------------------------------------------------------------------
# What the weight processing (interp_gpt.processing) does to each hook's activation, and so to a vector
# steering it, with C = I - 11^T/d (removes the mean over the last axis):
#   resid: hook_embed, hook_pos_embed, hook_resid_*, hook_attn_out, hook_mlp_out and the per-head or
#     MLP copies of the stream before a LayerNorm: center_writing_weights makes them C x. Every reader
#     starts with a LayerNorm, which centres, so adding v and adding C v are one intervention. project_out
#     / ablate read x . u, which the mean changes unless u is mean-zero (then exact).
#   logits: unembed.hook_out; center_unembed subtracts each position's mean logit; log-probs see only C.
#   normalized: ln*.hook_normalized is x_hat on both (before w and b); fold_ln moves w into the readers
#     and centres them (they read C x), so a vector acts as C v on processed weights and as v on raw ones.
#   unembed_in: unembed.hook_in is x_hat * w + b of ln_final on raw weights, x_hat on folded ones (W_U
#     reads C x * w): processed v acts as (C v) * w raw; raw v as v / w processed, if that is mean-zero.
#   value: attn.hook_v / hook_z carry the constant b_V (+ ln1.b @ W_V on raw weights), which
#     fold_value_biases moves into b_O: adding is unchanged; a projection is exact where u is orthogonal
#     to the difference of the two constants.
#   same: hook_q, hook_k, mlp.hook_pre / hook_post, ln*.hook_scale are equal on both: any mode, as is.
_FAMILIES = (
    (
        "resid",
        r"hook_embed|hook_pos_embed|blocks\.\d+\.(hook_resid_(pre|mid|post)|hook_attn_out|hook_mlp_out"
        r"|hook_mlp_in|hook_attn_in|hook_[qkv]_input)",
    ),
    ("logits", r"unembed\.hook_out"),
    ("normalized", r"(blocks\.\d+\.ln[12]|ln_final)\.hook_normalized"),
    ("unembed_in", r"unembed\.hook_in"),
    ("value", r"blocks\.\d+\.attn\.hook_[vz]"),
    ("same", r"blocks\.\d+\.(attn\.hook_[qk]|mlp\.hook_pre|mlp\.hook_post|ln[12]\.hook_scale)|ln_final\.hook_scale"),
)


def _family(hook: str) -> str | None:
    return next((name for name, pattern in _FAMILIES if re.fullmatch(pattern, hook)), None)


def _writers_centred(model: Any) -> bool:
    """center_writing_weights: everything that writes to the residual stream writes mean-zero vectors."""
    writers = [model.embed.W_E, model.pos_embed.W_pos]
    for block in model.blocks:
        writers += [block.attn.W_O, block.attn.b_O]
        if hasattr(block, "mlp"):
            writers += [block.mlp.W_out, block.mlp.b_out]
    return all(is_centred(w) for w in writers)


def _value_constant(model: Any, layer: int) -> Tensor:
    """The constant every attn.hook_v (and so hook_z) of `layer` carries: b_V, plus ln1.b @ W_V where
    ln1 is not folded ([n_heads, d_head], float64)."""
    attn = model.blocks[layer].attn
    const = attn.b_V.detach().double()
    if model.cfg.normalization_type == "LN":
        b = model.blocks[layer].ln1.b.detach().double()
        const = const + torch.einsum("m,hmd->hd", b, attn.W_V.detach().double())
    return const


def _is_centred(v: Tensor, eps: float) -> bool:
    """Mean-zero to the rounding of `v - v.mean()` in a dtype of epsilon `eps` (<= eps * mean|v|), or to 1e-6."""
    tol = torch.maximum(1e-6 * v.abs().amax(-1), 2 * eps * v.abs().mean(-1)).clamp_min(1e-30)
    return bool((v.mean(-1).abs() <= tol).all())


@torch.no_grad()
def map_direction(v: Tensor, from_model: Any, to_model: Any, hook: str, mode: Mode = "add") -> Tensor:
    """The vector that steers `to_model` at `hook` as `v` steers `from_model` (in `mode`), where the two
    hold one checkpoint with different weight processing (`GPT.from_pretrained` processes it:
    fold_ln, center_writing_weights, center_unembed, fold_value_biases; `from_pretrained_no_processing`
    does not). Exact: steering either gives the same log-probs. Where no vector does that, refused by name.

    Read from the models (as interp_gpt.sae.transcoder_processing does): fold_ln where
    `cfg.normalization_type == "LNPre"`, center_writing_weights where every writer to the residual stream
    is mean-zero over d_model, center_unembed where W_U's rows are mean-zero, the value constant b_V (+ ln1.b
    @ W_V). Per hook (C removes the mean over the last axis):

    - residual stream, attn_out, mlp_out, embeddings, logits: add -> `C v` on centred weights, `v` else;
      project_out / ablate -> `v` where the two agree or `v` is mean-zero, else refused;
    - ln1 / ln2 / ln_final.hook_normalized: folded -> raw: `C v`; raw -> folded: `v` if mean-zero, else
      refused; project_out / ablate: `v` if mean-zero (or the same folding), else refused;
    - unembed.hook_in: folded -> raw: `(C v) * ln_final.w`; raw -> folded: `v / ln_final.w` if that is
      mean-zero; project_out / ablate refused where the folding differs (x_hat * w + b is affine);
    - attn.hook_v / hook_z: add -> `v`; project_out / ablate -> `v` where u is orthogonal to the
      difference of the models' value constants, else refused;
    - attn.hook_q / hook_k, mlp.hook_pre / hook_post, ln*.hook_scale (equal on both): `v`;
    - attn.hook_q / k / v / z where the heads are factored differently (refactor_factored_attn_matrices):
      add -> `v @ M` per head (`factored.head_space_map`); project_out / ablate refused;
    - anything else (hook_result, patterns ...): refused unless both models are processed alike.

    Example:
        >>> raw = GPT.from_pretrained_no_processing("tiny-gpt2")
        >>> v = torch.randn(model.cfg.d_model)
        >>> v_raw = map_direction(v, model, raw, "blocks.1.ln2.hook_normalized")   # C v: mean-zero
        >>> float(v_raw.mean()) < 1e-6
        True
    """
    caller = "map_direction"
    # Phase 1: the arguments
    hook, v = _check_map(v, from_model, to_model, hook, mode)
    # Phase 2: the processing each model shows (processed alike, or a hook it leaves alone: v as it is)
    family = _family(hook)
    if re.fullmatch(r"blocks\.\d+\.attn\.hook_[qkvz]", hook):  # the heads' own spaces: are they factored alike?
        moved = carry_head_vector(v, from_model, to_model, hook, mode)
        if moved is not None:
            return moved
    fold = [m.cfg.normalization_type == "LNPre" for m in (from_model, to_model)]
    centred = [m.cfg.normalization_type is not None and _writers_centred(m) for m in (from_model, to_model)]
    unembed = [is_centred(m.W_U) and is_centred(m.b_U) for m in (from_model, to_model)]
    layer = int(hook.split(".")[1]) if hook.startswith("blocks.") else None
    values = (
        [_value_constant(m, layer) for m in (from_model, to_model)] if family == "value" and layer is not None else []
    )
    alike = fold[0] == fold[1] and centred[0] == centred[1] and unembed[0] == unembed[1]
    alike = alike and (not values or torch.allclose(values[0], values[1].to(values[0].device), atol=1e-6))
    if alike or family == "same":
        return v.clone()

    def refuse(why: str) -> ValueError:
        return ValueError(f"{caller}: {hook!r}, mode={mode!r}: {why}; no vector steers to_model the same way")

    # Phase 3: the vector, by the hook's family
    out = v.double().to(from_model.W_E.device)  # beside the weights it is compared with
    eps = max(torch.finfo(t).eps for t in (v.dtype, from_model.W_E.dtype, to_model.W_E.dtype))  # v's rounding
    if family not in ("resid", "logits", "normalized", "unembed_in", "value"):
        raise refuse("only hooks whose activation the processing changes in a known way map (see map_direction's docs)")
    if family != "unembed_in":
        flags = {"resid": centred, "logits": unembed, "normalized": fold}.get(family, [])
        out = _map_family(out, family, mode, flags, values, refuse, eps)
    elif fold[0] != fold[1]:  # unembed_in folded alike: the same activation on both, v as it is
        out = _map_unembed_in(out, mode, fold, to_model if fold[0] else from_model, refuse, eps)
    return out.to(v.device, v.dtype)


def _check_map(v: Any, from_model: Any, to_model: Any, hook: Any, mode: Any) -> tuple[str, Tensor]:
    """`map_direction`'s arguments checked, by name: (the hook, the vector)."""
    caller = "map_direction"
    hook = _check_hook(from_model, hook, caller)
    _check_hook(to_model, hook, caller)
    if mode not in _MODES:
        raise ValueError(f"{caller}: mode={mode!r}, expected 'add', 'project_out' or 'ablate'")
    for field in ("d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab"):
        a, b = getattr(from_model.cfg, field), getattr(to_model.cfg, field)
        if a != b:
            raise ValueError(f"{caller}: from_model has {field}={a}, to_model {field}={b}: not one checkpoint")
    v = _check_vector(from_model, hook, v, caller, "v")
    if mode != "add" and float(v.norm()) == 0.0:
        raise ValueError(f"{caller}: v is zero: mode={mode!r} needs a direction")
    return hook, v


def _map_family(
    out: Tensor, family: str, mode: str, flags: list[bool], values: list[Tensor], refuse: Refuse, eps: float
) -> Tensor:
    """`out` (float64) mapped at a resid / logits (`flags`: centred), normalized (`flags`: folded) or value hook."""
    if family in ("resid", "logits"):
        if mode != "add":
            if flags[0] != flags[1] and not _is_centred(out, eps):
                raise refuse(
                    "the two models' activations here differ by their mean over the last axis (centring), so x . u "
                    "differs unless u is mean-zero; steer with v - v.mean() (on the centred model it is the same)"
                )
        elif flags[1]:
            out = out - out.mean(-1, keepdim=True)
    elif family == "normalized":
        folded_to_raw = flags[0] and not flags[1]
        if mode == "add" and folded_to_raw:
            out = out - out.mean(-1, keepdim=True)
        elif not _is_centred(out, eps) and flags[0] != flags[1]:
            raise refuse(
                "fold_ln centres the weights that read this activation, so on folded weights only v - v.mean() "
                "acts; v has a mean, which the raw model reads and the folded one cannot"
            )
    elif mode != "add":  # value
        diff = (values[0] - values[1].to(values[0].device)).flatten()
        along = float(diff @ (out.flatten() / out.norm()))
        if abs(along) > 1e-5 * max(1.0, float(diff.norm())):
            raise refuse(
                "fold_value_biases moved the constant b_V (+ ln1.b @ W_V) out of this activation, and the "
                f"difference has component {along:.3g} along v, so x . u differs between the models"
            )
    return out


def _map_unembed_in(out: Tensor, mode: str, fold: list[bool], raw: Any, refuse: Refuse, eps: float) -> Tensor:
    """`out` (float64) mapped at unembed.hook_in between a folded and a raw model (`raw`)."""
    if mode != "add":
        raise refuse(
            "the raw model's activation is x_hat * w + b, the folded one's x_hat: a projection does not carry over"
        )
    w = raw.ln_final.w.detach().double().to(out.device)
    if fold[0]:
        return (out - out.mean(-1, keepdim=True)) * w
    if bool((w == 0).any()):
        raise refuse("ln_final.w has zeros, which no vector on the folded model can undo")
    out = out / w
    if not _is_centred(out, eps):
        raise refuse(
            "on folded weights W_U reads (C v) * w, so the raw v must make v / ln_final.w mean-zero, and "
            f"its mean is {float(out.mean()):.3g}"
        )
    return out
