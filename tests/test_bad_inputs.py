"""Bad model inputs: one clear error naming the argument and the value, never a wrong answer."""

from __future__ import annotations

import pytest
import torch

from interp_gpt import GPT


@pytest.mark.parametrize("value", [2, -1])
def test_an_attention_mask_of_other_values_than_0_and_1_is_refused(tiny_model: GPT, tiny_tokens, value: int) -> None:
    """Positions come from the mask's cumulative sum: a 2 would shift every later position."""
    mask = torch.ones_like(tiny_tokens)
    mask[1, 3] = value
    with pytest.raises(ValueError, match=rf"attention_mask: value {value} at \[batch, posn\] = \[1, 3\]"):
        tiny_model(tiny_tokens, attention_mask=mask)


def test_a_float_attention_mask_is_refused_by_name(tiny_model: GPT, tiny_tokens) -> None:
    with pytest.raises(TypeError, match=r"attention_mask: .*dtype torch.float32"):
        tiny_model(tiny_tokens, attention_mask=torch.ones(tiny_tokens.shape))


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int32, torch.long])
def test_a_0_1_mask_of_any_integer_dtype_gives_the_same_logits(tiny_model: GPT, tiny_tokens, dtype) -> None:
    mask = torch.ones_like(tiny_tokens)
    mask[0, :2] = 0  # left padding on the first row
    reference = tiny_model(tiny_tokens, attention_mask=mask)
    torch.testing.assert_close(tiny_model(tiny_tokens, attention_mask=mask.to(dtype)), reference, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_token_ids_of_a_small_integer_dtype_run_like_int64(tiny_model: GPT, dtype) -> None:
    ids = torch.tensor([[1, 5, 99, 42]])
    torch.testing.assert_close(tiny_model(ids.to(dtype)), tiny_model(ids), rtol=0, atol=0)


def test_an_out_of_range_id_in_a_small_dtype_is_named_with_its_true_value(tiny_model: GPT) -> None:
    """int16 300 is out of a 100-token vocabulary; the check must not wrap it or miss it."""
    with pytest.raises(ValueError, match=r"token id 300 at \[batch, posn\] = \[0, 1\] is out of range"):
        tiny_model(torch.tensor([[1, 300, 2]], dtype=torch.int16))
    with pytest.raises(ValueError, match=r"token id -3 at"):
        tiny_model(torch.tensor([[1, -3]], dtype=torch.int8))


def test_a_residual_of_another_dtype_with_start_at_layer_is_refused_by_name(tiny_model: GPT, tiny_tokens) -> None:
    resid = tiny_model(tiny_tokens, stop_at_layer=1)
    with pytest.raises(TypeError, match=r"start_at_layer.*torch.float64.*torch.float32"):
        tiny_model(resid.double(), start_at_layer=1)
    with pytest.raises(ValueError, match=r"start_at_layer.*d_model=64"):
        tiny_model(resid[..., :10], start_at_layer=1)


@pytest.mark.parametrize("text", ["a\udcffb", "\ud800"])
def test_text_with_a_lone_surrogate_is_refused_by_every_entry(text: str) -> None:
    model = GPT.from_pretrained("tiny-gpt2")
    for call in (
        lambda: model(text),
        lambda: model.to_tokens(text),
        lambda: model.to_tokens(["fine", text]),
        lambda: model.generate(text, max_new_tokens=1),
        lambda: model.to_str_tokens(text),
        lambda: model.tokenizer.encode(text),
    ):
        with pytest.raises(ValueError, match="lone surrogate"):
            call()
    with pytest.raises(ValueError, match=r"input\[1\]"):
        model.to_tokens(["fine", text])
