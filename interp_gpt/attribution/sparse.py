"""The adjacency stored sparsely: a `torch.sparse_csr_tensor` built row batch by row batch, its size
estimated before any work, and the few operations pruning needs on it (never the dense matrix).

Layout: `[n_nodes, n_nodes]`, `[target, source]`, float32 values, crow/col indices int32 (int64 when the
graph has 2**31 or more non-zeros): 8 bytes per non-zero where dense takes 4 per entry, so sparse is
smaller below 50% non-zeros (an attribution graph with every feature a node has about 25%: each row
holds only its target's causal cone). int32 indices: torch's CSR matmul (`@`, `torch.sparse.mm`), its
transpose and our indexing all take them, and they halve the indices' memory.

Example:
    >>> import torch
    >>> from interp_gpt.attribution.sparse import RowPieces
    >>> pieces = RowPieces(3)
    >>> pieces.add(1, torch.tensor([[0.0, 2.0, 0.0]]))
    >>> pieces.to_csr().to_dense()
    tensor([[0., 0., 0.],
            [0., 2., 0.],
            [0., 0., 0.]])
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

__all__ = ["RowPieces", "as_csr", "cone_nonzeros", "csr", "csr_bytes", "is_sparse", "row_ids"]

_INT32_MAX = 2**31 - 1


def csr(crow: Tensor, col: Tensor, values: Tensor, n: int) -> Tensor:
    """An `[n, n]` CSR tensor of these parts (torch's "beta" warning silenced: we use its stable core)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, (n, n))


class RowPieces:
    """The non-zeros of an `[n_rows, n_rows]` matrix, collected a run of dense rows at a time (each run
    written once; rows never written stay empty), assembled into one CSR tensor by `to_csr`."""

    def __init__(self, n_rows: int):
        self.n_rows = n_rows
        self.pieces: list[tuple[int, Tensor, Tensor, Tensor]] = []  # (first row, counts, cols int32, values)

    def add(self, start: int, rows: Tensor) -> None:
        """Rows `start .. start + len(rows) - 1`, dense over the first `rows.shape[1]` columns."""
        nonzero = rows != 0
        cols = nonzero.nonzero()[:, 1].to(torch.int32)  # row-major: each row's columns ascending
        self.pieces.append((start, nonzero.sum(1), cols, rows[nonzero].float()))

    def to_csr(self) -> Tensor:
        """The CSR tensor; the pieces are freed as they are copied in (the result's pages fill as they go)."""
        self.pieces.sort(key=lambda piece: piece[0])
        counts = torch.zeros(self.n_rows + 1, dtype=torch.long)
        for start, count, _, _ in self.pieces:
            counts[start + 1 : start + 1 + count.shape[0]] = count
        crow = counts.cumsum(0)
        nnz = int(crow[-1])
        index = torch.int32 if nnz <= _INT32_MAX else torch.long
        col, values = torch.empty(nnz, dtype=index), torch.empty(nnz)
        while self.pieces:
            start, _, cols, vals = self.pieces.pop(0)
            at = int(crow[start])
            col[at : at + cols.shape[0]] = cols
            values[at : at + vals.shape[0]] = vals
            del cols, vals
        return csr(crow.to(index), col, values, self.n_rows)


def cone_nonzeros(active: Tensor, n_layers: int, n_pos: int, n_logits: int) -> int:
    """At most how many non-zeros a graph with every active feature a node has: a feature at (layer, pos)
    reads the features and error nodes of lower layers and the embeddings, at positions <= pos; a logit
    reads every feature, error node and embedding."""
    n_active = active.shape[0]
    counts = torch.zeros(n_layers + 1, n_pos, dtype=torch.long)
    counts.index_put_((active[:, 0] + 1, active[:, 1]), torch.ones(n_active, dtype=torch.long), accumulate=True)
    below = counts.cumsum(0).cumsum(1)  # [layer, pos]: features of lower layers at positions <= pos
    layer, pos = active[:, 0], active[:, 1]
    features = int(below[layer, pos].sum())
    errors_and_embeddings = int(((layer + 1) * (pos + 1)).sum())
    return features + errors_and_embeddings + n_logits * (n_active + (n_layers + 1) * n_pos)


def csr_bytes(nnz: int, n_nodes: int) -> int:
    """The memory of a CSR `[n_nodes, n_nodes]` float32 matrix with `nnz` non-zeros."""
    index = 4 if nnz <= _INT32_MAX else 8
    return (4 + index) * nnz + index * (n_nodes + 1)


def is_sparse(matrix: Tensor) -> bool:
    """Whether `matrix` has a sparse layout (COO, CSR, CSC, BSR or BSC)."""
    return matrix.layout != torch.strided


def as_csr(matrix: Tensor) -> Tensor:
    """A sparse matrix of any layout as CSR, its indices int32 or int64 as they are."""
    if matrix.layout == torch.sparse_csr:
        return matrix
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return matrix.coalesce().to_sparse_csr() if matrix.layout == torch.sparse_coo else matrix.to_sparse_csr()


def row_ids(matrix: Tensor) -> Tensor:
    """`[nnz]` the row of each stored entry of a CSR matrix (in its index dtype)."""
    crow = matrix.crow_indices()
    rows = torch.arange(matrix.shape[0], dtype=crow.dtype, device=crow.device)
    return torch.repeat_interleave(rows, crow.diff())
