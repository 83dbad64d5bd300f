"""Issue 36, third pass (causal and steering): padded batches read at real tokens, map_direction on
refactored attention and low-precision models, steering coefficients, bool probe labels, hashable
mean-difference labels, tiny sampling temperatures, the causal tools' seeds."""

from __future__ import annotations

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.causal import collect_activations
from interp_gpt.steering import contrastive_vector

HOOK = "blocks.1.hook_resid_pre"
VERSE = ["ROMEO:\nThou art a villain, and thy", "JULIET:\nO, my lord, what says thy"]
PROSE = ["Prince Andrew looked at Pierre and at the", "The French army crossed the river near the"]


@pytest.fixture(scope="module")
def tiny() -> GPT:
    return GPT.from_pretrained("tiny-gpt2").eval()


def _one_by_one(model: GPT, prompts: list[str], position: int = -1) -> torch.Tensor:
    return torch.stack([collect_activations(model, HOOK, model.to_tokens(p), position)[0] for p in prompts])


# ---------------------------------------------------------------- row 2: one rule for padded batches
def test_collect_activations_reads_each_prompt_at_its_own_real_token(tiny: GPT) -> None:
    prompts = VERSE + PROSE
    expected = _one_by_one(tiny, prompts)
    scale = expected.abs().max()
    for side in ("right", "left"):
        tokens, mask = tiny.to_tokens(prompts, padding_side=side, return_mask=True)
        got = collect_activations(tiny, HOOK, tokens, attention_mask=mask)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * scale)
    torch.testing.assert_close(collect_activations(tiny, HOOK, prompts), expected, rtol=1e-4, atol=1e-5 * scale)
    # positions count in each row's real tokens, from the start too
    first = collect_activations(tiny, HOOK, prompts, positions=2)
    torch.testing.assert_close(first, _one_by_one(tiny, prompts, 2), rtol=1e-4, atol=1e-5 * scale)


def test_collect_activations_agrees_with_contrastive_vector_as_the_readme_uses_them(tiny: GPT) -> None:
    acts = collect_activations(tiny, HOOK, VERSE + PROSE, positions=-1)  # the README's call
    v = contrastive_vector(tiny, VERSE, PROSE, HOOK)
    expected = acts[:2].double().mean(0) - acts[2:].double().mean(0)
    torch.testing.assert_close(v.double(), expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


def test_collect_activations_refuses_a_position_past_a_rows_real_tokens(tiny: GPT) -> None:
    with pytest.raises(ValueError, match=r"collect_activations: positions=9 is outside tokens\[1\] \(2 real tokens"):
        collect_activations(tiny, HOOK, ["The cat sat on the mat today", "A"], positions=9)
    tokens, mask = tiny.to_tokens(["The cat", "A dog ran"], return_mask=True)
    with pytest.raises(ValueError, match="attention_mask goes with token ids"):
        collect_activations(tiny, HOOK, ["The cat"], attention_mask=mask)
