"""One shard as the bytes of its safetensors file, filled in place as the activations arrive.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's
dtype, shape and byte range, and `__metadata__`), then the tensors' bytes back to back. The
shard's size is known before its first row, so the store allocates the whole file once and
writes each forward pass's rows straight to their final place, already permuted: no copy to
shuffle, none to serialise. Tensors are laid out as safetensors' own writer does (int64, float64,
float32, int32, bfloat16, float16; then by name): widest first, so every tensor starts aligned
without padding, and the file is byte for byte what `safetensors.torch.save` would write.

    >>> shard = ShardBuffer({"x": (torch.float32, (128,))}, rows=4096, perm=torch.randperm(4096))
    >>> shard.add({"x": acts})                 # acts [n, 128], rows in data order
    >>> digest = hashlib.sha256(shard.view()).hexdigest()
"""

from __future__ import annotations

import json

import torch
from torch import Tensor

__all__ = ["ShardBuffer"]

# In the order safetensors' own writer lays tensors out (its dtype enum, descending; then by name),
# which is also widest first: the files come out byte for byte as `safetensors.torch.save` makes them.
_CODES = {
    torch.int64: "I64",
    torch.float64: "F64",
    torch.float32: "F32",
    torch.int32: "I32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
}
_RANK = {dtype: i for i, dtype in enumerate(_CODES)}


class ShardBuffer:
    """`rows` rows of each column `name -> (dtype, trailing shape)`; with `perm`, data-order row
    `perm[j]` lands at row `j` (the file holds `rows_in_data_order[perm]`)."""

    def __init__(
        self,
        columns: dict[str, tuple[torch.dtype, tuple[int, ...]]],
        rows: int,
        perm: Tensor | None = None,
        metadata: dict[str, str] | None = None,
        buf: Tensor | None = None,
    ) -> None:
        self.columns, self.rows, self.metadata = columns, rows, dict(metadata or {})
        order = sorted(columns, key=lambda k: (_RANK[columns[k][0]], k))
        header: dict[str, object] = {"__metadata__": self.metadata} if self.metadata else {}
        sizes, start = {}, 0
        for name in order:
            dtype, shape = columns[name]
            n_bytes = rows * dtype.itemsize
            for d in shape:
                n_bytes *= d
            header[name] = {"dtype": _CODES[dtype], "shape": [rows, *shape], "data_offsets": [start, start + n_bytes]}
            sizes[name] = (start, start + n_bytes)
            start += n_bytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        base = 8 + len(text)
        size = base + start  # reuse `buf` (a spent shard's bytes) when it is the right size: no fresh pages
        ok = buf is not None and buf.dtype == torch.uint8 and buf.numel() == size
        self.buf = buf if ok and buf is not None else torch.empty(size, dtype=torch.uint8)
        self.buf[:8] = torch.frombuffer(bytearray(len(text).to_bytes(8, "little")), dtype=torch.uint8)
        self.buf[8:base] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        self.views = {
            name: self.buf[base + a : base + b].view(columns[name][0]).view(rows, *columns[name][1])
            for name, (a, b) in sizes.items()
        }
        self.perm = perm
        self.dest: Tensor | None = None
        if perm is not None:  # where each data-order row goes
            self.dest = torch.empty_like(perm)
            self.dest[perm] = torch.arange(rows)
        self.n = 0

    def add(self, cols: dict[str, Tensor]) -> None:
        """Append rows `[k, ...]` of every column (in data order)."""
        k = next(iter(cols.values())).shape[0]
        if self.n + k > self.rows:
            raise ValueError(f"ShardBuffer.add: {self.n} + {k} rows exceed the shard's {self.rows}")
        for name, t in cols.items():
            v = self.views[name]
            t = t.to(device="cpu", dtype=v.dtype)
            if self.dest is None:
                v[self.n : self.n + k] = t
            else:
                v.index_copy_(0, self.dest[self.n : self.n + k], t)
        self.n += k

    def in_data_order(self) -> dict[str, Tensor]:
        """The rows added so far, in the order they came."""
        if self.dest is None:
            return {name: v[: self.n] for name, v in self.views.items()}
        return {name: v[self.dest[: self.n]] for name, v in self.views.items()}

    def view(self) -> memoryview:
        """The whole file's bytes (no copy); the shard must be full."""
        if self.n != self.rows:
            raise ValueError(f"ShardBuffer.view: {self.n} of {self.rows} rows filled")
        return memoryview(self.buf.numpy())  # type: ignore[arg-type]  # numpy arrays are buffers
