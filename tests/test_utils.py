"""utils.py's transformer-lens helpers that the notebooks call: get_device, get_corner, get_act_name with
0-d tensor layers (issue 28), and detect_head's heads given as tensors."""

from __future__ import annotations

import pytest
import torch

from interp_gpt import FactoredMatrix, utils


def test_get_device_names_the_best_device_as_a_string(monkeypatch):
    assert utils.get_device() == ("cuda" if torch.cuda.is_available() else utils.get_device())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert utils.get_device() in ("cpu", "mps")
    monkeypatch.delenv("TRANSFORMERLENS_ALLOW_MPS", raising=False)
    assert utils.get_device() == "cpu"  # MPS only when opted in, as transformer-lens


def test_get_corner_of_a_tensor_and_a_factored_matrix():
    t = torch.arange(60).reshape(3, 4, 5)
    assert torch.equal(utils.get_corner(t, 2), t[:2, :2, :2])
    assert torch.equal(utils.get_corner(t), t[:3, :3, :3])
    g = torch.Generator().manual_seed(0)
    fm = FactoredMatrix(torch.randn(6, 2, generator=g), torch.randn(2, 7, generator=g))
    corner = utils.get_corner(fm, 3)
    assert isinstance(corner, FactoredMatrix) and torch.allclose(corner.AB, fm.AB[:3, :3])
    with pytest.raises(TypeError, match="get_corner: tensor must be"):
        utils.get_corner([[1, 2]], 1)
    with pytest.raises(ValueError, match="n=-1 is out of range"):
        utils.get_corner(t, -1)


def test_get_act_name_takes_a_0d_integer_tensor_layer():
    for layer in torch.arange(3):
        assert utils.get_act_name("pattern", layer) == f"blocks.{int(layer)}.attn.hook_pattern"
    assert utils.get_act_name("scale", torch.tensor(2), "ln1") == "blocks.2.ln1.hook_scale"
    with pytest.raises(TypeError, match="get_act_name: layer must be an int"):
        utils.get_act_name("pattern", torch.tensor(1.0))


def test_factored_matrix_prints_as_transformer_lens():
    fm = FactoredMatrix(torch.ones(2, 5, 3), torch.ones(2, 3, 4))
    assert repr(fm) == str(fm) == "FactoredMatrix: Shape(torch.Size([2, 5, 4])), Hidden Dim(3)"


def test_detect_head_takes_heads_as_tensors(tiny_model):
    from interp_gpt.head_detector import detect_head

    tiny_model.tokenizer = __import__("interp_gpt.tokenizer", fromlist=["x"]).char_tokenizer("abcdefgh ")
    plain = detect_head(tiny_model, "abc abc", "previous_token_head", heads=[(1, 2)])
    as_tensors = detect_head(tiny_model, "abc abc", "previous_token_head", heads=[(torch.tensor(1), torch.tensor(2))])
    assert torch.equal(plain, as_tensors)
    with pytest.raises(ValueError, match="heads holds head"):
        detect_head(tiny_model, "abc abc", "previous_token_head", heads=[(torch.tensor(1), torch.tensor(9))])
