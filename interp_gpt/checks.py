"""The argument checks public functions share: one place, one message style.

Every check raises a `TypeError` or `ValueError` whose message names the argument, the
value it got and what was expected, and returns the value normalised (e.g. a negative
layer counted from the end, a 1-d token tensor given a batch axis).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor


def check_layer(value: Any, n_layers: int, arg: str, allow_end: bool = False) -> int:
    """A layer index in 0..n_layers-1 (or n_layers with `allow_end`); negatives count from the end."""
    hi = n_layers if allow_end else n_layers - 1
    if not isinstance(value, int) or isinstance(value, bool) or not -n_layers <= value <= hi:
        raise ValueError(
            f"{arg}={value!r} is out of range: layers are 0..{n_layers - 1} (negative counts from the end)"
        )
    return value % n_layers if value < 0 else value


def check_int(value: Any, arg: str, low: int | None = None, high: int | None = None) -> int:
    """An int (not a bool) in [low, high], either bound optional."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or (low is not None and value < low)
        or (high is not None and value > high)
    ):
        lo = "" if low is None else f" >= {low}"
        hi = "" if high is None else f" <= {high}"
        raise (TypeError if not isinstance(value, int) or isinstance(value, bool) else ValueError)(
            f"{arg}={value!r}: expected an int{lo}{' and' if lo and hi else ''}{hi}"
        )
    return value


def check_float(value: Any, arg: str, low: float, high: float | None = None, low_open: bool = True) -> float:
    """A real number (int or float, not a bool or a string) above `low` (or from it), up to `high`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{arg}={value!r}: expected a number, got {type(value).__name__}")
    above = value > low if low_open else value >= low
    if not math.isfinite(value) or not above or (high is not None and value > high):
        where = f"{'>' if low_open else '>='} {low}" + ("" if high is None else f" and <= {high}")
        raise ValueError(f"{arg}={value!r}: expected a finite number {where}")
    return float(value)


def check_tokens(
    tokens: Any, n_ctx: int, d_vocab: int, past_len: int = 0, arg: str = "input"
) -> Int[Tensor, "batch posn"]:
    """Token ids `[batch, posn]` (a `[posn]` tensor gains a batch axis), in the vocabulary and the context."""
    if not isinstance(tokens, Tensor):
        raise TypeError(
            f"{arg}: expected a string, a list of strings or a tensor of token ids, got {type(tokens).__name__}"
        )
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(
            f"{arg}: token ids must be an integer tensor, got dtype {tokens.dtype}; "
            "to run from a residual stream, pass start_at_layer"
        )
    # Compare ids as int64: in a small dtype (uint8, int16) the range check itself would wrap.
    tokens = tokens.long()
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise ValueError(f"{arg}: tokens must have shape [batch, posn] or [posn], got shape {tuple(tokens.shape)}")
    if tokens.shape[1] == 0:
        raise ValueError(f"{arg}: got an empty sequence (shape {tuple(tokens.shape)})")
    if tokens.shape[1] + past_len > n_ctx:
        raise ValueError(
            f"{arg}: {tokens.shape[1] + past_len} tokens is longer than the context of {n_ctx} (cfg.n_ctx)"
        )
    bad = (tokens < 0) | (tokens >= d_vocab)
    if bad.any():
        where = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"{arg}: token id {tokens[where].item()} at [batch, posn] = {list(where)} is out of range "
            f"for a vocabulary of {d_vocab} (ids 0..{d_vocab - 1})"
        )
    return tokens


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
