"""utils.to_numpy: transformer-lens' helper (tensor, list, tuple, scalar, numpy array -> numpy array)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp_gpt import utils


def test_tensors_lists_and_scalars_become_arrays() -> None:
    t = torch.arange(6.0).reshape(2, 3).requires_grad_()
    got = utils.to_numpy(t * 2)  # needs a detach
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_array_equal(got, [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]])
    assert utils.to_numpy(torch.nn.Parameter(torch.ones(2))).tolist() == [1.0, 1.0]
    assert utils.to_numpy(torch.tensor([1, 2], dtype=torch.int64)).dtype == np.int64
    half = utils.to_numpy(torch.tensor([1.5, -2.25], dtype=torch.bfloat16))  # numpy has no bfloat16
    assert half.dtype == np.float32 and half.tolist() == [1.5, -2.25]
    assert utils.to_numpy([[1, 2], [3, 4]]).shape == (2, 2)
    assert utils.to_numpy((1.0, 2.0)).tolist() == [1.0, 2.0]
    assert utils.to_numpy(3).shape == () and int(utils.to_numpy(3)) == 3
    assert utils.to_numpy("abc").item() == "abc" and utils.to_numpy(True).item() is True
    array = np.zeros(3)
    assert utils.to_numpy(array) is array


def test_anything_else_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="to_numpy: tensor must be .* got dict"):
        utils.to_numpy({"a": 1})
    with pytest.raises(TypeError, match="got NoneType"):
        utils.to_numpy(None)
