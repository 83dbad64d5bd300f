"""prune_graph, compute_graph_scores and to_json on random small attribution graphs: properties checked
against a float64 brute-force influence ((I - A)^-1), and bad input refused by name.
(Equality with circuit-tracer's own functions: tests/test_attribution_prune_circuit_tracer.py.)"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from interp_gpt.attribution import AttributionGraph, compute_graph_scores, prune_graph, to_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attribution_refs import influence64, logit_weights, random_graph  # noqa: E402

SEEDS = range(30)


class _Tok:
    def decode(self, token: int) -> str:
        return f"<t{token}>"


@pytest.mark.parametrize("seed", SEEDS)
def test_cumulative_scores_equal_brute_force_influence(seed: int) -> None:
    graph = random_graph(seed, dtype=torch.float64)
    influence = influence64(graph.adjacency_matrix, logit_weights(graph))
    ordered, order = influence.sort(descending=True)
    expected = torch.zeros_like(influence)
    expected[order] = ordered.cumsum(0) / ordered.sum()
    result = prune_graph(graph)
    torch.testing.assert_close(result.cumulative_scores, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_masks_keep_every_token_and_logit_and_only_kept_nodes_edges(seed: int) -> None:
    graph = random_graph(seed)
    node_mask, edge_mask, _ = prune_graph(graph, 0.5, 0.5)
    n_kept_always = graph.n_pos + graph.n_logits
    assert node_mask[-n_kept_always:].all()
    assert node_mask.dtype == edge_mask.dtype == torch.bool
    assert edge_mask.shape == graph.adjacency_matrix.shape
    # every kept edge joins kept nodes and has a non-zero weight (unless all edges are kept: threshold 0)
    kept = edge_mask.nonzero()
    assert node_mask[kept[:, 0]].all() and node_mask[kept[:, 1]].all()
    assert (graph.adjacency_matrix[edge_mask] != 0).all()
    # every kept feature has a kept input and every kept feature/error node a kept output
    body = node_mask.clone()
    body[-n_kept_always:] = False
    assert edge_mask[:, body].any(0).all()
    assert edge_mask[: graph.n_features][node_mask[: graph.n_features]].any(1).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_thresholds_one_keep_every_node_with_influence(seed: int) -> None:
    graph = random_graph(seed, dtype=torch.float64)
    influence = influence64(graph.adjacency_matrix, logit_weights(graph))
    node_mask, _, _ = prune_graph(graph, 1.0, 1.0)
    expected = influence > 0
    expected[-graph.n_pos - graph.n_logits :] = True
    # every one of them (and, as in circuit-tracer, those without influence too where the cumulative sum
    # rounds to a hair below 1.0, which makes the threshold 0)
    assert not (expected & ~node_mask).any()


@pytest.mark.parametrize("seed", SEEDS)
def test_kept_nodes_lie_within_the_node_threshold_and_masks_grow_with_the_edge_threshold(seed: int) -> None:
    graph = random_graph(seed, dtype=torch.float64)
    influence = influence64(graph.adjacency_matrix, logit_weights(graph))
    n_body = graph.adjacency_matrix.shape[0] - graph.n_pos - graph.n_logits
    for node_threshold in (0.3, 0.6, 0.9):
        masks = [prune_graph(graph, node_threshold, t) for t in (0.3, 0.6, 0.9, 1.0)]
        # the node step keeps the nodes as influential as the one where the cumulative share reaches the threshold
        cumulative = masks[0].cumulative_scores
        at = torch.where(cumulative >= node_threshold, cumulative, 2.0).argmin()
        for node_mask, _, _ in masks:
            assert (influence[:n_body][node_mask[:n_body]] >= influence[at] - 1e-12).all()
        for (n_lo, e_lo, _), (n_hi, e_hi, _) in zip(masks, masks[1:], strict=False):
            assert not (n_lo & ~n_hi).any() and not (e_lo & ~e_hi).any()


@pytest.mark.parametrize("seed", SEEDS)
def test_scores_in_unit_interval_and_equal_brute_force(seed: int) -> None:
    graph = random_graph(seed, dtype=torch.float64)
    replacement, completeness = compute_graph_scores(graph)
    w = logit_weights(graph)
    influence = influence64(graph.adjacency_matrix, w)
    n_f, n_e, n_t = graph.n_features, graph.n_errors, graph.n_pos
    tokens, errors = influence[n_f + n_e : n_f + n_e + n_t].sum(), influence[n_f : n_f + n_e].sum()
    a = graph.adjacency_matrix.abs()
    error_share = a[:, n_f : n_f + n_e].sum(1) / a.sum(1).clamp(min=1e-10)
    out = influence + w
    assert 0 <= replacement <= 1 and 0 <= completeness <= 1
    assert math.isclose(replacement, float(tokens / (tokens + errors)), abs_tol=1e-12)
    assert math.isclose(completeness, float(((1 - error_share) * out).sum() / out.sum()), abs_tol=1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_errors_that_carry_nothing_give_scores_of_one(seed: int) -> None:
    replacement, completeness = compute_graph_scores(random_graph(seed, zero_errors=True))
    assert replacement == 1.0
    assert completeness == pytest.approx(1.0, abs=1e-6)


def test_float32_and_float64_graphs_prune_alike() -> None:
    for seed in SEEDS:
        g32, g64 = random_graph(seed), random_graph(seed, dtype=torch.float64)
        r32, r64 = prune_graph(g32), prune_graph(g64)
        torch.testing.assert_close(r32.cumulative_scores.double(), r64.cumulative_scores, rtol=1e-5, atol=1e-5)


def test_to_json_nodes_links_and_metadata(tmp_path) -> None:
    graph = random_graph(3, min_feature=5)
    node_mask, edge_mask, cumulative = prune_graph(graph)
    path = to_json(graph, tmp_path / "sub" / "g.json", slug="s", tokenizer=_Tok(), scan=["a", "b"])
    data = json.loads(path.read_text())
    assert data["metadata"]["prompt_tokens"] == [f"<t{t}>" for t in graph.input_tokens.tolist()]
    assert data["metadata"]["scan"].startswith("custom-") and data["metadata"]["transcoder_list"] == ["a", "b"]
    ids = [n["node_id"] for n in data["nodes"]]
    assert len(ids) == len(set(ids))
    by_id = {n["node_id"]: n for n in data["nodes"]}
    assert sum(n["feature_type"] == "logit" for n in data["nodes"]) == graph.n_logits
    assert sum(n["feature_type"] == "embedding" for n in data["nodes"]) == graph.n_pos
    for link in data["links"]:
        assert link["source"] in by_id and link["target"] in by_id
    assert len(data["links"]) <= int(edge_mask.sum())
    # deterministic: the same graph gives the same file
    again = to_json(graph, tmp_path / "h.json", slug="s", tokenizer=_Tok(), scan=["a", "b"])
    assert again.read_text() == path.read_text()


def test_to_json_error_ids_do_not_collide_with_feature_ids(tmp_path) -> None:
    # layer 0's feature 1 at pos 0 is circuit-tracer's id "0_1_0", its id of layer 1's error at pos 0 too
    graph = random_graph(0)
    n_layers = 2
    active = torch.tensor([[0, 0, 1]])
    n = 1 + n_layers * 1 + 1 + 1
    adj = torch.zeros(n, n)
    adj[0, 3] = 1.0  # feature <- embedding
    adj[4, 0] = 1.0  # logit <- feature
    adj[4, 2] = 1.0  # logit <- layer 1's error
    adj[4, 3] = 1.0  # logit <- embedding
    graph = dataclasses.replace(
        graph, input_tokens=torch.tensor([7]), active_features=active, activation_values=torch.ones(1),
        selected_features=torch.tensor([0]), adjacency_matrix=adj, logit_probabilities=torch.tensor([0.5]),
        cfg=dataclasses.replace(graph.cfg, n_layers=n_layers), logit_targets=graph.logit_targets[:1],
    )  # fmt: skip
    data = json.loads(to_json(graph, tmp_path / "g.json", slug="s", tokenizer=_Tok(), node_threshold=1.0).read_text())
    ids = [n["node_id"] for n in data["nodes"]]
    assert "0_1_0" in ids and "err_1_0" in ids and len(ids) == len(set(ids))


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arg", ["node_threshold", "edge_threshold"])
@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0.0, ValueError),
        (1.5, ValueError),
        (-0.1, ValueError),
        (float("nan"), ValueError),
        ("0.8", TypeError),
        (True, TypeError),
    ],  # fmt: skip
)
def test_bad_thresholds_are_refused_by_name(arg: str, value: object, error: type) -> None:
    with pytest.raises(error, match=rf"prune_graph: {arg}"):
        prune_graph(random_graph(1), **{arg: value})  # type: ignore[arg-type]


def test_not_a_graph_is_refused() -> None:
    with pytest.raises(TypeError, match="prune_graph: graph must be an AttributionGraph, got dict"):
        prune_graph({})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="compute_graph_scores: graph must be an AttributionGraph"):
        compute_graph_scores(None)  # type: ignore[arg-type]


def _with(**changes: object) -> AttributionGraph:
    return dataclasses.replace(random_graph(2), **changes)


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"adjacency_matrix": torch.zeros(3, 3)}, ValueError, r"graph.adjacency_matrix has shape \(3, 3\), expected"),
        ({"adjacency_matrix": None}, TypeError, "graph.adjacency_matrix must be a tensor"),
        ({"logit_targets": []}, ValueError, "graph.logit_targets is empty"),
        ({"logit_probabilities": torch.ones(9)}, ValueError, r"graph.logit_probabilities has shape \(9,\)"),
        ({"active_features": torch.zeros(2, 2, dtype=torch.long)}, ValueError, "graph.active_features has shape"),
        ({"selected_features": torch.tensor([0.5])}, ValueError, "graph.selected_features must be a 1-d integer"),
        ({"selected_features": torch.tensor([99])}, ValueError, "graph.selected_features holds 99..99"),
        ({"input_tokens": torch.zeros(0, dtype=torch.long)}, ValueError, r"graph.input_tokens has shape \(0,\)"),
    ],
)
def test_malformed_graphs_are_refused_by_name(changes: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        prune_graph(_with(**changes))


def test_non_finite_cyclic_and_influence_free_graphs_are_refused() -> None:
    graph = random_graph(2)
    adj = graph.adjacency_matrix.clone()
    adj[-1, -graph.n_logits - 1] = float("nan")
    with pytest.raises(ValueError, match="prune_graph: graph.adjacency_matrix holds NaN"):
        prune_graph(dataclasses.replace(graph, adjacency_matrix=adj))
    with pytest.raises(ValueError, match="compute_graph_scores: graph.logit_probabilities holds NaN"):
        compute_graph_scores(dataclasses.replace(graph, logit_probabilities=graph.logit_probabilities * float("nan")))
    cyclic = torch.ones_like(graph.adjacency_matrix)
    with pytest.raises(ValueError, match="graph.adjacency_matrix has a cycle"):
        prune_graph(dataclasses.replace(graph, adjacency_matrix=cyclic))
    with pytest.raises(ValueError, match="prune_graph: graph has no influence on its logits"):
        prune_graph(dataclasses.replace(graph, adjacency_matrix=torch.zeros_like(graph.adjacency_matrix)))


def test_to_json_bad_input_is_refused_by_name(tmp_path) -> None:
    graph = random_graph(2)
    with pytest.raises(ValueError, match="to_json: slug must be a non-empty string"):
        to_json(graph, tmp_path / "g.json", slug="", tokenizer=_Tok())
    with pytest.raises(TypeError, match="to_json: tokenizer must have a decode"):
        to_json(graph, tmp_path / "g.json", slug="s", tokenizer=None)
    with pytest.raises(ValueError, match="to_json: scan=None and graph.scan is None"):
        to_json(dataclasses.replace(graph, scan=None), tmp_path / "g.json", slug="s", tokenizer=_Tok())
    with pytest.raises(TypeError, match="to_json: scan must be a string or a non-empty list"):
        to_json(graph, tmp_path / "g.json", slug="s", tokenizer=_Tok(), scan=[1])
    with pytest.raises(TypeError, match="to_json: path must be a file path"):
        to_json(graph, 3, slug="s", tokenizer=_Tok())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="to_json: node_threshold=2 is out of range"):
        to_json(graph, tmp_path / "g.json", slug="s", tokenizer=_Tok(), node_threshold=2)
    assert not list(tmp_path.iterdir())  # nothing written by a refused call


def test_a_sparse_adjacency_prunes_and_writes_as_the_dense_one(tmp_path) -> None:
    for seed in range(10):
        dense = random_graph(seed)
        sparse = dataclasses.replace(dense, adjacency_matrix=dense.adjacency_matrix.to_sparse())
        (d_nodes, d_edges, d_cum), (s_nodes, s_edges, s_cum) = prune_graph(dense), prune_graph(sparse)
        assert torch.equal(d_nodes, s_nodes) and torch.equal(d_edges, s_edges.to_dense())  # a CSR mask
        torch.testing.assert_close(s_cum, d_cum, rtol=1e-6, atol=1e-6)  # float32 rounding (sparse sums)
        assert compute_graph_scores(sparse) == pytest.approx(compute_graph_scores(dense), rel=1e-5)
        one = json.loads(to_json(dense, tmp_path / "d.json", slug="s", tokenizer=_Tok()).read_text())
        two = json.loads(to_json(sparse, tmp_path / "s.json", slug="s", tokenizer=_Tok()).read_text())
        assert one["links"] == two["links"] and one["metadata"] == two["metadata"]
        for a, b in zip(one["nodes"], two["nodes"], strict=True):  # influences: to float32 rounding
            assert {**a, "influence": None} == {**b, "influence": None}
            assert a["influence"] == (b["influence"] and pytest.approx(b["influence"], rel=1e-6, abs=1e-7))


def test_to_json_writes_token_text_as_it_is(tmp_path) -> None:
    # as circuit-tracer does: JSON escapes what JSON must; a page showing the text escapes it for HTML
    class Hostile:
        def decode(self, token: int) -> str:
            return '<img src=x onerror="alert(1)">\u2028'

    graph = random_graph(4)
    text = to_json(graph, tmp_path / "g.json", slug="s", tokenizer=Hostile()).read_text()
    assert json.loads(text)["metadata"]["prompt_tokens"][0] == '<img src=x onerror="alert(1)">\u2028'
