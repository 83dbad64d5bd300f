"""transformer-lens' `Slice`: one way to pick positions (or prompts, or neurons) along an axis.

Every `pos_slice`, `batch_slice` and `neuron_slice` argument (the cache's decompositions,
`run_with_cache(pos_slice=...)`, `apply_slice_to_batch_dim`) takes what transformer-lens'
`Slice` takes, and a `Slice` itself (ours, or transformer-lens' own: anything with `.apply`
and `.slice`):

    None            everything (the axis is kept)
    int             one index (the axis is dropped)
    (stop,) / (start, stop) / (start, stop, step)    slice(*tuple)
    slice           as it is
    list / tensor / numpy array    those indices (or a boolean mask)
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np
import torch
from torch import Tensor

from .checks import check_int

__all__ = ["SliceInput", "Slice", "is_slice_object", "slice_index", "take", "keep_axis"]

# What a slice argument accepts (transformer-lens' SliceInput).
SliceInput = Union[None, int, tuple, list, slice, Tensor, np.ndarray]


class Slice:
    """A slice of one axis, as transformer-lens' `utils.Slice` (same modes, `apply`, `indices`).

    Example:
        >>> Slice(-1).apply(torch.arange(6).reshape(2, 3), dim=1)       # an int drops the axis
        tensor([2, 5])
        >>> Slice((0, 3, 2)).indices(10)
        array([0, 2])
    """

    slice: int | slice | np.ndarray
    mode: str

    def __init__(self, input_slice: SliceInput = None) -> None:
        if isinstance(input_slice, Slice):
            self.slice, self.mode = input_slice.slice, input_slice.mode
            return
        idx = slice_index(input_slice, "input_slice")
        if input_slice is None:
            self.slice, self.mode = slice(None), "identity"
        elif isinstance(idx, int):
            self.slice, self.mode = idx, "int"
        elif isinstance(idx, slice):
            self.slice, self.mode = idx, "slice"
        else:
            self.slice, self.mode = idx.cpu().numpy(), "array"

    def apply(self, tensor: Tensor, dim: int = 0) -> Tensor:
        """`tensor` sliced along axis `dim` (negative counts from the end)."""
        return take(tensor, slice_index(self, "slice"), dim)

    def indices(self, max_ctx: int | None = None) -> np.ndarray:
        """The indices this slice picks from an axis of `max_ctx` entries (an int slice needs none)."""
        if self.mode == "int":
            return np.array([self.slice], dtype=np.int64)
        if max_ctx is None:
            raise ValueError(f"Slice.indices: max_ctx is needed for a slice in mode {self.mode!r} (not 'int')")
        return np.arange(max_ctx, dtype=np.int64)[self.slice]

    @classmethod
    def unwrap(cls, slice_input: Any) -> Slice:
        """`slice_input` as a Slice; a bare int becomes `[int]`, which keeps the axis (as transformer-lens)."""
        if is_slice_object(slice_input):
            return slice_input if isinstance(slice_input, Slice) else cls(slice_index(slice_input, "slice"))
        idx = slice_index(slice_input, "slice")
        return cls([idx] if isinstance(idx, int) else slice_input)

    def __repr__(self) -> str:
        return f"Slice: {self.slice} Mode: {self.mode} "


def is_slice_object(s: Any) -> bool:
    """Ours or transformer-lens' Slice (duck-typed: `.apply` and `.slice`)."""
    return hasattr(s, "apply") and hasattr(s, "slice")


def slice_index(s: Any, arg: str) -> int | slice | Tensor:
    """What to index one axis with, for any slice input (a bad one: a TypeError naming `arg`)."""
    if is_slice_object(s):
        s = s.slice
    if s is None:
        return slice(None)
    if isinstance(s, slice):
        return s
    if isinstance(s, tuple):  # (stop,), (start, stop) or (start, stop, step), as Python's slice()
        if not 1 <= len(s) <= 3:
            raise ValueError(f"{arg}={s!r}: a tuple means slice(*tuple), so it needs 1 to 3 entries")
        return slice(*s)
    if isinstance(s, np.integer) or (
        isinstance(s, Tensor) and s.ndim == 0 and s.dtype != torch.bool and not s.is_floating_point()
    ):
        s = int(s)  # a numpy or 0-d tensor int indexes as an int (as transformer-lens 4 reads it)
    if isinstance(s, (Tensor, list)) or hasattr(s, "__array__"):  # indices (or a mask); numpy too
        idx = torch.as_tensor(s)
        if idx.is_floating_point():
            raise TypeError(f"{arg}: indices must be integers (or a boolean mask), got dtype {idx.dtype}")
        return idx
    try:
        return check_int(s, arg)
    except TypeError:
        raise TypeError(
            f"{arg}={s!r}: expected None, an int, a slice, a (start, stop[, step]) tuple, a list / tensor of "
            "indices, or a Slice"
        ) from None


def take(t: Tensor, idx: int | slice | Tensor, dim: int) -> Tensor:
    """`t` indexed with `idx` along axis `dim` (negative counts from the end)."""
    if isinstance(idx, Tensor):
        idx = idx.to(t.device)
    return t[(slice(None),) * (dim % t.ndim) + (idx,)]


def keep_axis(idx: int | slice | Tensor) -> slice | Tensor:
    """A single index as a one-element index list, so that taking it keeps the axis."""
    if isinstance(idx, int):
        return torch.tensor([idx])
    return idx.reshape(1) if isinstance(idx, Tensor) and idx.ndim == 0 else idx
