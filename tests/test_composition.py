"""Composition scores: `utils.composition_scores` and `GPT.all_composition_scores`, by hand and
against transformer-lens 3.9 (those cases skip under transformer-lens 4, which has no HookedTransformer)."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_loading import make_tl_model

from interp_gpt import FactoredMatrix, from_pretrained, from_pretrained_no_processing
from interp_gpt.utils import composition_scores

TOL = dict(atol=1e-5, rtol=1e-4)


def _score_by_hand(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The definition, on full matrices: ||left @ right|| / (||left|| ||right||), Frobenius norms."""
    return torch.linalg.matrix_norm(left @ right) / torch.linalg.matrix_norm(left) / torch.linalg.matrix_norm(right)


# ----------------------------------------------------------------------------
# By hand (always run)
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_one_entry_matches_the_definition_from_the_weights(tiny_model, mode):
    n_layers, n_heads = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads
    with torch.no_grad():
        scores = tiny_model.all_composition_scores(mode)
        assert scores.shape == (n_layers, n_heads, n_layers, n_heads)
        src, dst = tiny_model.blocks[0].attn, tiny_model.blocks[1].attn
        for h1, h2 in ((0, 0), (1, 3), (3, 2)):
            ov = src.W_V[h1].double() @ src.W_O[h1].double()
            qk = dst.W_Q[h2].double() @ dst.W_K[h2].double().T
            right = {"Q": qk, "K": qk.T, "V": dst.W_V[h2].double() @ dst.W_O[h2].double()}[mode]
            expected = _score_by_hand(ov, right)
            assert 0 < float(expected) < 1
            torch.testing.assert_close(scores[0, h1, 1, h2].double(), expected, **TOL)


def test_the_modes_differ_and_are_zero_unless_the_source_layer_is_earlier(tiny_model):
    with torch.no_grad():
        by_mode = {mode: tiny_model.all_composition_scores(mode) for mode in "QKV"}
    for scores in by_mode.values():
        for l1 in range(tiny_model.cfg.n_layers):
            for l2 in range(tiny_model.cfg.n_layers):
                block = scores[l1, :, l2, :]
                assert bool((block > 0).all()) if l1 < l2 else bool((block == 0).all()), (l1, l2)
    assert not torch.allclose(by_mode["Q"], by_mode["K"]) and not torch.allclose(by_mode["Q"], by_mode["V"])


@pytest.mark.parametrize("mode", ["q", "O", "", None, 1])
def test_a_bad_mode_names_mode_the_value_and_the_choices(tiny_model, mode):
    with pytest.raises(ValueError, match=rf"mode must be one of 'Q', 'K', 'V', got {mode!r}"):
        tiny_model.all_composition_scores(mode)


def test_composition_scores_shapes_and_values_by_hand():
    gen = torch.Generator().manual_seed(0)
    left = FactoredMatrix(torch.randn(3, 2, 8, 4, generator=gen), torch.randn(3, 2, 4, 8, generator=gen))
    right = FactoredMatrix(torch.randn(5, 8, 3, generator=gen), torch.randn(5, 3, 6, generator=gen))
    scores = composition_scores(left, right)
    assert scores.shape == (3, 2, 5)
    torch.testing.assert_close(scores[2, 1, 4], _score_by_hand(left.AB[2, 1], right.AB[4]), **TOL)
    torch.testing.assert_close(scores, _score_by_hand(left.AB[:, :, None], right.AB[None, None]), **TOL)
    # Without broadcast_dims the leading axes line up instead: [3, 2] against [2] gives [3, 2].
    paired = FactoredMatrix(torch.randn(2, 8, 3, generator=gen), torch.randn(2, 3, 8, generator=gen))
    lined_up = composition_scores(left, paired, broadcast_dims=False)
    assert lined_up.shape == (3, 2)
    torch.testing.assert_close(lined_up, _score_by_hand(left.AB, paired.AB), **TOL)
    # Plain matrices: one score; a matrix against itself when it is a scaled projection scores 1 / sqrt(rank).
    plain = FactoredMatrix(torch.eye(8)[:, :2], torch.eye(8)[:2, :] * 3.0)
    torch.testing.assert_close(composition_scores(plain, plain), torch.tensor(2.0**-0.5), **TOL)


def test_composition_scores_rejects_bad_arguments():
    fm = FactoredMatrix(torch.randn(8, 4), torch.randn(4, 8))
    with pytest.raises(TypeError, match=r"left must be a FactoredMatrix .* got Tensor"):
        composition_scores(fm.AB, fm)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"right must be a FactoredMatrix .* got list"):
        composition_scores(fm, [1.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"broadcast_dims must be a bool, got 'yes'"):
        composition_scores(fm, fm, broadcast_dims="yes")  # type: ignore[arg-type]
    narrow = FactoredMatrix(torch.randn(6, 4), torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"left's columns \(8\) must match right's rows \(6\)"):
        composition_scores(fm, narrow)
    three = FactoredMatrix(torch.randn(3, 8, 4), torch.randn(3, 4, 8))
    two = FactoredMatrix(torch.randn(2, 8, 4), torch.randn(2, 4, 8))
    assert composition_scores(three, two).shape == (3, 2)
    with pytest.raises(ValueError, match=r"broadcast_dims=False the leading axes of left .* must broadcast"):
        composition_scores(three, two, broadcast_dims=False)


# ----------------------------------------------------------------------------
# Against transformer-lens 3.9
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("processed", [False, True])
def test_all_composition_scores_match_transformer_lens(hf_model, hf_checkpoint_dir, processed):
    tl = make_tl_model(hf_model, processed=processed)
    ours = (from_pretrained if processed else from_pretrained_no_processing)(hf_checkpoint_dir, tokenizer=None)
    with torch.no_grad():
        for mode in "QKV":
            expected = tl.all_composition_scores(mode)
            got = ours.all_composition_scores(mode)
            assert got.shape == expected.shape
            assert bool((expected != 0).any())
            torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("broadcast_dims", [True, False])
def test_composition_scores_match_transformer_lens_utils(hf_model, hf_checkpoint_dir, broadcast_dims):
    tl = make_tl_model(hf_model, processed=False)
    ours = from_pretrained_no_processing(hf_checkpoint_dir, tokenizer=None)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # transformer_lens.utils is deprecated in 3.9
        from transformer_lens import utils as tl_utils

        pairs = [
            ((ours.OV, ours.QK), (tl.OV, tl.QK)),
            ((ours.OV[0], ours.OV[1]), (tl.OV[0], tl.OV[1])),
            ((ours.OV[0, 1], ours.QK.T), (tl.OV[0, 1], tl.QK.T)),
        ]
        for (left, right), (tl_left, tl_right) in pairs:
            expected = tl_utils.composition_scores(tl_left, tl_right, broadcast_dims=broadcast_dims)
            got = composition_scores(left, right, broadcast_dims=broadcast_dims)
            assert got.shape == expected.shape
            torch.testing.assert_close(got, expected, **TOL)
