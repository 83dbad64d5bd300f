"""The backward passes of `attribute` over prefixes of the prompt (replacement.Prefixes): a batch of targets up
to position p run over the graph of the first p + 1 positions gives the rows the whole prompt's graph gives;
`plan` picks the cheapest lengths (checked against every way of splitting the batches); the sparse
reconstruction of the error vectors is the transcoders' own.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from test_attribution import TOKENS, a_clt, plts

from interp_gpt import GPT
from interp_gpt.attribution import attribute
from interp_gpt.attribution._inputs import prepare
from interp_gpt.attribution.replacement import Prefixes, replacement_graph


def _lengths_used(monkeypatch: Any, plan: Any) -> list[int]:
    """Replace Prefixes.plan by `plan(self, needed, work)`; returns the list the graph lengths built go to."""
    built: list[int] = []
    get = Prefixes.get

    def spy(self: Prefixes, length: int) -> Any:
        if self.current.n != length:
            built.append(length)
        return get(self, length)

    monkeypatch.setattr(Prefixes, "plan", plan)
    monkeypatch.setattr(Prefixes, "get", spy)
    return built


@pytest.mark.parametrize("kind", ["plt", "plt-skip", "clt"])
@pytest.mark.parametrize("max_feature_nodes", [None, 12])
def test_shortest_prefixes_give_the_whole_prompts_rows(
    tiny_model: GPT, monkeypatch: Any, kind: str, max_feature_nodes: int | None
) -> None:
    d, n = tiny_model.cfg.d_model, tiny_model.cfg.n_layers
    tcs: Any = a_clt(d, n, skip=False) if kind == "clt" else plts(d, n, skip=kind == "plt-skip")
    kw = {"batch_size": 3, "max_feature_nodes": max_feature_nodes, "update_interval": 2}

    with monkeypatch.context() as m:  # every batch over the whole prompt's graph
        whole = _lengths_used(m, lambda self, needed, work: [self.current.n] * len(needed))
        full = attribute(tiny_model, TOKENS, tcs, **kw)
    with monkeypatch.context() as m:  # every batch over the shortest graph that holds it
        short = _lengths_used(m, lambda self, needed, work: [int(x) for x in needed])
        part = attribute(tiny_model, TOKENS, tcs, **kw)
    assert whole == []
    if max_feature_nodes is None:  # it did build short graphs (the most influential features sit late)
        assert min(short) <= 3 and len(short) >= 3
    assert torch.equal(part.active_features, full.active_features)
    assert torch.equal(part.selected_features, full.selected_features)
    scale = full.adjacency_matrix.abs().max()
    assert scale > 0
    torch.testing.assert_close(part.adjacency_matrix, full.adjacency_matrix, rtol=0, atol=1e-6 * float(scale))


def _cost(prefixes: Prefixes, needed: list[int], work: list[int], lengths: list[int]) -> float:
    """The cost the plan minimises, written out from its definition: a forward pass per graph built
    (L (4 d^2 + 2 d d_mlp) (n + 48)), and each batch's work times 2 d^2 times its graph's length."""
    cfg = prefixes.model.cfg
    total, held = 0.0, prefixes.current.n
    for need, w, length in zip(needed, work, lengths, strict=True):
        assert length >= need
        if length != held:
            total += cfg.n_layers * (4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_mlp) * (length + 48)
            held = length
        total += w * 2 * cfg.d_model**2 * length
    return total


def test_the_plan_costs_least(tiny_model: GPT) -> None:
    model, tokens, readers = prepare(tiny_model, torch.arange(30), plts(tiny_model.cfg.d_model, 2, skip=False), "test")
    prefixes = Prefixes(model, tokens, readers, replacement_graph(model, tokens, readers))
    g = torch.Generator().manual_seed(0)
    for trial in range(30):
        k = int(torch.randint(1, 7, (1,), generator=g))
        needed = sorted(torch.randint(1, 31, (k,), generator=g).tolist())
        work = torch.randint(1, 20, (k,), generator=g).mul(10 ** (trial % 4)).tolist()
        lengths = prefixes.plan(torch.tensor(needed), torch.tensor(work))
        # brute force: every split of the batches into runs, each run over a new graph as long as its last
        # batch needs, or (the first run) the graph held
        best = float("inf")
        for cuts in itertools.product([False, True], repeat=k - 1):
            runs, start = [], 0
            for i, cut in enumerate(cuts, 1):
                if cut:
                    runs.append((start, i))
                    start = i
            runs.append((start, k))
            for keep_first in (False, True):
                if keep_first and prefixes.current.n < needed[runs[0][1] - 1]:
                    continue
                option = []
                for r, (a, b) in enumerate(runs):
                    option += [prefixes.current.n if keep_first and r == 0 else needed[b - 1]] * (b - a)
                best = min(best, _cost(prefixes, needed, work, option))
        assert _cost(prefixes, needed, work, lengths) == pytest.approx(best, rel=1e-9), (needed, work, lengths)


def test_a_prefix_outside_the_prompt_is_refused(tiny_model: GPT) -> None:
    model, tokens, readers = prepare(tiny_model, TOKENS, plts(tiny_model.cfg.d_model, 2, skip=False), "test")
    prefixes = Prefixes(model, tokens, readers, replacement_graph(model, tokens, readers))
    for bad in (0, tokens.shape[0] + 1):
        with pytest.raises(ValueError, match=f"length={bad}: expected 1..{tokens.shape[0]}"):
            prefixes.get(bad)


@pytest.mark.parametrize("skip", [False, True])
def test_the_sparse_reconstruction_is_the_transcoders(tiny_model: GPT, monkeypatch: Any, skip: bool) -> None:
    """Error vectors come from a reconstruction that reads only the active features' decoder rows (at most
    one active feature in 64): the transcoder's own decode, up to the order of the sums."""
    d = tiny_model.cfg.d_model
    tcs = plts(d, 2, skip=skip)
    model, tokens, readers = prepare(tiny_model, TOKENS, tcs, "test")
    sparse_calls: list[int] = []
    sparse = type(readers)._sparse_decode
    monkeypatch.setattr(type(readers), "_sparse_decode", lambda self, *a: sparse_calls.append(1) or sparse(self, *a))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(TOKENS.shape[0], d, generator=g)
    for layer in range(2):
        acts = torch.zeros(TOKENS.shape[0], 40)  # 400 entries: 6 active take the sparse path, 7 do not
        for n_active, path in ((6, 1), (7, 0)):
            acts.zero_()
            acts.view(-1)[torch.randperm(400, generator=g)[:n_active]] = torch.rand(n_active, generator=g) + 0.5
            before = len(sparse_calls)
            out = readers.reconstruction(layer, [acts] * 2, x)
            assert len(sparse_calls) - before == path
            torch.testing.assert_close(out, tcs[layer]._decode(acts, x, hooked=False), rtol=1e-6, atol=1e-6)
