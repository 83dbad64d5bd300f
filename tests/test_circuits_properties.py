"""Property-based tests of the circuit tools' inputs (hypothesis; a few dozen cases, seconds):

- an edge set given as a bool mask (tensor, numpy array, list of bools), as edge indices (a list,
  an integer tensor, a numpy array, in any order) or as names is the same set of edges, and
  `patch_edges` gives the brute-force reference's logits for every form; an integer 0/1 mask is
  always refused;
- clean / corrupted text pairs either patch exactly as one plain hooked run per edge (the
  brute-force reference of tests/circuit_refs.py) or, when some row's clean and corrupted prompts
  tokenize to different lengths, are refused naming the first such row and both lengths.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from interp_gpt import GPT, Config
from interp_gpt.circuits import Circuit, Graph, patch_edges

sys.path.insert(0, str(Path(__file__).resolve().parent))
from circuit_refs import brute_patch, random_model, sender_values  # noqa: E402

PROPERTY = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,  # the same cases on every run
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TWO = Config(n_layers=2, d_model=36, n_heads=3, d_vocab=60, n_ctx=16)
GRAPH = Graph(TWO)


@functools.cache
def two_model() -> GPT:
    return random_model(TWO)


@functools.cache
def text_model() -> GPT:
    return GPT.from_pretrained("tiny-gpt2")


def tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, TWO.d_vocab, (2, 5), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------
# (a) one edge set, many forms
# ----------------------------------------------------------------------------
@PROPERTY
@given(picked=st.lists(st.integers(0, GRAPH.n_edges - 1), unique=True, max_size=20), seed=st.integers(0, 3))
def test_masks_index_lists_and_names_are_the_same_edges_and_patch_alike(picked: list[int], seed: int) -> None:
    g, model = GRAPH, two_model()
    mask = torch.zeros(g.n_edges, dtype=torch.bool)
    mask[picked] = True
    names = [g.edge_name(i) for i in picked]  # in the drawn order, not the graph's
    forms = [
        mask,
        mask.numpy(),
        mask.tolist(),
        picked,
        torch.tensor(picked, dtype=torch.long),
        np.array(picked, dtype=np.int64),
        names,
    ]
    want_idx = sorted(picked)
    for form in forms:
        assert g.edge_indices(form).sort().values.tolist() == want_idx
        assert torch.equal(g.edge_mask(form), mask)
        assert torch.equal(Circuit(g, form).mask, mask)
    clean, corrupted = tokens(seed), tokens(seed + 10)
    got = patch_edges(model, clean, corrupted, forms, progress=False)
    want = brute_patch(model, clean, sender_values(model, corrupted), names)
    for row in got:  # (the same set in other rows of one batched forward: equal to float64 rounding)
        torch.testing.assert_close(row, want, atol=1e-10, rtol=1e-10)


@PROPERTY
@given(bits=st.lists(st.integers(0, 1), min_size=GRAPH.n_edges, max_size=GRAPH.n_edges))
def test_an_integer_zero_one_mask_of_n_edges_is_always_refused(bits: list[int]) -> None:
    for form in (bits, torch.tensor(bits), torch.tensor(bits, dtype=torch.int32), np.array(bits)):
        with pytest.raises(TypeError, match=r"edges: a .* of \d+ values, all 0 or 1, is ambiguous.*bool"):
            GRAPH.edge_indices(form)


# ----------------------------------------------------------------------------
# (b) text pairs: patched exactly, or refused per row
# ----------------------------------------------------------------------------
# Words whose token counts differ with and without a leading space, so that swapping words (or
# drawing others) sometimes keeps a prompt's length and sometimes does not.
WORDS = ["cat", "sat", "ran", "the", "Mary", "John", "went", "store", "to", "x", "hello", "pizza"]
prompt = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    clean, corrupted = [], []
    for _ in range(2):
        words = draw(prompt)
        other = draw(st.one_of(st.permutations(words), prompt))  # the same words reordered, or others
        clean.append(" ".join(words))
        corrupted.append(" ".join(other))
    return clean, corrupted


@PROPERTY
@given(pair=pairs(), edges=st.lists(st.integers(0, 109), min_size=1, max_size=3, unique=True))
def test_text_pairs_patch_as_one_hooked_run_per_edge_or_are_refused_per_row(
    pair: tuple[list[str], list[str]], edges: list[int]
) -> None:
    model = text_model()
    g = Graph.from_model(model)
    assert g.n_edges == 110
    clean, corrupted = pair
    lengths = [
        (len(model.to_str_tokens(c)), len(model.to_str_tokens(x))) for c, x in zip(clean, corrupted, strict=True)
    ]
    names = [g.edge_name(e) for e in edges]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, 1, 3].mean() - logits[:, 1, 5].mean()

    bad = [row for row, (a, b) in enumerate(lengths) if a != b]
    event("refused" if bad else "patched")  # both happen: --hypothesis-show-statistics
    if bad:
        a, b = lengths[bad[0]]
        with pytest.raises(
            ValueError, match=rf"^patch_edges: row {bad[0]}: clean_tokens has {a} tokens but corrupted_tokens has {b};"
        ):
            patch_edges(model, clean, corrupted, [[e] for e in names], progress=False)
        return
    got = patch_edges(model, clean, corrupted, [[e] for e in names], progress=False)
    c_ids, x_ids = model.to_tokens(clean), model.to_tokens(corrupted)
    other = sender_values(model, x_ids)
    for k, e in enumerate(names):
        torch.testing.assert_close(got[k], brute_patch(model, c_ids, other, [e]), atol=1e-4, rtol=1e-4)
    values = patch_edges(model, clean, corrupted, [[e] for e in names], metric, progress=False)
    torch.testing.assert_close(values, torch.stack([metric(x) for x in got]).float(), atol=1e-5, rtol=1e-5)
