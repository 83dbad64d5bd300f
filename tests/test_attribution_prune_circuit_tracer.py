"""prune_graph, compute_graph_scores and to_json equal circuit-tracer 0.5.0's own (`circuit_tracer.graph` and
`circuit_tracer.utils.create_graph_files`) on random attribution graphs, and our JSON validates against its
frontend's pydantic schema.

circuit-tracer pins transformers<=4.57 and huggingface_hub<1: CI runs this module in its own venv
(.venv-ct, see .ci/run), e.g.
`PYTHONPATH=$PWD .venv-ct/bin/python -m pytest tests/test_attribution_prune_circuit_tracer.py`.

Both get the same tensors (float32: its pruning takes nothing else). Its `create_graph_files` loads a
tokenizer from the hub (`AutoTokenizer.from_pretrained(cfg.tokenizer_name)`): the test hands it a local
one instead and reads the `{slug}.json` it writes. Deliberate differences (see graph_json.py): our error node
ids are "err_{layer}_{pos}" where it writes "0_{layer}_{pos}" (which can collide with a feature's id; the
graphs here use feature indices >= n_layers, so its ids are unique and translate one to one).
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("circuit_tracer")

from circuit_tracer.attribution.targets import LogitTarget as CTLogitTarget  # noqa: E402
from circuit_tracer.frontend.graph_models import Model  # noqa: E402
from circuit_tracer.graph import Graph  # noqa: E402
from circuit_tracer.graph import compute_graph_scores as ct_compute_graph_scores  # noqa: E402
from circuit_tracer.graph import prune_graph as ct_prune_graph  # noqa: E402
from circuit_tracer.utils.create_graph_files import create_graph_files  # noqa: E402
from circuit_tracer.utils.tl_nnsight_mapping import UnifiedConfig  # noqa: E402

from interp_gpt.attribution import AttributionGraph, compute_graph_scores, prune_graph, to_json  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attribution_refs import random_graph  # noqa: E402

# the module, not the function of the same name that circuit_tracer.utils exports over it
create_graph_files_module = importlib.import_module("circuit_tracer.utils.create_graph_files")
SEEDS = range(40)
THRESHOLDS = [(0.8, 0.98), (0.5, 0.7), (1.0, 1.0), (0.3, 1.0)]


class _Tok:
    def decode(self, token: object) -> str:
        return f"<{int(token)}>&\"'"  # type: ignore[call-overload]


class _LocalAutoTokenizer:
    @staticmethod
    def from_pretrained(name: str) -> _Tok:
        assert name == "local"
        return _Tok()


def _theirs(graph: AttributionGraph) -> Graph:
    cfg = graph.cfg
    ct_cfg = UnifiedConfig(
        n_layers=cfg.n_layers, d_model=cfg.d_model, d_head=cfg.d_head, n_heads=cfg.n_heads, d_mlp=cfg.d_mlp,
        d_vocab=cfg.d_vocab, tokenizer_name="local", model_name="random", original_architecture="GPT2LMHeadModel",
    )  # fmt: skip
    return Graph(
        input_string=graph.input_string,
        input_tokens=graph.input_tokens.clone(),
        active_features=graph.active_features.clone(),
        adjacency_matrix=graph.adjacency_matrix.clone(),
        cfg=ct_cfg,
        selected_features=graph.selected_features.clone(),
        activation_values=graph.activation_values.clone(),
        logit_targets=[CTLogitTarget(t.token_str, t.vocab_idx) for t in graph.logit_targets],
        logit_probabilities=graph.logit_probabilities.clone(),
        scan=graph.scan,
    )


def _their_json(graph: Graph, slug: str, node_threshold: float, edge_threshold: float) -> dict:
    """What its `create_graph_files` writes for `graph` (its hub tokenizer swapped for a local one)."""
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        mp.setattr(create_graph_files_module, "AutoTokenizer", _LocalAutoTokenizer)
        create_graph_files(graph, slug, folder, node_threshold=node_threshold, edge_threshold=edge_threshold)
        return json.loads((Path(folder) / f"{slug}.json").read_text())


def _our_error_id(node: dict) -> str:
    if node["feature_type"] == "mlp reconstruction error":
        return f"err_{node['layer']}_{node['ctx_idx']}"
    return node["node_id"]


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "non-negative"])
@pytest.mark.parametrize("seed", SEEDS)
def test_prune_and_scores_equal_circuit_tracer(seed: int, signed: bool) -> None:
    ours = random_graph(seed, signed=signed, density=0.3 + 0.6 * (seed % 3) / 2)
    theirs = _theirs(ours)
    for node_threshold, edge_threshold in THRESHOLDS:
        mine = prune_graph(ours, node_threshold, edge_threshold)
        ref = ct_prune_graph(theirs, node_threshold, edge_threshold)
        assert mine._fields == ref._fields
        assert torch.equal(mine.node_mask, ref.node_mask)
        assert torch.equal(mine.edge_mask, ref.edge_mask)
        torch.testing.assert_close(mine.cumulative_scores, ref.cumulative_scores, rtol=1e-6, atol=1e-6)
    replacement, completeness = compute_graph_scores(ours)
    ref_replacement, ref_completeness = ct_compute_graph_scores(theirs)
    assert replacement == pytest.approx(ref_replacement, abs=1e-6)
    assert completeness == pytest.approx(ref_completeness, abs=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_json_validates_and_equals_create_graph_files(seed: int, tmp_path) -> None:
    ours = random_graph(seed, signed=seed % 2 == 0, min_feature=3)  # feature ids >= n_layers: no collision
    for node_threshold, edge_threshold in THRESHOLDS[:3]:
        path = to_json(ours, tmp_path / "g.json", slug="g", tokenizer=_Tok(),
                       node_threshold=node_threshold, edge_threshold=edge_threshold)  # fmt: skip
        mine = json.loads(path.read_text())
        Model.model_validate(mine)
        theirs = _their_json(_theirs(ours), "g", node_threshold, edge_threshold)
        their_ids = {n["node_id"]: _our_error_id(n) for n in theirs["nodes"]}
        assert len(their_ids) == len(theirs["nodes"])  # its ids are unique on these graphs
        for node in theirs["nodes"]:
            node["node_id"] = their_ids[node["node_id"]]
        for link in theirs["links"]:
            link["source"], link["target"] = their_ids[link["source"]], their_ids[link["target"]]
        assert mine["metadata"] == theirs["metadata"]
        assert mine["qParams"] == theirs["qParams"]
        assert [n["node_id"] for n in mine["nodes"]] == [n["node_id"] for n in theirs["nodes"]]
        for a, b in zip(mine["nodes"], theirs["nodes"], strict=True):
            for key in ("influence", "activation", "token_prob"):
                if b[key] is None:
                    assert a[key] is None
                else:
                    assert a[key] == pytest.approx(b[key], abs=1e-6)
            rest = {k: v for k, v in a.items() if k not in ("influence", "activation", "token_prob")}
            assert rest == {k: v for k, v in b.items() if k not in ("influence", "activation", "token_prob")}
        assert [(x["source"], x["target"]) for x in mine["links"]] == [
            (x["source"], x["target"]) for x in theirs["links"]
        ]
        assert [x["weight"] for x in mine["links"]] == [x["weight"] for x in theirs["links"]]


def test_their_error_ids_collide_where_ours_do_not(tmp_path) -> None:
    ours = random_graph(0)
    clash = None
    for seed in SEEDS:  # a graph where layer 0's feature f at pos p and layer f's error at pos p are both written
        ours = random_graph(seed)
        theirs = _their_json(_theirs(ours), "g", 1.0, 1.0)
        ids = [n["node_id"] for n in theirs["nodes"]]
        if len(set(ids)) < len(ids):
            clash = ours
            break
    assert clash is not None, "no random graph showed circuit-tracer's id collision"
    mine = json.loads(to_json(clash, tmp_path / "g.json", slug="g", tokenizer=_Tok(), node_threshold=1.0,
                              edge_threshold=1.0).read_text())  # fmt: skip
    ids = [n["node_id"] for n in mine["nodes"]]
    assert len(set(ids)) == len(ids)
    Model.model_validate(mine)
