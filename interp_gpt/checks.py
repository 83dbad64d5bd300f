"""The argument checks the public functions share: one message style, one place.

Every check raises with a message that names the argument, the value and what was expected:

    batch=5 is out of range: the cache's 2 prompts are 0..1 (negative counts from the end)
    tokens has shape (2, 6), expected [2, 7] ([batch, pos] of the cached patterns)
    answer: token id 50300 is out of range for a vocabulary of 50257 (ids 0..50256)
    cache must be an ActivationCache (from model.run_with_cache), got Tensor

`caller`, where given, names the public function first ("logit_lens: batch=5 is out of
range: ..."), so a message read at the end of a long traceback still says where it came from.
Wrong types raise `TypeError`, wrong values `ValueError`, a missing cached activation `KeyError`.

This module sits at the bottom of the package: it imports nothing from `interp_gpt`, so the
model, the cache and everything above them can use it. The model and cache arguments of
`check_answer_tokens` and `cached_activation` are duck-typed for the same reason.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from jaxtyping import Float, Int
from torch import Tensor

__all__ = [
    "check_int",
    "check_seed",
    "check_int_in_range",
    "check_index",
    "check_layer",
    "check_float",
    "check_type",
    "check_callable",
    "check_str_list",
    "check_integer_tensor",
    "check_rank",
    "check_shape",
    "check_token_ids",
    "check_tokens",
    "check_mask",
    "check_resid",
    "check_answer_tokens",
    "cached_activation",
]

T = TypeVar("T")


def _where(caller: str | None) -> str:
    return f"{caller}: " if caller else ""


# ----------------------------------------------------------------------------
# numbers: an int, an int in a range, an index into an axis
# ----------------------------------------------------------------------------
def check_int(value: Any, arg: str, caller: str | None = None) -> int:
    """`value` as an int (a Python int, a numpy int or a 0-d integer tensor; never a bool)."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{_where(caller)}{arg} must be an int, got {type(value).__name__} ({value!r})")


def check_int_in_range(
    value: Any, arg: str, low: int, high: int | None, what: str | None = None, *, caller: str | None = None
) -> int:
    """`value` as an int in `low..high` (both included; `high=None`: no upper bound).

    `what` names the values in the message: `check_int_in_range(12, "layer", 0, 11, "layers")`
    says "layer=12 is out of range: layers are 0..11".
    """
    value = check_int(value, arg, caller)
    if low <= value and (high is None or value <= high):
        return value
    if high is None:
        allowed = f"{what} must be >= {low}" if what else f"expected an int >= {low}"
    else:
        allowed = f"{what} are {low}..{high}" if what else f"expected {low}..{high}"
    raise ValueError(f"{_where(caller)}{arg}={value!r} is out of range: {allowed}")


def check_seed(value: Any, arg: str = "seed", caller: str | None = None, high: int = 2**63 - 1) -> int:
    """A random seed: an int (Python, numpy or a 0-d integer tensor; never a bool) in 0..`high`, checked before
    any work so that a bad seed never fails a run midway. torch takes seeds below 2**64, numpy's generators
    any non-negative int, its legacy RandomState below 2**32 (pass `high=2**32 - 1`): the default, 2**63 - 1,
    fits torch and `numpy.random.default_rng` both.

    Example:
        >>> check_seed(0), check_seed(torch.tensor(7))
        (0, 7)
    """
    return check_int_in_range(value, arg, 0, high, "seeds", caller=caller)


def check_index(value: Any, size: int, arg: str, what: str, *, caller: str | None = None) -> int:
    """`value` as an index into an axis of `size` entries, negative counting from the end; returns 0..size-1.

    Example:
        >>> check_index(-1, 12, "layer", "layers")
        11
        >>> check_index(12, 12, "layer", "layers")     # ValueError: layer=12 is out of range: layers are 0..11 ...
    """
    value = check_int(value, arg, caller)
    if not -size <= value < size:
        raise ValueError(
            f"{_where(caller)}{arg}={value!r} is out of range: {what} are 0..{size - 1} (negative counts from the end)"
        )
    return value % size


def check_layer(value: Any, n_layers: int, arg: str, allow_end: bool = False) -> int:
    """A layer index 0..n_layers-1, negative counting from the end; with `allow_end` also
    n_layers itself (the end of the model, for start_at_layer / stop_at_layer)."""
    if allow_end and check_int(value, arg) == n_layers:
        return n_layers
    return check_index(value, n_layers, arg, "layers")


def check_float(value: Any, arg: str, low: float, high: float | None = None, caller: str | None = None) -> float:
    """A finite real number (an int or a float, never a bool or a string) above `low`, up to `high`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{_where(caller)}{arg} must be a number, got {type(value).__name__} ({value!r})")
    if not math.isfinite(value) or not value > low or (high is not None and value > high):
        allowed = f"> {low}" + ("" if high is None else f" and <= {high}")
        raise ValueError(f"{_where(caller)}{arg}={value!r} is out of range: expected a finite number {allowed}")
    return float(value)


# ----------------------------------------------------------------------------
# types
# ----------------------------------------------------------------------------
def check_type(value: Any, cls: type[T], arg: str, expected: str, caller: str | None = None) -> T:
    """`value` itself if it is an instance of `cls`; `expected` says what in words ("a GPT")."""
    if not isinstance(value, cls):
        raise TypeError(f"{_where(caller)}{arg} must be {expected}, got {type(value).__name__}")
    return value


def check_callable(value: Any, arg: str, expected: str = "a function", caller: str | None = None) -> Any:
    """`value` itself if it can be called."""
    if not callable(value):
        raise TypeError(f"{_where(caller)}{arg} must be {expected}, got {type(value).__name__}")
    return value


def check_str_list(value: Any, arg: str, caller: str | None = None, example: str | None = None) -> list[str]:
    """A sequence of strings (not one string) as a list; `example` shows where one comes from."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        hint = f" (e.g. {example})" if example else ""
        raise TypeError(f"{_where(caller)}{arg} must be a list of strings{hint}, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise TypeError(f"{_where(caller)}{arg}[{i}] must be a str, got {type(item).__name__} ({item!r})")
    return list(value)


# ----------------------------------------------------------------------------
# tensors
# ----------------------------------------------------------------------------
def check_integer_tensor(t: Tensor, arg: str, caller: str | None = None, hint: str | None = None) -> Tensor:
    """`t` itself if its dtype is an integer one (token ids, indices); not float, complex or bool."""
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        extra = f"; {hint}" if hint else ""
        raise TypeError(f"{_where(caller)}{arg} must hold integer token ids, got dtype {t.dtype}{extra}")
    return t


def _or_list(items: Sequence[int]) -> str:
    words = [str(x) for x in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def check_rank(t: Tensor, ranks: Sequence[int], arg: str, what: str, caller: str | None = None) -> Tensor:
    """`t` itself if it has one of `ranks` axes; `what` spells out the layouts ("[q_pos, k_pos] or ...")."""
    if t.ndim not in ranks:
        raise ValueError(
            f"{_where(caller)}{arg} must have rank {_or_list(ranks)} ({what}), "
            f"got rank {t.ndim} (shape {tuple(t.shape)})"
        )
    return t


def check_shape(t: Tensor, shape: Sequence[int], arg: str, what: str, caller: str | None = None) -> Tensor:
    """`t` itself if its shape is `shape`; `what` says where that shape comes from."""
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{_where(caller)}{arg} has shape {tuple(t.shape)}, expected {list(shape)} ({what})")
    return t


# ----------------------------------------------------------------------------
# token ids
# ----------------------------------------------------------------------------
def check_token_ids(ids: Tensor, d_vocab: int, arg: str, caller: str | None = None, axes: str | None = None) -> Tensor:
    """`ids` itself if every id is in 0..d_vocab-1. `axes` ("batch, posn") names the axes in
    the message, which then says where the first bad id sits."""
    bad = (ids < 0) | (ids >= d_vocab)
    if bool(bad.any()):
        where = tuple(bad.nonzero()[0].tolist()) if ids.ndim else ()
        at = f" at [{axes}] = {list(where)}" if axes and ids.ndim else ""
        raise ValueError(
            f"{_where(caller)}{arg}: token id {ids[where].item()}{at} is out of range for a vocabulary of "
            f"{d_vocab} (ids 0..{d_vocab - 1})"
        )
    return ids


def check_tokens(
    tokens: Any,
    d_vocab: int,
    n_ctx: int,
    arg: str = "tokens",
    past_len: int = 0,
    caller: str | None = None,
    expected: str = "a tensor of token ids",
) -> Int[Tensor, "batch posn"]:
    """Token ids `[batch, posn]` (a `[posn]` tensor gets a batch axis) that a model with this
    vocabulary and context can run, `past_len` positions already cached. `expected` says what
    else the caller would have taken ("a string, a list of strings or a tensor of token ids")."""
    tokens = check_type(tokens, Tensor, arg, expected, caller)
    check_integer_tensor(tokens, arg, caller, hint="to run from a residual stream, pass start_at_layer")
    check_rank(tokens, (1, 2), arg, "[posn] for one prompt, or [batch, posn]", caller)
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.shape[1] == 0:
        raise ValueError(f"{_where(caller)}{arg}: got an empty sequence (shape {tuple(tokens.shape)})")
    if tokens.shape[1] + past_len > n_ctx:
        raise ValueError(
            f"{_where(caller)}{arg}: {tokens.shape[1] + past_len} tokens is longer than the context of {n_ctx} "
            "(cfg.n_ctx)"
        )
    # Compared as int64: in a small dtype (uint8, int16) the range check itself would wrap.
    return check_token_ids(tokens.long(), d_vocab, arg, caller, axes="batch, posn")


def check_mask(attention_mask: Any, shape: tuple[int, ...]) -> Int[Tensor, "batch posn"]:
    """An attention mask `[batch, posn]` of 1 (a real token) and 0 (padding), integer or bool.

    Anything else is refused: positions are counted from the mask, so a 2 or a -1 would shift
    every position embedding and change every logit without a word. Returned as int64."""
    if not isinstance(attention_mask, Tensor) or attention_mask.shape != shape:
        got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask: expected shape {tuple(shape)} (batch, posn), got {got}")
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise TypeError(
            f"attention_mask: expected an integer or bool tensor of 0s and 1s, got dtype {attention_mask.dtype} "
            "(convert with .long() if it holds 0.0 / 1.0)"
        )
    mask = attention_mask.long()
    bad = (mask != 0) & (mask != 1)
    if bad.any():
        where = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"attention_mask: value {mask[where].item()} at [batch, posn] = {list(where)}; "
            "expected only 1 (a real token) and 0 (padding)"
        )
    return mask


def check_resid(
    resid: Any, d_model: int, arg: str, dtype: torch.dtype | None = None
) -> Float[Tensor, "batch posn d_model"]:
    """A residual stream: a floating-point tensor `[batch, posn, d_model]` (of `dtype`, if given)."""
    if not isinstance(resid, Tensor) or not resid.is_floating_point() or resid.ndim != 3 or resid.shape[-1] != d_model:
        got = f"shape {tuple(resid.shape)}, dtype {resid.dtype}" if isinstance(resid, Tensor) else type(resid).__name__
        raise ValueError(f"{arg}: expected a residual stream [batch, posn, d_model={d_model}] of floats, got {got}")
    if dtype is not None and resid.dtype != dtype:
        raise TypeError(f"{arg}: the residual stream is {resid.dtype}, the model's weights are {dtype}; convert it")
    return resid


def check_answer_tokens(model: Any, tokens: Any, n_batch: int, arg: str, caller: str | None = None) -> Tensor:
    """One token id per prompt `[n_batch]`, from an id, a single-token string (read with
    `model.to_single_token`), or one of those per prompt; one given for all is repeated."""
    if isinstance(tokens, Tensor):
        ids = check_integer_tensor(tokens, arg, caller).flatten().tolist()
    elif isinstance(tokens, (str, int)) and not isinstance(tokens, bool):
        ids = [tokens]
    elif isinstance(tokens, Sequence):
        ids = list(tokens)
    else:
        raise TypeError(
            f"{_where(caller)}{arg} must be a token id, a single-token string, or one per prompt; "
            f"got {type(tokens).__name__}"
        )
    for i, t in enumerate(ids):
        if isinstance(t, str):
            ids[i] = model.to_single_token(t)
        elif isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"{_where(caller)}{arg} entries must be ids or strings, got {t!r}")
    if len(ids) == 1:
        ids = ids * n_batch
    if len(ids) != n_batch:
        raise ValueError(f"{_where(caller)}{arg} gives {len(ids)} tokens for a batch of {n_batch} prompts")
    return check_token_ids(torch.tensor(ids, dtype=torch.long), model.cfg.d_vocab, arg, caller)


# ----------------------------------------------------------------------------
# caches
# ----------------------------------------------------------------------------
def cached_activation(cache: Any, name: str, caller: str | None = None) -> Tensor:
    """The activation `name` of an ActivationCache, with the batch axis always present."""
    if name not in cache.cache_dict:
        raise KeyError(
            f"{_where(caller)}the cache holds no {name!r}; run model.run_with_cache without "
            f"names_filter, or with one that keeps {name!r}"
        )
    t = cache.cache_dict[name]
    return t if cache.has_batch_dim else t[None]


# ----------------------------------------------------------------------------
# circuits (and attribution patching): a metric's gradient
# ----------------------------------------------------------------------------
__all__ += ["callable_name", "check_gradient_reached", "gradient_reached", "zero_gradient_error"]


def callable_name(fn: Any) -> str:
    """A user function's name for a message: its `__name__`, a partial's function's, or its repr."""
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and callable(inner):
        return f"partial({callable_name(inner)})"
    name = getattr(fn, "__name__", None)
    return str(name) if name else repr(fn)


def zero_gradient_error(arg: str, fn: Any, caller: str, where: str) -> ValueError:
    """The error for a metric `fn` whose backward gave no non-zero gradient at any `where`."""
    return ValueError(
        f"{caller}: {arg} {callable_name(fn)} has a zero gradient at every {where}, so every score would be 0; "
        "a metric built from a step function (sign, round, floor, a comparison) is flat almost everywhere: "
        "use a smooth one (a logit difference, a log-probability) or exact patching"
    )


def check_gradient_reached(grads: Sequence[Tensor | None], arg: str, fn: Any, caller: str, where: str) -> None:
    """Refuse a backward of the metric `fn` that gave no non-zero gradient at any of `grads`
    (`where` says what they are): a metric built from a step function (sign, round, floor, a
    comparison) keeps requires_grad but its gradient is 0 everywhere, so every attribution would be 0."""
    if not gradient_reached(grads):
        raise zero_gradient_error(arg, fn, caller, where)


def gradient_reached(grads: Sequence[Tensor | None]) -> bool:
    """Whether any of `grads` (from `torch.autograd.grad(..., allow_unused=True)`) is non-zero somewhere."""
    return any(g is not None and bool(g.ne(0).any()) for g in grads)


# ----------------------------------------------------------------------------
# the command line: bad input as one line
# ----------------------------------------------------------------------------
__all__ += ["BAD_INPUT", "error_line"]

# What a command reports as bad input (one line, exit status 2): a wrong value, type or name, a file.
BAD_INPUT = (OSError, ValueError, TypeError, KeyError)


def error_line(e: BaseException) -> str:
    """`e`'s message on one line, as the command line prints it (a KeyError's unquoted: str() quotes it)."""
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return " ".join(text.split())


__all__ += ["check_text_files"]


def check_text_files(paths: Any, arg: str) -> list[Any]:
    """The text files `paths` names, in order: one path or several, each a file (taken as it is) or a
    folder (its `.txt` files, in sorted order, subfolders included). The one rule of every command's
    `--data` and of the library functions that read a corpus.

    Example:
        >>> check_text_files(["data/corpus"], "--data")
        [PosixPath('data/corpus/tinyshakespeare_input.txt'), PosixPath('data/corpus/warpeace_input.txt')]
    """
    from pathlib import Path

    many = isinstance(paths, (list, tuple))
    items = list(paths) if many else [paths]
    if not items or not all(isinstance(p, (str, Path)) for p in items):
        raise TypeError(f"{arg}: expected a path or a list of paths (files or folders of .txt files), got {paths!r}")
    files: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.txt") if p.is_file())
            if not found:
                raise ValueError(f"{arg} {str(item)!r}: the folder holds no .txt file")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(
                f"{arg} {str(item)!r}: no such file or folder (expected a text file or a folder of .txt files)"
            )
    return files


# ----------------------------------------------------------------------------------------------
# Whether weights are centred (mean-zero), at the precision they hold
# ----------------------------------------------------------------------------------------------
__all__ += ["held_eps", "is_centred"]

# The precisions a tensor's values may hold fewer digits of than its dtype (a model cast up after processing).
_NARROWER = (torch.bfloat16, torch.float16, torch.float32)


def held_eps(rows: Tensor) -> float:
    """The machine epsilon of the precision `rows` hold: the coarsest of bfloat16, float16 and float32
    holding every value exactly (a float32 model cast to float64 holds float32's digits), else its dtype's.

    Example:
        >>> held_eps(torch.randn(3, 4).double())  # float32's values in float64
        1.1920928955078125e-07
    """
    if not rows.is_floating_point():
        return 0.0
    own = torch.finfo(rows.dtype).eps
    held = [d for d in _NARROWER if torch.finfo(d).eps > own]
    # a few rows first: a precision that loses one of their values is out without reading the rest
    for i, j in [(0, 8), *((i, i + 4096) for i in range(8, rows.shape[0], 4096))]:
        if not held:
            break
        r = rows[i:j]
        held = [d for d in held if bool((r.to(d).to(r.dtype) == r).all())]
    return max([own] + [torch.finfo(d).eps for d in held])


def is_centred(t: Tensor, dim: int = -1) -> bool:
    """Whether `t` is mean-zero along `dim` to the rounding of the precision it holds (what centring in
    float64 then storing leaves; a model processed in float32 and cast to float64 is judged at float32's).
    How a model's weights show center_writing_weights / center_unembed. A few thousand rows at a time in
    float64 (W_E is 50,257 rows: no float64 copy of it).

    Example:
        >>> is_centred(model.W_U)  # GPT.from_pretrained centres the unembedding
        True
    """
    rows = t.detach().movedim(dim, -1).reshape(-1, t.shape[dim])
    eps = held_eps(rows)
    for i in range(0, rows.shape[0], 4096):
        r = rows[i : i + 4096].double()
        tol = 4 * eps * r.abs().amax(-1).clamp_min(torch.finfo(torch.float64).tiny)
        if not bool((r.mean(-1).abs() <= tol).all()):
            return False
    return True
