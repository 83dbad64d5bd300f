"""FactoredMatrix against transformer-lens' FactoredMatrix on random batched factors (float64).

Each case builds both classes from the same factors and compares what they return within 1e-5:
products, transpose, norm, the SVD (singular vectors up to one sign each), eigenvalues (as sets),
products with tensors and with other factored matrices on either side, indexing, corners.
"""

from __future__ import annotations

import re

import pytest
import torch

from interp_gpt import FactoredMatrix

TOL = 1e-5

# (A shape, B shape): non-square with mdim below both sides, square, broadcast leading axes,
# mdim above both sides, and no leading axes.
SHAPES = {
    "nonsquare": ((2, 3, 5, 2), (2, 3, 2, 4)),
    "square": ((2, 3, 6, 3), (2, 3, 3, 6)),
    "broadcast": ((3, 5, 2), (2, 1, 2, 5)),
    "wide_middle": ((2, 4, 7), (2, 7, 5)),
    "unbatched": ((6, 2), (2, 6)),
}


def _tl():
    return pytest.importorskip("transformer_lens.FactoredMatrix").FactoredMatrix


def _factors(name: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a_shape, b_shape = SHAPES[name]
    return torch.randn(a_shape, generator=g, dtype=torch.float64), torch.randn(
        b_shape, generator=g, dtype=torch.float64
    )


def _pair(name: str, seed: int = 0):
    A, B = _factors(name, seed)
    return FactoredMatrix(A, B), _tl()(A.clone(), B.clone())


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape, f"shape {tuple(ours.shape)} vs {tuple(theirs.shape)}"
    assert torch.allclose(ours, theirs, atol=TOL, rtol=TOL), f"max gap {(ours - theirs).abs().max().item():.3g}"


def _align(ours: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """`ours` with each column's sign flipped to agree with `theirs` (singular vectors have no sign)."""
    sign = torch.sign((ours * theirs).sum(-2, keepdim=True))
    return ours * sign


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_dimensions_and_products_match(name: str) -> None:
    ours, tl = _pair(name)
    assert (ours.shape, ours.ndim, ours.ldim, ours.mdim, ours.rdim) == (tl.shape, tl.ndim, tl.ldim, tl.mdim, tl.rdim)
    assert ours.has_leading_dims == tl.has_leading_dims
    _close(ours.A, tl.A)
    _close(ours.B, tl.B)
    _close(ours.pair[0], tl.pair[0])
    _close(ours.pair[1], tl.pair[1])
    _close(ours.AB, tl.AB)
    _close(ours.T.AB, tl.T.AB)
    assert ours.T.shape == tl.T.shape
    _close(ours.norm(), tl.norm())
    _close(ours.norm(), torch.linalg.matrix_norm(ours.AB))  # Frobenius, independently of both
    if ours.ldim == ours.rdim:
        _close(ours.BA, tl.BA)
    _close(ours.get_corner(), tl.get_corner())
    _close(ours.get_corner(2), tl.get_corner(2))
    for scaled, tl_scaled in [(ours * 2.5, tl * 2.5), (2.5 * ours, 2.5 * tl), (ours * torch.tensor(-3.0), tl * -3.0)]:
        _close(scaled.AB, tl_scaled.AB)
    assert repr(ours) == repr(tl) == str(ours)  # transformer-lens' printed form


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_svd_and_spectral_views_match(name: str) -> None:
    ours, tl = _pair(name)
    U, S, V = ours.svd()
    tU, tS, tV = tl.svd()
    _close(S, tS)
    _close(_align(U, tU), tU)
    _close(_align(V, tV), tV)
    _close(U @ torch.diag_embed(S) @ V.transpose(-2, -1), ours.AB)
    _close(ours.U, U)
    _close(ours.S, S)
    _close(ours.V, V)
    with pytest.warns(DeprecationWarning):
        _close(ours.Vh, V)
    # collapse_r = U S (columns carry U's signs); collapse_l = S V^T (rows carry V's signs).
    sign_u = torch.sign((U * tU).sum(-2, keepdim=True))
    sign_v = torch.sign((V * tV).sum(-2, keepdim=True))
    _close(ours.collapse_r() * sign_u, tl.collapse_r())
    _close(ours.collapse_l() * sign_v.transpose(-2, -1), tl.collapse_l())
    _close(ours.collapse_r() @ V.transpose(-2, -1), ours.AB)
    _close(U @ ours.collapse_l(), ours.AB)
    _close(ours.make_even().AB, tl.make_even().AB)
    unit = ours.unit_norm()
    _close(unit.AB, tl.AB / tl.norm()[..., None, None])
    _close(unit.norm(), torch.ones_like(unit.norm()))


@pytest.mark.parametrize("name", ["square", "unbatched"])
def test_eigenvalues_match_as_sets(name: str) -> None:
    ours, tl = _pair(name)
    mine, theirs = ours.eigenvalues, tl.eigenvalues
    assert mine.shape == theirs.shape == (*ours.shape[:-2], ours.mdim)
    assert torch.allclose(mine, theirs, atol=TOL, rtol=TOL)  # in transformer-lens' order, too
    gaps = (mine[..., :, None] - theirs[..., None, :]).abs()
    assert gaps.min(-1).values.max() < TOL and gaps.min(-2).values.max() < TOL
    # and each is an eigenvalue of the full product AB, computed independently of both classes.
    full = torch.linalg.eigvals(ours.AB)
    gaps_full = (mine[..., :, None] - full[..., None, :]).abs()
    assert gaps_full.min(-1).values.max() < TOL


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_matmul_with_tensors_and_factored_matrices_matches(name: str) -> None:
    ours, tl = _pair(name)
    g = torch.Generator().manual_seed(1)
    lead = tuple(ours.shape[:-2])
    for n in (2, 9):  # thinner and wider than mdim, so both foldings are taken
        right = torch.randn((*lead, ours.rdim, n), generator=g, dtype=torch.float64)
        left = torch.randn((*lead, n, ours.ldim), generator=g, dtype=torch.float64)
        for mine, theirs in [(ours @ right, tl @ right), (left @ ours, left @ tl)]:
            assert isinstance(mine, FactoredMatrix)
            assert (mine.shape, mine.mdim) == (theirs.shape, theirs.mdim)
            _close(mine.AB, theirs.AB)
        _close((ours @ right).AB, ours.AB @ right)
        _close((left @ ours).AB, left @ ours.AB)
    v_right = torch.randn(ours.rdim, generator=g, dtype=torch.float64)
    v_left = torch.randn(ours.ldim, generator=g, dtype=torch.float64)
    _close(ours @ v_right, tl @ v_right)
    _close(v_left @ ours, v_left @ tl)
    _close(ours @ v_right, ours.AB @ v_right)
    C = torch.randn((ours.rdim, 3), generator=g, dtype=torch.float64)
    D = torch.randn((3, 4), generator=g, dtype=torch.float64)
    other, tl_other = FactoredMatrix(C, D), _tl()(C, D)
    both, tl_both = ours @ other, tl @ tl_other
    assert (both.shape, both.mdim) == (tl_both.shape, tl_both.mdim)
    _close(both.AB, tl_both.AB)
    _close(both.AB, ours.AB @ C @ D)
    E = torch.randn((5, ours.ldim), generator=g, dtype=torch.float64)
    before = FactoredMatrix(E[:, :2], torch.randn((2, ours.ldim), generator=g, dtype=torch.float64))
    _close((before @ ours).AB, (_tl()(before.A, before.B) @ tl).AB)


INDICES = [
    0,
    -1,
    (1, 2),
    (slice(None), 1),
    (0, slice(1, 3)),
    (0, 1, 2),
    (0, 1, -1),
    (1, 2, 3, 0),
    (-1, -1, -1, -1),
    (0, slice(None), slice(1, 4), 2),
    (1, 0, slice(None), -1),
]


@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_getitem_matches(index: object) -> None:
    ours, tl = _pair("nonsquare")
    mine, theirs = ours[index], tl[index]
    assert (mine.shape, mine.mdim) == (theirs.shape, theirs.mdim)
    _close(mine.AB, theirs.AB)


def test_getitem_with_ellipsis_and_tensors_indexes_the_product() -> None:
    ours, _ = _pair("nonsquare")
    full = ours.AB
    _close(ours[..., 2, :].AB, full[..., 2:3, :])
    _close(ours[..., 1:3].AB, full[..., :, 1:3])
    _close(ours[0, ...].AB, full[0])
    _close(ours[torch.tensor(1)].AB, full[1])
    _close(ours[:, torch.tensor([0, 2])].AB, full[:, [0, 2]])
    _close(ours[None, 1].AB, full[None, 1])
    assert ours.unsqueeze(0).shape == (1, *ours.shape)


# ----------------------------------------------------------------------------
# bad input: the error names the argument and the shapes involved
# ----------------------------------------------------------------------------
def _shape_text(t: torch.Tensor) -> str:
    return re.escape(str(tuple(t.shape)))


def test_mismatched_inner_dimensions_name_both_factors() -> None:
    A, B = torch.randn(2, 5, 3), torch.randn(2, 4, 6)
    with pytest.raises(
        ValueError, match=rf"inner dimensions.*A has shape {_shape_text(A)}.*B has shape {_shape_text(B)}"
    ):
        FactoredMatrix(A, B)


def test_non_tensor_and_unbroadcastable_factors_are_rejected() -> None:
    with pytest.raises(TypeError, match=r"B must be a torch.Tensor, got list"):
        FactoredMatrix(torch.randn(3, 2), [[1.0, 2.0]])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"A must have at least 2 axes.*\(3,\)"):
        FactoredMatrix(torch.randn(3), torch.randn(3, 2))
    A, B = torch.randn(2, 5, 3), torch.randn(4, 3, 6)
    with pytest.raises(
        ValueError, match=rf"leading axes of A \(shape {_shape_text(A)}\) and B \(shape {_shape_text(B)}\)"
    ):
        FactoredMatrix(A, B)


def test_ba_on_a_non_square_product_names_the_shape() -> None:
    fm = FactoredMatrix(torch.randn(2, 5, 3), torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match=r"BA needs a square matrix.*\(2, 5, 4\).*ldim=5, rdim=4"):
        _ = fm.BA
    with pytest.raises(ValueError, match=r"BA needs a square matrix"):
        _ = fm.eigenvalues


def test_matmul_shape_mismatches_name_both_shapes() -> None:
    fm = FactoredMatrix(torch.randn(2, 5, 3), torch.randn(2, 3, 4))
    for other in (torch.randn(5, 7), torch.randn(5)):
        with pytest.raises(
            ValueError, match=rf"FactoredMatrix @ other: other has shape {_shape_text(other)}.*\(2, 5, 4\)"
        ):
            fm @ other
    for other in (torch.randn(7, 4), torch.randn(4)):
        with pytest.raises(
            ValueError, match=rf"other @ FactoredMatrix: other has shape {_shape_text(other)}.*\(2, 5, 4\)"
        ):
            other @ fm
    with pytest.raises(ValueError, match=r"self has shape \(2, 5, 4\), other has shape \(5, 5\)"):
        fm @ FactoredMatrix(torch.randn(5, 2), torch.randn(2, 5))


def test_scaling_by_a_non_scalar_and_overlong_indices_are_rejected() -> None:
    fm = FactoredMatrix(torch.randn(2, 5, 3), torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match=r"scalar must have one element.*\(2,\)"):
        fm * torch.ones(2)
    with pytest.raises(IndexError, match=r"does not fit a FactoredMatrix of shape \(2, 5, 4\)"):
        fm[0, 1, 2, 3]
    with pytest.raises(IndexError, match=r"one ellipsis"):
        fm[..., 0, ...]
    with pytest.raises(ValueError, match=r"zero entry in norm"):
        FactoredMatrix(torch.zeros(5, 3), torch.randn(3, 4)).unit_norm()
