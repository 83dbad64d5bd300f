"""The explicit attention of a long causal context, computed in blocks of queries (Attention's fast
explicit path: the same maths as model.py's einsums, for when the pattern must be made).

A query at position i sees keys 0..i only, so the lower triangle of `q k^T` and of `pattern v` is all
the work: query block [r0, r1) needs keys [0, r1) only. Computing each block against its keys alone does
about (n + 1) / 2n of the full products' work for n blocks, and the softmax runs over the same part.
The hooks still see whole `[batch, n_heads, query_pos, key_pos]` tensors, masked as always (scores
-inf, pattern 0 above the diagonal); each skipped part is used only while the hook handed back the
tensor it was given, unchanged (the same object, no in-place write: `Tensor._version`). A hook that
edits the scores or the pattern, in place or by returning another tensor, gets the whole product as
before. (Writes that bypass the version counter, through `.data` or a NumPy view, are not seen: edit
the tensor itself, or return a new one.)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["BLOCK", "blocks_apply", "causal_attention_in_blocks"]

# Query rows per block. 1 x 1024 tokens: 8 blocks, 56% of the full products' work.
BLOCK = 128


def blocks_apply(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether `causal_attention_in_blocks` applies: a context longer than one block, no autograd graph
    through q, k or v (the blocks are written into preallocated tensors, which autograd cannot follow)."""
    graph = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return q.shape[1] > BLOCK and not graph


def _counted_empty(like: Tensor, shape: tuple[int, ...] | torch.Size) -> Tensor:
    # An ordinary tensor even under inference_mode: only those count their in-place writes (`_version`).
    with torch.inference_mode(False):
        return torch.empty(shape, dtype=like.dtype, device=like.device)


def _unchanged(before: Tensor, version: int, after: Tensor) -> bool:
    return after is before and after._version == version


def causal_attention_in_blocks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    hook_scores: Callable[[Tensor], Tensor],
    hook_pattern: Callable[[Tensor], Tensor],
) -> Tensor:
    """softmax(causal(q k^T / sqrt(d_head))) v with both hooks applied, as Attention's explicit path.

    Args:
        q, k, v: `[batch, posn, n_heads, d_head]`, queries at positions 0..posn-1 (no key cache, no padding).
        hook_scores, hook_pattern: the hook points, called once each on the whole tensor.

    Returns:
        z `[batch, posn, n_heads, d_head]`.

    Example:
        >>> q = k = v = torch.randn(1, 300, 2, 8)
        >>> z = causal_attention_in_blocks(q, k, v, lambda s: s, lambda p: p)
        >>> full = torch.ones(300, 300).tril().bool()
        >>> pattern = (torch.einsum("bqhd,bkhd->bhqk", q, k) / 8**0.5).masked_fill(~full, -torch.inf).softmax(-1)
        >>> torch.allclose(z, torch.einsum("bhqk,bkhd->bqhd", pattern, v), atol=1e-6)
        True
    """
    n = q.shape[1]
    qh = (q / math.sqrt(q.shape[-1])).transpose(1, 2)  # [batch, n_heads, posn, d_head]
    kt = k.permute(0, 2, 3, 1)  # [batch, n_heads, d_head, posn]
    vh = v.transpose(1, 2)
    spans = [(r0, min(r0 + BLOCK, n)) for r0 in range(0, n, BLOCK)]
    scores = _counted_empty(q, (q.shape[0], q.shape[2], n, n))
    for r0, r1 in spans:
        torch.matmul(qh[:, :, r0:r1], kt[..., :r1], out=scores[:, :, r0:r1, :r1])
        scores[:, :, r0:r1, r1:].fill_(-math.inf)
        diagonal = scores[:, :, r0:r1, r0:r1]  # keys after the query within the block
        diagonal.masked_fill_(torch.ones(r1 - r0, r1 - r0, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    version = scores._version
    hooked = hook_scores(scores)
    if not _unchanged(scores, version, hooked):  # edited: whole rows, as the einsums would
        return torch.matmul(hook_pattern(hooked.softmax(dim=-1)), vh).transpose(1, 2)
    pattern = _counted_empty(q, scores.shape)
    for r0, r1 in spans:
        pattern[:, :, r0:r1, :r1] = scores[:, :, r0:r1, :r1].softmax(dim=-1)
        pattern[:, :, r0:r1, r1:].zero_()
    version = pattern._version
    hooked = hook_pattern(pattern)
    if not _unchanged(pattern, version, hooked):
        return torch.matmul(hooked, vh).transpose(1, 2)
    z = q.new_empty(vh.shape)  # [batch, n_heads, posn, d_head]
    for r0, r1 in spans:
        torch.matmul(pattern[:, :, r0:r1, :r1], vh[:, :, :r1], out=z[:, :, r0:r1])
    return z.transpose(1, 2)
