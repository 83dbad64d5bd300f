"""FactoredMatrix: a low-rank product `A @ B` kept as its two factors.

Circuits read from the weights are products of thin matrices: a head's OV circuit is
`W_V @ W_O` ([d_model, d_head] @ [d_head, d_model]), its QK circuit `W_Q @ W_K.T`. The full
[d_model, d_model] product is large and has rank at most d_head, so this class keeps the
factors and computes what is asked for (singular values, eigenvalues, norms, products with
other matrices) through them. It follows transformer-lens' `FactoredMatrix`: the same names,
shapes and conventions, so code written against one runs on the other.

`A` is [..., ldim, mdim] and `B` is [..., mdim, rdim]; the leading axes broadcast against each
other, so a stack of heads ([n_layers, n_heads, ...]) is one FactoredMatrix. The product `AB`
([..., ldim, rdim]) is only formed when asked for.

Conventions kept from transformer-lens, where they differ from torch's:
- `svd()` returns `(U, S, V)` with `AB == U @ S.diag_embed() @ V.transpose(-2, -1)`; `Vh`
  is an alias for `V` (so named there) and warns.
- `eigenvalues` are those of `BA` ([..., mdim]): the nonzero eigenvalues of `AB`.
- An integer row or column index keeps its axis (length 1), so the result is still a matrix.

Example:
    >>> import torch
    >>> from interp_gpt import FactoredMatrix
    >>> W_V, W_O = torch.randn(12, 768, 64), torch.randn(12, 64, 768)  # 12 heads
    >>> OV = FactoredMatrix(W_V, W_O)
    >>> OV.shape, OV.S.shape, OV.norm().shape
    (torch.Size([12, 768, 768]), torch.Size([12, 64]), torch.Size([12]))
    >>> (torch.randn(768) @ OV[3]).shape   # a vector through head 3: [768]
    torch.Size([768])
"""

from __future__ import annotations

import warnings
from functools import cached_property
from typing import Any

import torch
from jaxtyping import Complex, Float
from torch import Tensor

__all__ = ["FactoredMatrix", "carry_head_vector", "head_space_map"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _linalg_ready(x: Tensor) -> Tensor:
    """torch.linalg has no SVD or eig kernels for 16-bit floats: compute those in float32."""
    return x.float() if x.dtype in _LOW_PRECISION else x


def _as_index(item: Any) -> int | None:
    """The Python int an index item stands for (an int or a 0-d integer tensor), else None."""
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return item
    if isinstance(item, Tensor) and item.ndim == 0 and not item.dtype.is_floating_point and item.dtype != torch.bool:
        return int(item)
    return None


def _keep_axis(item: Any) -> Any:
    """An integer index as the length-1 slice that selects the same entry but keeps the axis."""
    i = _as_index(item)
    if i is None:
        return item
    return slice(i, i + 1 if i != -1 else None)


def _axes_consumed(item: Any) -> int:
    """How many axes of the indexed tensor one index item uses up (a boolean mask: its ndim)."""
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, Tensor) and item.dtype == torch.bool:
        return item.ndim
    return 1


class FactoredMatrix:
    """The matrix `A @ B`, stored as `A` [..., ldim, mdim] and `B` [..., mdim, rdim].

    Leading axes of `A` and `B` broadcast; after construction both factors carry the full
    leading shape. See the module docstring for an example.
    """

    def __init__(self, A: Float[Tensor, "... ldim mdim"], B: Float[Tensor, "... mdim rdim"]) -> None:
        for name, factor in (("A", A), ("B", B)):
            if not isinstance(factor, Tensor):
                raise TypeError(f"FactoredMatrix: {name} must be a torch.Tensor, got {type(factor).__name__}")
            if factor.ndim < 2:
                raise ValueError(
                    f"FactoredMatrix: {name} must have at least 2 axes ([..., rows, cols]), got shape {tuple(factor.shape)}"
                )
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(
                f"FactoredMatrix: the inner dimensions differ: A has shape {tuple(A.shape)} ({A.shape[-1]} columns), "
                f"B has shape {tuple(B.shape)} ({B.shape[-2]} rows); expected A [..., ldim, mdim] @ B [..., mdim, rdim]"
            )
        try:
            leading = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except RuntimeError:
            raise ValueError(
                f"FactoredMatrix: the leading axes of A (shape {tuple(A.shape)}) and B (shape {tuple(B.shape)}) "
                "do not broadcast against each other"
            ) from None
        self.ldim: int = A.shape[-2]
        self.mdim: int = A.shape[-1]
        self.rdim: int = B.shape[-1]
        self.has_leading_dims: bool = A.ndim > 2 or B.ndim > 2
        self.shape: torch.Size = torch.Size((*leading, self.ldim, self.rdim))
        self._A = A.broadcast_to((*leading, self.ldim, self.mdim))
        self._B = B.broadcast_to((*leading, self.mdim, self.rdim))

    # ------------------------------------------------------------------
    # the factors and the products they stand for
    # ------------------------------------------------------------------
    @property
    def A(self) -> Float[Tensor, "... ldim mdim"]:
        """The left factor (read-only: the cached SVD depends on it)."""
        return self._A

    @property
    def B(self) -> Float[Tensor, "... mdim rdim"]:
        """The right factor (read-only: the cached SVD depends on it)."""
        return self._B

    @property
    def pair(self) -> tuple[Tensor, Tensor]:
        """`(A, B)`."""
        return self._A, self._B

    @property
    def ndim(self) -> int:
        """The number of axes of the product A @ B."""
        return len(self.shape)

    @property
    def AB(self) -> Float[Tensor, "... ldim rdim"]:
        """The full product: [..., ldim, rdim], as large as the factors are thin."""
        return self._A @ self._B

    @property
    def BA(self) -> Float[Tensor, "... mdim mdim"]:
        """The reverse product `B @ A`, defined only for a square matrix (ldim == rdim)."""
        if self.ldim != self.rdim:
            raise ValueError(
                f"FactoredMatrix.BA needs a square matrix (ldim == rdim), but this one has shape {tuple(self.shape)} "
                f"(ldim={self.ldim}, rdim={self.rdim})"
            )
        return self._B @ self._A

    @property
    def T(self) -> FactoredMatrix:
        """The transpose, `B^T @ A^T`."""
        return FactoredMatrix(self._B.transpose(-2, -1), self._A.transpose(-2, -1))

    def __repr__(self) -> str:
        # transformer-lens' printed form, word for word (notebooks print it)
        return f"FactoredMatrix: Shape({self.shape}), Hidden Dim({self.mdim})"

    # ------------------------------------------------------------------
    # products
    # ------------------------------------------------------------------
    def _times_matrix(self, other: Tensor) -> FactoredMatrix:
        # Fold `other` into whichever side keeps the result thin: into B while mdim is the bottleneck.
        if self.rdim > self.mdim:
            return FactoredMatrix(self._A, self._B @ other)
        return FactoredMatrix(self.AB, other)

    def _matrix_times(self, other: Tensor) -> FactoredMatrix:
        if self.ldim > self.mdim:
            return FactoredMatrix(other @ self._A, self._B)
        return FactoredMatrix(other, self.AB)

    def __matmul__(self, other: Tensor | FactoredMatrix) -> Any:
        """`self @ other`: a FactoredMatrix for a matrix or FactoredMatrix, a tensor [..., ldim] for a vector."""
        if isinstance(other, FactoredMatrix):
            if other.ldim != self.rdim:
                raise ValueError(
                    f"FactoredMatrix @ FactoredMatrix: the inner dimensions differ: self has shape {tuple(self.shape)}, "
                    f"other has shape {tuple(other.shape)}; other needs {self.rdim} rows"
                )
            return self._times_matrix(other.A)._times_matrix(other.B)
        if not isinstance(other, Tensor):
            return NotImplemented
        rows = other.shape[-1] if other.ndim == 1 else other.shape[-2] if other.ndim >= 2 else None
        if rows != self.rdim:
            raise ValueError(
                f"FactoredMatrix @ other: other has shape {tuple(other.shape)}, expected a vector [{self.rdim}] or a "
                f"matrix [..., {self.rdim}, n] for a FactoredMatrix of shape {tuple(self.shape)}"
            )
        if other.ndim == 1:
            return (self._A @ (self._B @ other[:, None])).squeeze(-1)
        return self._times_matrix(other)

    def __rmatmul__(self, other: Tensor) -> Any:
        """`other @ self`: a FactoredMatrix for a matrix, a tensor [..., rdim] for a vector."""
        if not isinstance(other, Tensor):
            return NotImplemented
        if other.ndim == 0 or other.shape[-1] != self.ldim:
            raise ValueError(
                f"other @ FactoredMatrix: other has shape {tuple(other.shape)}, expected a vector [{self.ldim}] or a "
                f"matrix [..., n, {self.ldim}] for a FactoredMatrix of shape {tuple(self.shape)}"
            )
        if other.ndim == 1:
            return ((other[None, :] @ self._A) @ self._B).squeeze(-2)
        return self._matrix_times(other)

    def __mul__(self, scalar: float | Tensor) -> FactoredMatrix:
        """Scale by a number (or a one-element tensor), applied to `A`."""
        if isinstance(scalar, Tensor):
            if scalar.numel() != 1:
                raise ValueError(
                    f"FactoredMatrix * scalar: scalar must have one element, got a tensor of shape "
                    f"{tuple(scalar.shape)} (for a matrix product use @)"
                )
        elif isinstance(scalar, bool) or not isinstance(scalar, (int, float)):
            return NotImplemented
        return FactoredMatrix(self._A * scalar, self._B)

    def __rmul__(self, scalar: float | Tensor) -> FactoredMatrix:
        return self.__mul__(scalar)

    # ------------------------------------------------------------------
    # spectra, computed from the factors
    # ------------------------------------------------------------------
    @cached_property
    def _svd(self) -> tuple[Tensor, Tensor, Tensor]:
        # With A = Ua Sa Va^T and B = Ub Sb Vb^T, AB = Ua (Sa Va^T Ub Sb) Vb^T: only the small middle
        # matrix ([min(ldim, mdim), min(mdim, rdim)]) needs a fresh SVD, and Ua, Vb rotate its vectors.
        Ua, Sa, Vha = torch.linalg.svd(_linalg_ready(self._A), full_matrices=False)
        Ub, Sb, Vhb = torch.linalg.svd(_linalg_ready(self._B), full_matrices=False)
        middle = Sa[..., :, None] * (Vha @ Ub) * Sb[..., None, :]
        Um, Sm, Vhm = torch.linalg.svd(middle, full_matrices=False)
        return Ua @ Um, Sm, Vhb.transpose(-2, -1) @ Vhm.transpose(-2, -1)

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """`(U, S, V)` with `AB == U @ S.diag_embed() @ V.transpose(-2, -1)` (V, not torch's Vh).

        U is [..., ldim, k], S [..., k] (descending), V [..., rdim, k], k = min(ldim, mdim, rdim).
        """
        return self._svd

    @property
    def U(self) -> Float[Tensor, "... ldim k"]:
        """U of the product's singular value decomposition (A @ B = U diag(S) V^T)."""
        return self._svd[0]

    @property
    def S(self) -> Float[Tensor, "... k"]:
        """The product's singular values, largest first."""
        return self._svd[1]

    @property
    def V(self) -> Float[Tensor, "... rdim k"]:
        """V of the product's singular value decomposition (A @ B = U diag(S) V^T)."""
        return self._svd[2]

    @property
    def Vh(self) -> Float[Tensor, "... rdim k"]:
        """The same tensor as `V` (transformer-lens' older name; it is not the conjugate transpose)."""
        warnings.warn(
            "FactoredMatrix.Vh returns V (right singular vectors as columns), as in transformer-lens; "
            "use .V, or .V.transpose(-2, -1) for torch's Vh",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._svd[2]

    @cached_property
    def eigenvalues(self) -> Complex[Tensor, "... mdim"]:
        """Eigenvalues of `BA` ([..., mdim]): the nonzero eigenvalues of `AB` (if `BAv = kv`, then `AB(Av) = k(Av)`)."""
        return torch.linalg.eig(_linalg_ready(self.BA)).eigenvalues

    def norm(self) -> Float[Tensor, "*leading"]:
        """The Frobenius norm, one per leading index: the root of the summed squared singular values."""
        return self.S.pow(2).sum(-1).sqrt()

    def unit_norm(self) -> FactoredMatrix:
        """The same matrix scaled to Frobenius norm 1 (per leading index)."""
        norm = self.norm()
        if bool((norm == 0).any()):
            raise ValueError(
                f"FactoredMatrix.unit_norm: the matrix of shape {tuple(self.shape)} has a zero entry in norm()"
            )
        return FactoredMatrix(self._A / norm[..., None, None].to(self._A.dtype), self._B)

    def collapse_l(self) -> Float[Tensor, "... k rdim"]:
        """Drop the left orthogonal factor: `S.diag_embed() @ V^T` ([..., k, rdim]); `AB == U @ collapse_l()`."""
        return self.S[..., :, None] * self.V.transpose(-2, -1)

    def collapse_r(self) -> Float[Tensor, "... ldim k"]:
        """Drop the right orthogonal factor: `U @ S.diag_embed()` ([..., ldim, k]); `AB == collapse_r() @ V^T`."""
        return self.U * self.S[..., None, :]

    def make_even(self) -> FactoredMatrix:
        """The same matrix as `(U sqrt(S)) @ (sqrt(S) V^T)`: both factors carry half of each singular value."""
        root = self.S.sqrt()
        return FactoredMatrix(self.U * root[..., None, :], root[..., :, None] * self.V.transpose(-2, -1))

    # ------------------------------------------------------------------
    # indexing and reshaping
    # ------------------------------------------------------------------
    def unsqueeze(self, k: int) -> FactoredMatrix:
        """A new length-1 leading axis at `k` (an index into the leading axes' positions)."""
        return FactoredMatrix(self._A.unsqueeze(k), self._B.unsqueeze(k))

    def __getitem__(self, idx: Any) -> FactoredMatrix:
        """Index the leading axes, then optionally rows and columns, without forming the product.

        An integer row or column index keeps its axis (length 1). New axes (`None`) may stand
        among the leading axes only.
        """
        items = idx if isinstance(idx, tuple) else (idx,)
        ellipses = [i for i, item in enumerate(items) if item is Ellipsis]
        if len(ellipses) > 1:
            raise IndexError(f"FactoredMatrix: an index can hold one ellipsis, got {idx!r}")
        if ellipses:
            fill = self.ndim - sum(_axes_consumed(item) for item in items)
            items = items[: ellipses[0]] + (slice(None),) * max(fill, 0) + items[ellipses[0] + 1 :]
        n_leading = self.ndim - 2
        leading: list[Any] = []
        used = 0
        for item in items:
            if used >= n_leading:
                break
            leading.append(item)
            used += _axes_consumed(item)
        rest = items[len(leading) :]
        if used > n_leading or any(item is None for item in rest) or len(rest) > 2:
            raise IndexError(
                f"FactoredMatrix: index {idx!r} does not fit a FactoredMatrix of shape {tuple(self.shape)}: at most "
                f"{n_leading} leading axes, then a row and a column index (new axes only among the leading ones)"
            )
        lead = tuple(leading)
        if not rest:
            return FactoredMatrix(self._A[lead], self._B[lead])
        a_index = (*lead, _keep_axis(rest[0]), slice(None))
        b_index = (*lead, slice(None), _keep_axis(rest[1]) if len(rest) == 2 else slice(None))
        return FactoredMatrix(self._A[a_index], self._B[b_index])

    def get_corner(self, k: int = 3) -> Tensor:
        """The first `k` entries along every axis of `AB`, computed from the first k rows and columns only."""
        corner = self._A[..., :k, :] @ self._B[..., :, :k]
        return corner[tuple(slice(k) for _ in range(corner.ndim))]


@torch.no_grad()
def head_space_map(from_model: Any, to_model: Any, layer: int, which: str) -> Tensor | None:
    """Per head, the `[d_head, d_head]` matrix `M` that carries `from_model`'s `hook_q` / `hook_k` / `hook_v`
    activations (`which`: "Q", "K" or "V") of `layer` to `to_model`'s, `x_to = x_from @ M`, where the two
    hold one checkpoint factored differently (`refactor_factored_attn_matrices` re-splits W_Q/W_K and
    W_V/W_O: QK and OV stay, the factors change); `[n_heads, d_head, d_head]` float64, or None if no
    such map is exact. Read from the weights: each model's map from ln1's normalized input (mean-zero, so
    only its mean-zero part counts) with ln1's weight and bias folded in where they are not, and, for
    Q and K, the bias as one more input row (b_V's constant is not part of the map: fold_value_biases
    moves it). The identity where the factors agree (as the standard processing leaves them).

    Example:
        >>> raw = GPT.from_pretrained_no_processing("tiny-gpt2")
        >>> M = head_space_map(raw, model, 0, "Q")             # processed alike but for fold_ln: I
        >>> torch.allclose(M, torch.eye(model.cfg.d_head, dtype=M.dtype).expand_as(M), atol=1e-4)
        True
    """
    maps = [_head_map_in(m, layer, which) for m in (from_model, to_model)]
    A, B = maps[0], maps[1].to(maps[0].device)
    M = torch.linalg.lstsq(A, B).solution  # [n_heads, d_head, d_head]
    dtypes = [m.W_E.dtype for m in (from_model, to_model)]
    tol = max(1e-5, *(16 * torch.finfo(d).eps for d in dtypes))  # the weights' rounding
    return M if float((A @ M - B).norm()) <= tol * float(B.norm()) else None


def _head_map_in(model: Any, layer: int, which: str) -> Tensor:
    """`[n_heads, d_model (+ 1), d_head]`: hook_{which} of `layer` as a linear map of ln1's normalized input
    (and a 1 for the bias, for Q and K), float64."""
    block = model.blocks[layer]
    W = getattr(block.attn, f"W_{which}").detach().double()
    b = getattr(block.attn, f"b_{which}").detach().double()
    norm = model.cfg.normalization_type
    if norm == "LN":  # not folded: x_hat * w + b goes in
        w, ln_b = block.ln1.w.detach().double().to(W.device), block.ln1.b.detach().double().to(W.device)
        b = b + torch.einsum("m,hmd->hd", ln_b, W)
        W = w[:, None] * W
    if norm in ("LN", "LNPre"):  # the normalized input is mean-zero: a constant over d_model does nothing
        W = W - W.mean(1, keepdim=True)
    return W if which == "V" else torch.cat([W, b[:, None, :]], dim=1)


def carry_head_vector(v: Tensor, from_model: Any, to_model: Any, hook: str, mode: str = "add") -> Tensor | None:
    """`v` `[n_heads, d_head]`, steering `from_model` at `blocks.L.attn.hook_q / k / v / z` in `mode`, as the
    vector that steers `to_model` the same way (`steering.map_direction` at these hooks): `v @ M` per head
    (`head_space_map`; hook_z is carried by W_V's map) where the heads are factored differently, for
    mode "add" (a projection is not carried by a map that is not a rotation: refused); None where the
    factors agree (M is the identity: the activations are the same). Refused where no exact map exists.

    Example:
        >>> refactored = GPT.from_pretrained("tiny-gpt2", refactor_factored_attn_matrices=True)
        >>> v = torch.randn(model.cfg.n_heads, model.cfg.d_head)
        >>> carry_head_vector(v, model, refactored, "blocks.0.attn.hook_v").shape
        torch.Size([4, 32])
    """
    layer, which = int(hook.split(".")[1]), hook[-1].upper().replace("Z", "V")
    M = head_space_map(from_model, to_model, layer, which)
    where = f"map_direction: {hook!r}, mode={mode!r}: the two models' W_{which} of layer {layer}"
    if M is None:
        raise ValueError(f"{where} are no per-head linear map of each other (not one checkpoint?): nothing maps")
    eye = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
    if float((M - eye).abs().max()) <= max(1e-4, 32 * torch.finfo(v.dtype).eps):
        return None
    if mode != "add":
        raise ValueError(
            f"{where} are factored differently (refactor_factored_attn_matrices re-splits QK and OV): the "
            "activations differ by a per-head linear map that is not a rotation, so a projection does not carry "
            "over; steer at attn.hook_result / hook_attn_out, or between models factored alike"
        )
    return torch.einsum("hd,hde->he", v.double().to(M.device), M).to(v.device, v.dtype)
