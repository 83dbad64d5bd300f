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


# ----------------------------------------------------------------------------------------------------
# row 8: qk_attribution splits the score the same way whatever the model's processing
# ----------------------------------------------------------------------------------------------------
def test_the_qk_split_does_not_depend_on_processing(tiny: GPT, tcs: Any) -> None:
    rand = torch.randint(100, 2000, (8,), generator=torch.Generator().manual_seed(0))
    tokens = torch.cat([rand, rand])
    models = [
        tiny,
        GPT.from_pretrained("tiny-gpt2", fold_ln=False),
        GPT.from_pretrained("tiny-gpt2", fold_ln=False, fold_value_biases=False),
    ]
    runs = [qk_attribution(m, tokens, tcs, layer=1, head=0, query_pos=12, key_pos=5) for m in models]
    ref = runs[0]
    for run in runs[1:]:
        assert run.score == pytest.approx(ref.score, rel=1e-5)
        for side in ("query", "key"):
            assert [t.label for t in getattr(run, f"{side}_terms")] == [t.label for t in getattr(ref, f"{side}_terms")]
            got, want = getattr(run, f"{side}_contributions"), getattr(ref, f"{side}_contributions")
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
