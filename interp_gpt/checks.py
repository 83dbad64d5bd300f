"""The argument checks public functions share: one place, one message style.

Every check raises a `TypeError` or `ValueError` whose message names the argument, the
value it got and what was expected, and returns the value normalised (e.g. a negative
layer counted from the end, a 1-d token tensor given a batch axis).
"""

from __future__ import annotations

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


def check_mask(attention_mask: Any, shape: tuple[int, ...]) -> Tensor:
    """An attention mask of shape `[batch, posn]` (1 for real tokens, 0 for padding)."""
    if not isinstance(attention_mask, Tensor) or attention_mask.shape != shape:
        got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask: expected shape {tuple(shape)} (batch, posn), got {got}")
    return attention_mask


def check_resid(resid: Any, d_model: int, arg: str) -> Float[Tensor, "batch posn d_model"]:
    """A residual stream: a floating-point tensor `[batch, posn, d_model]`."""
    if not isinstance(resid, Tensor) or not resid.is_floating_point() or resid.ndim != 3 or resid.shape[-1] != d_model:
        got = f"shape {tuple(resid.shape)}, dtype {resid.dtype}" if isinstance(resid, Tensor) else type(resid).__name__
        raise ValueError(f"{arg}: expected a residual stream [batch, posn, d_model={d_model}] of floats, got {got}")
    return resid
