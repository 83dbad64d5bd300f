"""Weights read from their safetensors files on demand (`lazy=True` loading of transcoders).

`map_safetensors(path)` gives a file's tensors backed by a private memory map of it: no page is read until
something touches it, and a write changes only this process's copy, never the file. A lazily loaded module
holds such tensors as its parameters, so it costs (almost) no memory until it computes, and
`file_weight(module, name)` names the file a parameter came from as long as it is unchanged (the same
tensor, not written in place since), so that a reader can take what it needs through a fresh map of its own
(`FileWeight.read`, `FileWeight.rows`) whose pages are given back when it is dropped: attribution reads one
layer's encoder at a time and only the decoder rows of the active features, never keeping a whole set of
weights resident.

Example:
    >>> import torch
    >>> from safetensors.torch import save_file
    >>> save_file({"W": torch.arange(6.0).reshape(3, 2)}, "w.safetensors")
    >>> tensors, _ = map_safetensors("w.safetensors")
    >>> FileWeight("w.safetensors", "W").rows(torch.tensor([2, 0]))
    tensor([[4., 5.],
            [0., 1.]])
"""

from __future__ import annotations

import json
import os
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..checkpoints.sources import CheckpointError

__all__ = ["FileWeight", "MappedState", "file_weight", "map_safetensors", "record_file_weights"]

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_RECORD = "file_weights"  # the module attribute holding {parameter name: (FileWeight, weakref, version)}


def map_safetensors(path: str | os.PathLike[str]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """(tensors, metadata) of a safetensors file, each tensor a view of one private memory map of the file
    (pages read when touched; writes stay in this process); CheckpointError naming the file when its
    header cannot be read."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if not 0 < n <= size - 8:
                raise ValueError(f"a header of {n} bytes in a file of {size}")
            header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None) or {}
        base = 8 + n
        specs = []
        for name, spec in header.items():
            dtype = _DTYPES[spec["dtype"]]
            begin, end = spec["data_offsets"]
            shape = [int(s) for s in spec["shape"]]
            item = torch.empty(0, dtype=dtype).element_size()
            numel = 1
            for s in shape:
                numel *= s
            if end - begin != numel * item or base + end > size:
                raise ValueError(f"tensor {name!r}: offsets {begin}..{end} do not hold {shape} {dtype}")
            specs.append((name, dtype, shape, base + begin, item))
        storage = torch.UntypedStorage.from_file(str(p), shared=False, nbytes=size)
    except (OSError, ValueError, KeyError, TypeError, struct.error, RuntimeError) as e:
        raise CheckpointError(f"{p}: not a readable safetensors file ({e})") from e
    out = {}
    for name, dtype, shape, start, item in specs:
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        if start % item:  # not aligned for a view: a copy of its bytes (safetensors aligns them)
            n = int(torch.Size(shape).numel()) * item
            raw = torch.empty(0, dtype=torch.uint8).set_(storage, start, (n,), (1,))  # type: ignore[call-overload, arg-type]
            out[name] = raw.clone().view(dtype).reshape(shape)
        else:
            view = torch.empty(0, dtype=dtype).set_(storage, start // item, shape, strides)  # type: ignore[call-overload, arg-type]
            out[name] = view
    return out, dict(meta)


@dataclass(frozen=True)
class FileWeight:
    """Where a module's parameter lives on disk: tensor `name` of the safetensors file `path`, the
    parameter being its transpose when `transposed` (circuit-tracer's `[d_sae, d_in]` encoders)."""

    path: str | os.PathLike[str]
    name: str
    transposed: bool = False

    def _mapped(self) -> Tensor:
        return map_safetensors(self.path)[0][self.name]

    def read(self) -> Tensor:
        """The whole parameter, contiguous as an eager load holds it (a copy where the file holds its
        transpose, else a fresh map: its pages are read as it is used and given back when it is dropped)."""
        t = self._mapped()
        return t.T.contiguous() if self.transposed and t.ndim == 2 else t

    def rows(self, index: Tensor) -> Tensor:
        """`parameter[index]`, read from the file (only the pages holding those rows when not transposed)."""
        t = self._mapped()
        return (t[:, index].T if self.transposed else t[index]).clone()

    def check_finite(self, where: str | os.PathLike[str], block: int = 4096) -> None:
        """Refuse non-finite (or non-float) values by name, read a block of rows at a time through a fresh
        map (dropped afterwards: the pages are not kept)."""
        t = self._mapped()
        flat = t.reshape(t.shape[0], -1) if t.ndim > 1 else t.reshape(-1, 1)
        for start in range(0, flat.shape[0], block):
            if not t.is_floating_point() or not bool(torch.isfinite(flat[start : start + block]).all()):
                raise CheckpointError(f"{where}: tensor {self.name!r} holds non-finite (or non-float) values")

    def columns(self, index: Tensor) -> Tensor:
        """`parameter[:, index]` (only the pages holding them when transposed: the file's rows)."""
        t = self._mapped()
        return (t[index].T if self.transposed else t[:, index]).clone()


class MappedState(dict[str, Tensor]):
    """A state dict some of whose tensors are maps of their files (`files`: parameter name -> FileWeight)."""

    def __init__(self, state: dict[str, Tensor], files: dict[str, FileWeight]):
        super().__init__(state)
        self.files = {k: v for k, v in files.items() if k in state}


def record_file_weights(module: nn.Module, state: dict[str, Tensor]) -> None:
    """Note which of `module`'s parameters are, as they stand now, the file tensors of `state` (a
    `MappedState` it was built from with assign=True; a parameter cast or copied since is not noted)."""
    for name, where in getattr(state, "files", {}).items():
        param, mapped = module.get_parameter(name), state[name]
        if param.data_ptr() == mapped.data_ptr() and param.stride() == mapped.stride():
            module.__dict__.setdefault(_RECORD, {})[name] = (where, weakref.ref(param), param._version)


def file_weight(module: Any, name: str) -> FileWeight | None:
    """The file `module`'s parameter `name` can be read from: None unless it was loaded lazily and is
    still the same tensor, unchanged (a new tensor, or an in-place change torch counts, reads from memory)."""
    record = getattr(module, "__dict__", {}).get(_RECORD, {}).get(name)
    if record is None:
        return None
    where, ref, version = record
    try:
        param = module.get_parameter(name)
    except AttributeError:
        return None
    return where if ref() is param and param._version == version else None  # type: ignore[no-any-return]
