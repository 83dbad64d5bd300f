"""Sparse training steps: the (row, feature) positions a step needs, and decoding through them.

A JumpReLU or Gated SAE in training fires a few features per token, so a dense `[n, d_sae]` decode
mostly multiplies zeros, forward and backward. `Support.of(mask)` lists the positions of a bool mask
`[n, d_sae]` (row-major, with each row's start); `encoder_entries` reads the pre-activations there
(their gradient to the encoder through the support alone), `decode` sums `values[s] * W_dec[col[s]]` per row with `embedding_bag` (forward and
backward cost |support| * d_in, not n * d_sae * d_in: the gradient of each value is the dot product
of its row's output gradient with its decoder row), `row_sum` adds values up per row. Early in
training nothing is sparse yet: `sparse_enough(mask)` says when the support beats the dense matmul.

Example:
    >>> mask = torch.tensor([[True, False, True], [False, False, False]])
    >>> s = Support.of(mask)
    >>> s.decode(torch.tensor([2.0, 3.0]), torch.eye(3))
    tensor([[2., 0., 3.],
            [0., 0., 0.]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Support", "encoder_entries", "sparse_enough", "MAX_DENSITY", "rectangle"]

# The share of positions above which the dense step is cheaper (a dense matmul does far more useful
# work per second than embedding_bag's gathers and the sparse products): a guess the CPU benchmark tunes.
MAX_DENSITY = 1 / 16


def rectangle(z: Tensor) -> Tensor:
    """The straight-through estimators' kernel: 1 on the open interval (-1/2, 1/2), else 0."""
    return ((z > -0.5) & (z < 0.5)).to(z.dtype)


def sparse_enough(mask: Tensor, max_density: float | None = None) -> bool:
    """Whether `mask` `[n, d_sae]` is sparse enough for `Support` (one sync: its count)."""
    limit = MAX_DENSITY if max_density is None else max_density
    return int(mask.count_nonzero()) <= limit * mask.numel()


class _EncoderEntries(torch.autograd.Function):
    """`pre[rows, cols]` of `pre = x @ w + bias` (computed without autograd), with the gradient to `w` and
    `bias` through those entries alone: `dw[:, c] = sum over entries (r, c) of x[r] * g`, one sparse
    product of nnz * d_in work rather than the dense `x.T @ dpre` of n * d_in * d_sae."""

    @staticmethod
    def forward(ctx: Any, pre: Tensor, x: Tensor, w: Tensor, bias: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
        ctx.save_for_backward(x, rows, cols)
        ctx.n_features = w.shape[1]
        return pre[rows, cols]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, rows, cols = ctx.saved_tensors
        d_sae = ctx.n_features
        coo = torch.sparse_coo_tensor(torch.stack([cols, rows]), grad, (d_sae, x.shape[0]), check_invariants=False)
        grad_w = torch.sparse.mm(coo, x).T.contiguous()  # [d_in, d_sae]
        grad_bias = torch.zeros(d_sae, dtype=grad.dtype, device=grad.device).index_add_(0, cols, grad)
        return None, None, grad_w, grad_bias, None, None


def encoder_entries(pre: Tensor, x: Tensor, w: Tensor, bias: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """`pre[rows, cols]` (flat) of `pre = x @ w + bias` computed without autograd, differentiable in `w` and
    `bias` at |entries| * d_in cost (see `_EncoderEntries`): the encoder's backward of a sparse step."""
    return _EncoderEntries.apply(pre, x, w, bias, rows, cols)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Support:
    """The positions of a bool mask `[n, d_sae]`: `rows`, `cols` (row-major), `offsets` (each row's start)."""

    rows: Tensor
    cols: Tensor
    offsets: Tensor
    flat: Tensor  # rows * d_sae + cols
    shape: tuple[int, int]

    @classmethod
    def of(cls, mask: Tensor) -> Support:
        """The positions where `mask` is True."""
        n, width = mask.shape
        rows, cols = mask.nonzero(as_tuple=True)
        counts = torch.bincount(rows, minlength=n)
        return cls(rows, cols, counts.cumsum(0) - counts, rows * width + cols, (n, width))

    def encoder_entries(self, pre: Tensor, x: Tensor, w_enc: Tensor, bias: Tensor) -> Tensor:
        """`pre[rows, cols]` `[|support|]` of `pre = x @ w_enc + bias` (computed without autograd), with the
        gradient to `w_enc` and `bias` through the support alone: one sparse product of |support| * d_in work,
        not the dense `x.T @ grad` of n * d_in * d_sae that indexing a dense pre-activation leaves to autograd."""
        return encoder_entries(pre, x, w_enc, bias, self.rows, self.cols)

    def decode(self, values: Tensor, w_dec: Tensor) -> Tensor:
        """`sum_s values[s] * w_dec[cols[s]]` per row `[n, d_in]` (no bias)."""
        return F.embedding_bag(self.cols, w_dec, self.offsets, mode="sum", per_sample_weights=values)

    def row_sum(self, values: Tensor) -> Tensor:
        """`values` `[|support|]` summed per row `[n]`."""
        return values.new_zeros(self.shape[0]).index_add(0, self.rows, values)

    def dense(self, values: Tensor) -> Tensor:
        """`values` placed in a zero `[n, d_sae]` (detached: the feature activations a step reports)."""
        out = values.new_zeros(self.shape[0] * self.shape[1])
        return out.index_copy_(0, self.flat, values.detach()).view(self.shape)

    def fired(self, on: Tensor) -> Tensor:
        """The features (bool `[d_sae]`) with a position where `on` `[|support|]` holds."""
        fired = torch.zeros(self.shape[1], dtype=torch.bool, device=self.cols.device)
        fired[self.cols[on]] = True
        return fired
