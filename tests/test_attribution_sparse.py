"""The adjacency stored sparsely (CSR): `attribute(..., sparse=True)` gives the dense graph's adjacency, the
layout is chosen by the memory available, and prune_graph, compute_graph_scores, to_json and graph_page's
data on a sparse graph equal the dense graph's (random small graphs from attribution_refs.py, and
tiny-gpt2 with its shipped transcoders) without making the matrix dense."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.attribution import attribute, compute_graph_scores, prune_graph, to_json
from interp_gpt.attribution.sparse import RowPieces, as_csr, cone_nonzeros
from interp_gpt.attribution.viewer import page_data
from interp_gpt.sae.data import shipped_clt, shipped_transcoders

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attribution_refs import random_graph  # noqa: E402

attribute_module = importlib.import_module("interp_gpt.attribution.attribute")
PROMPT = "The cat sat on the mat because the dog was not there and so the cat"


class _Tok:
    def decode(self, token: int) -> str:
        return f"<t{token}>"


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.set_num_threads(1)
    return GPT.from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module", params=["plt", "clt"])
def graphs(request, model):  # type: ignore[no-untyped-def]
    tcs = shipped_transcoders(model) if request.param == "plt" else shipped_clt()
    dense = attribute(model, PROMPT, tcs, sparse=False, batch_size=16)
    sparse = attribute(model, PROMPT, tcs, sparse=True, batch_size=16)
    return dense, sparse


def csr_of(graph):  # type: ignore[no-untyped-def]
    return dataclasses.replace(graph, adjacency_matrix=graph.adjacency_matrix.to_sparse_csr())


def assert_prunes_alike(dense, sparse, nt: float = 0.8, et: float = 0.98) -> None:  # type: ignore[no-untyped-def]
    d_nodes, d_edges, d_cum = prune_graph(dense, nt, et)
    s_nodes, s_edges, s_cum = prune_graph(sparse, nt, et)
    assert s_edges.layout == torch.sparse_csr and s_edges.dtype == torch.bool
    assert torch.equal(s_nodes, d_nodes)
    assert torch.equal(s_edges.to_dense(), d_edges)  # to_dense in the test only
    torch.testing.assert_close(s_cum, d_cum, rtol=1e-6, atol=1e-6)
    for a, b in zip(compute_graph_scores(sparse), compute_graph_scores(dense), strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


def test_attribute_sparse_equals_dense_and_is_csr(graphs) -> None:  # type: ignore[no-untyped-def]
    dense, sparse = graphs
    adj = sparse.adjacency_matrix
    assert adj.layout == torch.sparse_csr and adj.dtype == torch.float32
    assert adj.crow_indices().dtype == torch.int32 and adj.col_indices().dtype == torch.int32
    assert adj.shape == dense.adjacency_matrix.shape
    assert torch.equal(adj.to_dense(), dense.adjacency_matrix)
    assert bool((adj.values() != 0).all())  # only the non-zeros are stored
    n_errors_end = sparse.n_features + sparse.n_errors + sparse.n_pos
    assert bool((adj.crow_indices().diff()[sparse.n_features : n_errors_end] == 0).all())  # error, embedding rows
    # the causal-cone estimate is an upper bound of the non-zeros, and not a loose one
    nnz = cone_nonzeros(sparse.active_features, sparse.cfg.n_layers, sparse.n_pos, sparse.n_logits)
    assert adj.values().shape[0] <= nnz < 4 * adj.values().shape[0]


def test_sparse_graph_prunes_scores_and_writes_as_dense(graphs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    dense, sparse = graphs
    for nt, et in ((0.8, 0.98), (0.5, 0.9), (0.95, 0.999)):
        assert_prunes_alike(dense, sparse, nt, et)
    one = json.loads(to_json(dense, tmp_path / "d.json", slug="s", tokenizer=_Tok(), scan="x").read_text())
    two = json.loads(to_json(sparse, tmp_path / "s.json", slug="s", tokenizer=_Tok(), scan="x").read_text())
    assert one["links"] == two["links"] and len(one["links"]) > 0
    assert [n["node_id"] for n in one["nodes"]] == [n["node_id"] for n in two["nodes"]]
    for a, b in zip(one["nodes"], two["nodes"], strict=True):
        assert (a["influence"] is None) == (b["influence"] is None)
        if a["influence"] is not None:
            assert a["influence"] == pytest.approx(b["influence"], rel=1e-5, abs=1e-6)


def test_sparse_graph_page_data_is_the_dense_ones(graphs) -> None:  # type: ignore[no-untyped-def]
    dense, sparse = graphs
    one, two = page_data(dense, slug="s"), page_data(sparse, slug="s")
    assert one["edges"] == two["edges"] and len(one["edges"]) > 0
    for key in ("n_graph_nodes", "n_graph_edges", "n_kept_edges", "node_max", "max_nodes_cut"):
        assert one[key] == two[key], key
    assert [n["id"] for n in one["nodes"]] == [n["id"] for n in two["nodes"]]
    for a, b in zip(one["nodes"], two["nodes"], strict=True):
        assert a["influence"] == pytest.approx(b["influence"], rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("seed", range(30))
def test_random_sparse_graphs_prune_as_dense(seed: int, tmp_path) -> None:  # type: ignore[no-untyped-def]
    dense = random_graph(seed)
    for nt, et in ((0.8, 0.98), (0.6, 0.5), (0.8, 0.7), (0.6, 0.9)):  # low edge thresholds: the clean-up works
        assert_prunes_alike(dense, csr_of(dense), nt, et)
    coo = dataclasses.replace(dense, adjacency_matrix=dense.adjacency_matrix.to_sparse())  # any sparse layout
    assert torch.equal(prune_graph(coo).edge_mask.to_dense(), prune_graph(dense).edge_mask)
    one = to_json(dense, tmp_path / "d.json", slug="s", tokenizer=_Tok()).read_text()
    assert (
        json.loads(to_json(csr_of(dense), tmp_path / "s.json", slug="s", tokenizer=_Tok()).read_text())["links"]
        == json.loads(one)["links"]
    )
    d, s = page_data(dense, slug="s"), page_data(csr_of(dense), slug="s")
    assert d["edges"] == s["edges"] and d["n_graph_edges"] == s["n_graph_edges"]


def test_random_float64_and_unsigned_graphs_prune_as_dense() -> None:
    for seed in range(10):
        assert_prunes_alike(random_graph(seed, dtype=torch.float64), csr_of(random_graph(seed, dtype=torch.float64)))
        unsigned = random_graph(seed, signed=False, density=0.2)
        assert_prunes_alike(unsigned, csr_of(unsigned), 0.6, 0.9)


def test_row_pieces_assemble_runs_in_any_order() -> None:
    g = torch.Generator().manual_seed(0)
    full = torch.randn(9, 9, generator=g) * (torch.rand(9, 9, generator=g) < 0.4)
    full[3:5] = 0  # rows never written stay empty
    pieces = RowPieces(9)
    for start, end in ((5, 9), (0, 2), (2, 3)):
        pieces.add(start, full[start:end, :7])  # columns past the rows' width are zero
    full[:, 7:] = 0
    adj = pieces.to_csr()
    assert torch.equal(adj.to_dense(), full)
    assert not pieces.pieces  # freed as copied


def test_layout_follows_the_memory_available(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """None: dense where it fits, else sparse where that fits, else a refusal naming both layouts; True and
    False force (a refusal names the forced layout); sparse=True with a subset of features is refused."""
    tcs = shipped_transcoders(model)
    dense = attribute(model, PROMPT, tcs, sparse=False)
    n, nnz = dense.adjacency_matrix.shape[0], int((dense.adjacency_matrix != 0).sum())
    assert attribute(model, PROMPT, tcs).adjacency_matrix.layout == torch.strided  # fits here
    monkeypatch.setattr(attribute_module, "_available_bytes", lambda: 4 * n * n - 1)
    auto = attribute(model, PROMPT, tcs)
    assert auto.adjacency_matrix.layout == torch.sparse_csr
    assert torch.equal(auto.adjacency_matrix.to_dense(), dense.adjacency_matrix)
    with pytest.raises(ValueError, match=r"GiB of dense matrices .* max_feature_nodes=\d+"):
        attribute(model, PROMPT, tcs, sparse=False)
    monkeypatch.setattr(attribute_module, "_available_bytes", lambda: 8 * nnz // 2)
    for sparse in (None, True):
        with pytest.raises(ValueError, match=r"GiB sparse \(at most; .* GiB dense\) .* max_feature_nodes=\d+"):
            attribute(model, PROMPT, tcs, sparse=sparse)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"sparse=True with max_feature_nodes=5 .* every active feature"):
        attribute(model, PROMPT, tcs, sparse=True, max_feature_nodes=5)
    assert attribute(model, PROMPT, tcs, sparse=True, max_feature_nodes=10**6).adjacency_matrix.is_sparse_csr
    with pytest.raises(TypeError, match=r"sparse='yes': expected True, False or None"):
        attribute(model, PROMPT, tcs, sparse="yes")  # type: ignore[arg-type]


def test_as_csr_keeps_a_csr_and_converts_coo() -> None:
    dense = random_graph(3).adjacency_matrix
    csr = dense.to_sparse_csr()
    assert as_csr(csr) is csr
    assert torch.equal(as_csr(dense.to_sparse()).to_dense(), dense)


def test_a_graph_too_large_for_dense_prunes_and_renders_sparse(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """30,000 features on one position (3.6 GB dense, 60,000 non-zeros): pruned, scored, written and put in a
    page without any [n_nodes, n_nodes] dense tensor (to_dense is refused while they run)."""
    from interp_gpt import Config
    from interp_gpt.attribution import AttributionGraph, LogitTarget
    from interp_gpt.attribution.sparse import csr

    n_f = 30_000
    n = n_f + 2 + 2 + 1  # features, errors (1 layer x 2 positions), embeddings, one logit
    g = torch.Generator().manual_seed(0)
    rows = torch.cat([torch.arange(n_f), torch.full((n_f + 1,), n - 1)])
    cols = torch.cat([torch.full((n_f,), n_f + 3), torch.arange(n_f), torch.tensor([n_f + 3])])
    crow = torch.zeros(n + 1, dtype=torch.long)
    crow[1:] = torch.bincount(rows, minlength=n).cumsum(0)
    values = torch.rand(rows.shape[0], generator=g) + 0.01
    graph = AttributionGraph(
        input_string="",
        input_tokens=torch.tensor([0, 1]),
        logit_targets=[LogitTarget("x", 3)],
        logit_probabilities=torch.tensor([0.9]),
        active_features=torch.stack([torch.zeros(n_f), torch.ones(n_f), torch.arange(n_f)], 1).long(),
        activation_values=torch.ones(n_f),
        selected_features=torch.arange(n_f),
        adjacency_matrix=csr(crow.int(), cols.int(), values, n),
        cfg=Config(n_layers=1, d_model=8, n_heads=2, d_vocab=50, n_ctx=8),
        scan="big",
    )

    def refuse(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError(f"to_dense of a {tuple(self.shape)} tensor")

    monkeypatch.setattr(torch.Tensor, "to_dense", refuse)
    node_mask, edge_mask, _ = prune_graph(graph)  # to_json's thresholds
    assert edge_mask.is_sparse_csr and 0 < int(node_mask[:n_f].sum()) < n_f
    replacement, completeness = compute_graph_scores(graph)
    assert replacement == pytest.approx(1.0) and completeness == pytest.approx(1.0)
    written = json.loads(to_json(graph, tmp_path / "g.json", slug="s", tokenizer=_Tok()).read_text())
    assert len(written["links"]) == int(edge_mask.values().sum())
    assert page_data(graph, slug="s", max_nodes=100, node_threshold=0.5)["n_graph_edges"] == rows.shape[0]
