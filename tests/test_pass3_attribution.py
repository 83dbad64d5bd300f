"""Issue 36, third pass, the attribution tools: each defect class found by the outside reliability pass,
pinned by a test that fails without its fix (rows 6, 7, 8, 8d, 15, 21-27), and property tests of the
attribution edges and the interventions against brute force on random prompts."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.attribution import attribute, feature_intervention, feature_intervention_generate, qk_attribution
from interp_gpt.sae.data import shipped_transcoders

PROMPT = "The cat sat on the mat"


@pytest.fixture(scope="module")
def tiny() -> GPT:
    return GPT.from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module")
def tcs(tiny: GPT) -> Any:
    return shipped_transcoders(tiny)


# ----------------------------------------------------------------------------------------------------
# row 6: a non-finite value tensor is refused as a non-finite number is
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_value_tensor_is_refused(tiny: GPT, tcs: Any, bad: float) -> None:
    for value in (torch.tensor(bad), torch.tensor([1.0, bad])):
        with pytest.raises(ValueError, match=r"feature_intervention: interventions\[1\]: value=.*non-finite"):
            feature_intervention(tiny, PROMPT, tcs, [(1, 3, 3, 1.0), (1, torch.tensor([2, 3]), 3, value)])
    with pytest.raises(ValueError, match=r"interventions\[0\]: value=.*non-finite"):
        feature_intervention_generate(tiny, PROMPT, tcs, [(1, 3, 3, torch.tensor(bad))], max_new_tokens=1)


# ----------------------------------------------------------------------------------------------------
# row 7: a target given twice is refused by name
# ----------------------------------------------------------------------------------------------------
def test_a_duplicate_target_is_refused(tiny: GPT, tcs: Any) -> None:
    for targets in ([5, 5, 7], torch.tensor([7, 5, 5]), [" the", "x", " the"]):
        with pytest.raises(ValueError, match=r"attribute: attribution_targets\[\d\] and attribution_targets\[\d\]: .*twice"):
            attribute(tiny, PROMPT, tcs, attribution_targets=targets)
    graph = attribute(tiny, PROMPT, tcs, attribution_targets=[5, 7])
    assert [t.vocab_idx for t in graph.logit_targets] == [5, 7]
