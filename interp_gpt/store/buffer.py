"""A mixing buffer of bounded memory: rows go in in data order and come out mixed.

The buffer holds at most `capacity` rows per hook, in tensors allocated once. With `shuffle`,
each batch taken out is `n` rows drawn uniformly (seeded) from everything in the buffer; the
holes they leave are filled with rows from the end, so nothing is copied but the batch. The
owner refills it whenever it falls to half full, so a row leaves on average after about
`capacity / 2` later rows came in (sae-lens' mixing buffer serves half of a full, shuffled
buffer and keeps the other half for the same reason). Without `shuffle` rows leave in the
order they came.

    >>> buf = MixingBuffer(capacity=4096, widths={"blocks.1.hook_resid_pre": 128}, dtype=torch.float32)
    >>> buf.put({"blocks.1.hook_resid_pre": acts})     # acts [n_rows, 128], n_rows <= buf.room
    >>> batch = buf.take(256)                            # {"blocks.1.hook_resid_pre": [256, 128]}
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["MixingBuffer"]


class MixingBuffer:
    """At most `capacity` rows of each hook's activations; `take` draws mixed (or in-order) batches."""

    def __init__(
        self,
        capacity: int,
        widths: dict[str, int],
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        self.capacity, self.shuffle = capacity, shuffle
        self.rows = {name: torch.empty(capacity, d, dtype=dtype, device=device) for name, d in widths.items()}
        self.start = 0  # rows live in [start, end); `start` moves only without shuffle
        self.end = 0
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def room(self) -> int:
        """How many rows `put` takes now."""
        return self.capacity - len(self)

    def put(self, acts: dict[str, Tensor]) -> None:
        """Add rows `[n, d]` per hook (all hooks the same n); refuses more than `room`."""
        n = next(iter(acts.values())).shape[0]
        if n > self.room:
            raise ValueError(f"MixingBuffer.put: {n} rows do not fit; room for {self.room} of {self.capacity}")
        if self.start and self.end + n > self.capacity:  # move the unread rows to the front
            for t in self.rows.values():
                t[: len(self)] = t[self.start : self.end].clone()
            self.start, self.end = 0, len(self)
        for name, t in self.rows.items():
            t[self.end : self.end + n] = acts[name]
        self.end += n

    def take(self, n: int) -> dict[str, Tensor]:
        """Remove and return `min(n, len(self))` rows per hook (new tensors, not views)."""
        n = min(n, len(self))
        if not self.shuffle:
            out = {name: t[self.start : self.start + n].clone() for name, t in self.rows.items()}
            self.start += n
            if self.start == self.end:
                self.start = self.end = 0
            return out
        size = self.end
        idx = torch.randperm(size, generator=self.generator)[:n].to(next(iter(self.rows.values())).device)
        out = {name: t[idx] for name, t in self.rows.items()}
        # Fill the holes below the new end with the kept rows above it.
        keep = torch.ones(size, dtype=torch.bool, device=idx.device)
        keep[idx] = False
        new_end = size - n
        holes = idx[idx < new_end]
        movers = torch.arange(new_end, size, device=idx.device)[keep[new_end:]]
        for t in self.rows.values():
            t[holes] = t[movers]
        self.end = new_end
        return out
