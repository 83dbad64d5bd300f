"""The attribution graph page (`interp_gpt.attribution.graph_page`) without a browser: the data it embeds
(which nodes, every edge among them, each node's numbers, promoted tokens and contexts against direct
computations), the pruning rule it carries (rerun here in Python on the embedded data only, it gives
`prune_graph`'s masks), escaping, and bad inputs. tests/test_attribution_viewer_browser.py runs the page."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.attribution import attribute, graph_page, prune_graph
from interp_gpt.attribution.graph_json import graph_json
from interp_gpt.attribution.viewer import _ASSETS, page_data, render_page
from interp_gpt.sae.training import shipped_clt, shipped_transcoders, split_corpus, token_windows
from interp_gpt.sae.transcoders.transcoder import Transcoder

REPO = Path(__file__).resolve().parents[1]
PROMPT = "The cat sat on the mat because"
HOSTILE = ["<script>alert(1)</script>", '<img src=x onerror="alert(2)">', "</script><b>x</b>", "<!--"]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return GPT.from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module")
def tcs(model):
    return shipped_transcoders(model)


@pytest.fixture(scope="module")
def graph(model, tcs):
    return attribute(model, PROMPT, tcs)


@pytest.fixture(scope="module")
def windows(model):
    return token_windows(model, split_corpus(REPO / "data" / "corpus")[1], context_size=32, max_windows=8)


def f32(x: float) -> float:
    return float(np.float32(x))


def page_prune(data: dict, nt: float, et: float) -> tuple[set[str], set[tuple[str, str]]]:
    """prune_graph's rule on the page's data alone (what the page's script computes): (node ids, edges)."""
    nodes = data["nodes"]
    n = len(nodes)
    infl = torch.tensor([f32(x["influence"]) for x in nodes], dtype=torch.float64)
    cum = [f32(x["cumulative"]) for x in nodes]
    always = torch.tensor([x["kind"] in ("embedding", "logit") for x in nodes])
    rank = sorted(range(n), key=lambda i: (cum[i], -float(infl[i])))
    cut = next((infl[i] for i in rank if cum[i] >= f32(nt)), infl[rank[-1]])
    keep = always | (infl >= cut)
    e = data["edges"]
    src, tgt = torch.tensor(e[0::3], dtype=torch.long), torch.tensor(e[1::3], dtype=torch.long)
    adj = torch.zeros(n, n, dtype=torch.float64)
    adj[tgt, src] = torch.tensor([abs(f32(w)) for w in e[2::3]], dtype=torch.float64)
    adj[~keep] = 0
    adj[:, ~keep] = 0
    norm = adj / adj.sum(1, keepdim=True).clamp(min=1e-10)
    logit_w = torch.tensor([x.get("prob", 0.0) if x["kind"] == "logit" else 0.0 for x in nodes], dtype=torch.float64)
    target, current = logit_w.clone(), logit_w.clone()
    while bool((current := current @ norm).any()):
        target += current
    scores = norm * target[:, None]
    ordered = scores[scores > 0].sort(descending=True).values
    share = torch.cumsum(ordered, 0) / ordered.sum()
    edge = scores >= ordered[min(int((share < f32(et)).sum()), len(ordered) - 1)]
    edge &= scores > 0
    feature = torch.tensor([x["kind"] == "feature" for x in nodes])
    while True:
        after = keep & (always | edge.any(0)) & (~feature | edge.any(1))
        if torch.equal(after, keep):
            break
        keep = after
        edge &= keep[:, None] & keep[None, :]
    ids = [x["id"] for x in nodes]
    t, s = edge.nonzero(as_tuple=True)
    return {ids[i] for i in keep.nonzero().flatten().tolist()}, {
        (ids[a], ids[b]) for b, a in zip(t.tolist(), s.tolist(), strict=True)
    }


def node_ids(graph, model) -> list[str]:
    """Every node's id, as to_json names it (a JSON written at thresholds 1.0 holds them all)."""
    n_features, n_layers, n_pos = graph.n_features, graph.cfg.n_layers, graph.n_pos
    ids = []
    for i in range(graph.adjacency_matrix.shape[0]):
        if i < n_features:
            layer, pos, feat = graph.active_features[graph.selected_features[i]].tolist()
            ids.append(f"{layer}_{feat}_{pos}")
        elif i < n_features + n_layers * n_pos:
            layer, pos = divmod(i - n_features, n_pos)
            ids.append(f"err_{layer}_{pos}")
        elif i < n_features + (n_layers + 1) * n_pos:
            pos = i - n_features - n_layers * n_pos
            ids.append(f"E_{int(graph.input_tokens[pos])}_{pos}")
        else:
            k = i - n_features - (n_layers + 1) * n_pos
            ids.append(f"{n_layers + 1}_{graph.logit_targets[k].vocab_idx}_{n_pos - 1}")
    return ids


def pruned_sets(graph, model, nt: float, et: float) -> tuple[set[str], set[tuple[str, str]]]:
    node_mask, edge_mask, _ = prune_graph(graph, nt, et)
    ids = node_ids(graph, model)
    t, s = edge_mask.nonzero(as_tuple=True)
    return {ids[i] for i in node_mask.nonzero().flatten().tolist()}, {
        (ids[a], ids[b]) for b, a in zip(t.tolist(), s.tolist(), strict=True)
    }


def test_node_ids_are_to_jsons(graph, model):
    data = graph_json(graph, slug="x", tokenizer=model.tokenizer, scan="s", node_threshold=0.9, edge_threshold=0.99)
    assert {n["node_id"] for n in data["nodes"]} <= set(node_ids(graph, model))


def test_the_page_holds_the_influential_nodes_and_every_edge_among_them(graph, model, tcs):
    data = page_data(graph, model=model, transcoders=tcs)
    ids = node_ids(graph, model)
    held = [ids.index(n["id"]) for n in data["nodes"]]
    assert held == sorted(held) and len(held) < len(ids)  # bounded: not every node
    # every node prune_graph keeps up to the node slider's top (here 0.99) is held, with its edges
    nodes_99, _ = pruned_sets(graph, model, 0.99, 0.999)
    assert nodes_99 <= {n["id"] for n in data["nodes"]}
    sub = graph.adjacency_matrix[held][:, held]
    e = data["edges"]
    assert len(e) // 3 == int((sub != 0).sum())
    got = torch.zeros_like(sub)
    got[e[1::3], e[0::3]] = torch.tensor(e[2::3], dtype=sub.dtype)
    assert torch.equal(got, sub)  # float32 in 9 digits reads back exactly
    # the numbers of each kind of node
    n_layers = graph.cfg.n_layers
    tokens = model.tokenizer.decode_each(graph.input_tokens.tolist())
    assert data["tokens"] == tokens and data["prompt"] == graph.input_string
    for node, i in zip(data["nodes"], held, strict=True):
        if node["kind"] == "feature":
            layer, pos, feat = graph.active_features[graph.selected_features[i]].tolist()
            assert (node["layer"], node["pos"], node["feature"]) == (layer, pos, feat)
            assert f32(node["activation"]) == float(graph.activation_values[graph.selected_features[i]])
        elif node["kind"] == "logit":
            k = i - (len(ids) - graph.n_logits)
            assert node["token"] == graph.logit_targets[k].token_str and node["layer"] == n_layers
            assert f32(node["prob"]) == float(graph.logit_probabilities[k])
        elif node["kind"] == "embedding":
            assert node["token"] == tokens[node["pos"]] and node["layer"] == -1
    kinds = [n["kind"] for n in data["nodes"]]
    assert kinds.count("embedding") == graph.n_pos and kinds.count("logit") == graph.n_logits
    assert "error" in kinds and data["node_max"] == 0.99 and not data["max_nodes_cut"]


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_the_pages_rule_on_its_own_data_is_prune_graphs(kind, model, tcs, graph):
    if kind == "clt":
        graph = attribute(model, "When Mary and John went to the store, John gave a drink to", shipped_clt())
    data = page_data(graph)
    for nt in (0.3, 0.6, 0.8, 0.9, 0.95, 0.99):
        for et in (0.5, 0.7, 0.8, 0.9, 0.98, 0.99, 0.999):
            got, want = page_prune(data, nt, et), pruned_sets(graph, model, nt, et)
            if got != want:  # only an edge whose cumulative score ties the threshold to float32 rounding
                lo, hi = (pruned_sets(graph, model, nt, et + d)[1] for d in (-1e-6, 1e-6))
                assert got[0] == want[0] and lo <= got[1] <= hi and len(got[1] ^ want[1]) <= 2, (nt, et)


def test_max_nodes_bounds_the_page_and_the_node_slider(graph, model):
    data = page_data(graph, max_nodes=10, node_threshold=0.5)
    inner = [n for n in data["nodes"] if n["kind"] in ("feature", "error")]
    assert 0 < len(inner) <= 10 and data["max_nodes_cut"]  # the 10 best ranked hold embeddings too
    top = data["node_max"]
    assert 0.5 <= top < 0.99
    for nt in (0.5, top):  # exact up to the slider's top
        for et in (0.9, 0.98):
            assert page_prune(data, nt, et) == pruned_sets(graph, model, nt, et)
    with pytest.raises(ValueError, match=r"node_threshold=0.8 needs more than max_nodes=10"):
        page_data(graph, max_nodes=10)


def test_promoted_tokens_and_contexts_are_the_features_own(graph, model, tcs, windows):
    data = page_data(graph, model=model, transcoders=tcs, contexts=windows, n_tokens=5, n_contexts=3)
    features = [n for n in data["nodes"] if n["kind"] == "feature"]
    assert features and all(len(n["promoted"]) == 5 and len(n["suppressed"]) == 5 for n in features)
    for node in features[:6]:
        tc = tcs[node["layer"]]
        logits = (tc.W_dec[node["feature"]] @ model.W_U).detach()
        up = logits.topk(5)
        assert [t for t, _ in node["promoted"]] == model.tokenizer.decode_each(up.indices.tolist())
        assert [v for _, v in node["promoted"]] == pytest.approx(up.values.tolist(), rel=1e-3)
        assert node["suppressed"][0][1] == pytest.approx(float(logits.min()), rel=1e-3)
        _, cache = model.run_with_cache(windows, names_filter=[tc.input_hook], return_type=None)
        acts = tc.encode(cache[tc.input_hook])[..., node["feature"]].detach()
        acts[:, 0] = 0  # the BOS: left out
        contexts = node["contexts"]
        if float(acts.max()) <= 0:
            assert contexts == []
            continue
        assert contexts[0]["max"] == pytest.approx(float(acts.max()), rel=1e-3)
        assert [c["max"] for c in contexts] == sorted((c["max"] for c in contexts), reverse=True)
        for c in contexts:
            assert c["acts"][c["pos"]] == c["max"] and len(c["tokens"]) == len(c["acts"])
    without = page_data(graph, model=model)  # no transcoders: no feature details
    assert not any("promoted" in n or "contexts" in n for n in without["nodes"])


def test_the_page_is_one_offline_file_and_every_string_stays_text(graph, model, tcs, tmp_path):
    page = graph_page(graph, tmp_path / "sub" / "graph.html", model=model, transcoders=tcs)
    text = page.read_text(encoding="utf-8")
    assert page == tmp_path / "sub" / "graph.html"
    assert '<meta http-equiv="Content-Security-Policy" content="default-src \'none\';' in text
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", text)  # nothing loaded from anywhere
    assert text.count("<script") == 2  # the data block and the page's script

    data = page_data(graph, model=model, slug=HOSTILE[0], title=HOSTILE[1])
    data["prompt"] = "".join(HOSTILE)
    data["tokens"] = [HOSTILE[i % len(HOSTILE)] for i in range(len(data["tokens"]))]
    for node in data["nodes"]:
        if "token" in node:
            node["token"] = HOSTILE[2]
    hostile = render_page(data)
    block = re.search(r'<script type="application/json" id="graph-data">(.*?)</script>', hostile, re.S)
    assert block and json.loads(block.group(1)) == data  # the data reads back whole
    assert "<" not in block.group(1) and ">" not in block.group(1)
    assert hostile.count("<script") == 2 and hostile.count("</script>") == 2
    assert f"<title>{html.escape(HOSTILE[1])}: {html.escape(HOSTILE[0])}</title>" in hostile
    assert "<img" not in hostile and "<b>" not in hostile and "<!--" not in hostile
    # the script puts strings in as text only: no HTML parser, no eval
    script = (_ASSETS / "graph_viewer.js").read_text(encoding="utf-8")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(", "srcdoc"):
        assert sink not in script, sink


def test_the_assets_ship_with_the_package():
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["interp_gpt"]
    package = REPO / "interp_gpt"
    covered = {p for pattern in patterns for p in package.glob(pattern) if p.is_file()}
    assets = sorted(p for p in _ASSETS.iterdir() if p.is_file())
    assert [a.name for a in assets] == ["graph_viewer.css", "graph_viewer.js"]
    assert all(a in covered for a in assets)


def test_bad_inputs_name_the_argument(graph, model, tcs, windows, tmp_path):
    out = tmp_path / "g.html"
    cases = [
        (dict(graph="graph"), TypeError, r"graph_page: graph must be an AttributionGraph"),
        (dict(path=3), TypeError, r"graph_page: path must be a file path"),
        (dict(node_threshold=1.5), ValueError, r"graph_page: node_threshold=1.5 is out of range"),
        (dict(node_threshold=0.995), ValueError, r"node_threshold=0.995 is out of range: .* <= 0.99"),
        (dict(edge_threshold=1.0), ValueError, r"graph_page: edge_threshold=1.0 is out of range: .* <= 0.999"),
        (dict(max_node_threshold=0), ValueError, r"max_node_threshold=0 is out of range"),
        (dict(max_nodes=0), ValueError, r"graph_page: max_nodes=0 is out of range"),
        (dict(n_contexts=True), TypeError, r"n_contexts"),
        (dict(slug=""), ValueError, r"graph_page: slug='': expected a non-empty string"),
        (dict(title=3), TypeError, r"graph_page: title=3"),
        (dict(model="gpt2"), TypeError, r"graph_page: model: expected a GPT"),
        (dict(transcoders=tcs), ValueError, r"graph_page: transcoders needs model"),
        (dict(model=model, contexts=windows), ValueError, r"graph_page: contexts needs transcoders"),
        (dict(model=model, transcoders=tcs, contexts=windows.float()), TypeError, r"graph_page: contexts: expected token ids"),
        (dict(model=model, transcoders=tcs, contexts=windows[0]), TypeError, r"contexts: expected token ids \[n_windows, pos\]"),
        (dict(model=model, transcoders=tcs, contexts=windows + 10**6), ValueError, r"graph_page: contexts: token id \d+ at \[window, pos\]"),
        (dict(model=model, transcoders=tcs[:1]), ValueError, r"graph_page: transcoders: none for layers \[1\]"),
        (dict(model=model, transcoders="tcs"), TypeError, r"graph_page: transcoders: expected a list of Transcoder"),
        (dict(model=GPT(Config(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=32))), ValueError,
         r"graph_page: model has 2 layers and a 100-token vocabulary; the graph was made on 2 layers and \d+ tokens"),
    ]  # fmt: skip
    for kwargs, error, message in cases:
        args = {"graph": graph, "path": out, **kwargs}
        with pytest.raises(error, match=message):
            graph_page(args.pop("graph"), args.pop("path"), **args)
    assert not out.exists()  # nothing written by a refused call


def test_transcoders_with_too_few_features_are_refused(graph, model, tcs, tmp_path):
    """Transcoders cut to their first 4 features cannot show the graph's features (ids up to ~1000)."""
    small = []
    for tc in tcs:
        cut = Transcoder(dataclasses.replace(tc.cfg, d_sae=4))
        with torch.no_grad():
            for name, p in cut.named_parameters():
                full = getattr(tc, name)
                p.copy_(full[:, :4] if name == "W_enc" else full[:4] if full.shape[0] == tc.d_sae else full)
        small.append(cut)
    with pytest.raises(ValueError, match=r"graph_page: the graph has feature \d+ at layer \d but transcoders has 4"):
        graph_page(graph, tmp_path / "g.html", model=model, transcoders=small)


def test_the_docstring_example_runs(tmp_path, monkeypatch):
    import doctest
    import importlib

    (tmp_path / "data").symlink_to(REPO / "data")  # the example reads data/corpus, as from a checkout
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module("interp_gpt.attribution.viewer")  # (the package's `graph_page` is the function)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = doctest.DocTestFinder(recurse=False).find(module)
    assert sum(len(t.examples) for t in tests) >= 7
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
    data = json.loads(
        re.search(r'id="graph-data">(.*?)</script>', (tmp_path / "graph.html").read_text(encoding="utf-8"), re.S).group(
            1
        )
    )
    assert any(n.get("contexts") for n in data["nodes"])
