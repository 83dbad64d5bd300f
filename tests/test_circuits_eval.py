"""interp_gpt.circuits' circuits: top-k / threshold selection, pruning, faithfulness (against the
brute-force patching reference of tests/circuit_refs.py), faithfulness curves, ACDC (against a
plain sequential ACDC written here on `patch_edges`), and the circuit figure's data."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from interp_gpt import Config
from interp_gpt.circuits import Circuit, Graph, acdc, faithfulness, faithfulness_curve, patch_edges
from interp_gpt.plots import circuit_graph, circuit_page, faithfulness_plot

sys.path.insert(0, str(Path(__file__).resolve().parent))
from circuit_refs import brute_patch, random_model, sender_values  # noqa: E402

TWO = Config(n_layers=2, d_model=36, n_heads=3, d_vocab=60, n_ctx=16)


def tokens(seed: int, shape: tuple[int, int] = (2, 6)) -> torch.Tensor:
    return torch.randint(0, TWO.d_vocab, shape, generator=torch.Generator().manual_seed(seed))


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3].mean() - logits[:, -1, 5].mean()


@pytest.fixture(scope="module")
def setup():  # type: ignore[no-untyped-def]
    return random_model(TWO, seed=3), tokens(1), tokens(2)


# ----------------------------------------------------------------------------
# selection and pruning
# ----------------------------------------------------------------------------
def test_top_k_and_threshold_pick_the_largest_scores():
    g = Graph(TWO)
    scores = torch.zeros(g.n_edges)
    picks = {"input -> a0.h1<k>": 5.0, "a0.h2 -> m1": -4.0, "m1 -> logits": 3.0, "a1.h0 -> logits": 0.5}
    for name, v in picks.items():
        scores[g.edge_index(name)] = v
    assert set(Circuit.top_k(g, scores, 2).edges) == {"input -> a0.h1<k>", "a0.h2 -> m1"}
    assert set(Circuit.top_k(g, scores, 2, absolute=False).edges) == {"input -> a0.h1<k>", "m1 -> logits"}
    assert set(Circuit.above(g, scores, 1.0).edges) == {"input -> a0.h1<k>", "a0.h2 -> m1", "m1 -> logits"}
    assert set(Circuit.above(g, scores, 1.0, absolute=False).edges) == {"input -> a0.h1<k>", "m1 -> logits"}
    assert Circuit.top_k(g, scores, 0).n_edges == 0 and Circuit.top_k(g, scores, g.n_edges).n_edges == g.n_edges
    nan = scores.clone()
    nan[0] = float("nan")
    assert g.edge_name(0) not in Circuit.top_k(g, nan, 3).edges  # NaN (not scored) ranks last


def test_bad_selection_inputs_are_refused_clearly():
    g = Graph(TWO)
    with pytest.raises(ValueError, match=r"k=999 is out of range"):
        Circuit.top_k(g, torch.zeros(g.n_edges), 999)
    with pytest.raises(ValueError, match=rf"scores must be a float tensor \[{g.n_edges}\]"):
        Circuit.top_k(g, torch.zeros(5), 2)
    with pytest.raises(KeyError, match="did you mean"):
        Circuit(g, ["a0.h0 -> a1.h9<k>"])


def test_pruning_drops_dangling_edges_and_keeps_complete_paths():
    g = Graph(TWO)
    path = ["input -> a0.h0<v>", "a0.h0 -> a1.h2<q>", "a1.h2 -> logits", "input -> logits"]
    dangling = [
        "input -> a0.h1<q>",  # a0.h1 sends nothing on: dead end
        "a0.h0 -> a1.h1<v>",  # a1.h1 reaches nothing
        "a1.h0 -> m1",  # a1.h0 gets no input, and m1 sends nothing
    ]
    c = Circuit(g, path + dangling)
    assert set(c.pruned().edges) == set(path)
    # a chain cut in the middle vanishes whole
    assert Circuit(g, ["input -> a0.h0<q>", "a1.h2 -> logits"]).pruned().edges == []
    assert set(c.pruned().nodes) == {"input", "a0.h0", "a1.h2", "logits"}


# ----------------------------------------------------------------------------
# faithfulness
# ----------------------------------------------------------------------------
def test_full_circuit_is_exactly_one_and_empty_exactly_zero(setup):  # type: ignore[no-untyped-def]
    model, clean, corrupted = setup
    g = Graph(TWO)
    assert faithfulness(model, clean, corrupted, Circuit(g, torch.ones(g.n_edges, dtype=torch.bool)), metric) == 1.0
    assert faithfulness(model, clean, corrupted, Circuit(g), metric) == 0.0
    assert faithfulness(model, clean, corrupted, [], metric) == 0.0


def test_faithfulness_equals_brute_force_patching(setup):  # type: ignore[no-untyped-def]
    model, clean, corrupted = setup
    g = Graph(TWO)
    keep = torch.randperm(g.n_edges, generator=torch.Generator().manual_seed(0))[:40]
    names = [g.edge_name(int(i)) for i in keep]
    other = sender_values(model, corrupted)
    rest = [n for n in g.edge_names if n not in names]

    def m(edges: list[str]) -> float:
        return float(metric(brute_patch(model, clean, other, edges)))

    want = (m(rest) - m(g.edge_names)) / (m([]) - m(g.edge_names))
    got = faithfulness(model, clean, corrupted, Circuit(g, names), metric)
    assert abs(got - want) < 1e-5, (got, want)
    assert 0.02 < abs(want) and abs(want - 1) > 0.02  # a circuit in between: the test can fail
    # With corrupted tokens the empty circuit is the corrupted run: transformer-lens 4.3's definition.
    with torch.no_grad():
        tl_style = (m(rest) - float(metric(model(corrupted)))) / (
            float(metric(model(clean))) - float(metric(model(corrupted)))
        )
    assert abs(got - tl_style) < 1e-5


def test_faithfulness_curve_matches_single_circuits_and_brute_force(setup):  # type: ignore[no-untyped-def]
    model, clean, corrupted = setup
    g = Graph(TWO)
    scores = torch.randn(g.n_edges, generator=torch.Generator().manual_seed(4))
    ks = [0, 5, 17, 60, g.n_edges]
    curve = faithfulness_curve(model, clean, corrupted, scores, metric, ks, progress=False)
    assert curve.n_edges == ks and curve.faithfulness[0] == 0.0 and curve.faithfulness[-1] == 1.0
    order = scores.abs().argsort(descending=True)
    for k, f in zip(ks[1:-1], curve.faithfulness[1:-1].tolist(), strict=True):
        c = Circuit(g, order[:k])
        assert abs(f - faithfulness(model, clean, corrupted, c, metric)) < 1e-5
    # the raw metric of the top-17 circuit is the brute-force run with the other edges patched
    other = sender_values(model, corrupted)
    top = {g.edge_name(int(i)) for i in order[:17]}
    want = float(metric(brute_patch(model, clean, other, [n for n in g.edge_names if n not in top])))
    assert abs(float(curve.metric[2]) - want) < 1e-5
    pruned = faithfulness_curve(model, clean, corrupted, scores, metric, [17], prune=True, progress=False)
    want_p = faithfulness(model, clean, corrupted, Circuit(g, order[:17]).pruned(), metric)
    assert abs(float(pruned.faithfulness[0]) - want_p) < 1e-5


def test_faithfulness_refuses_an_undefined_ratio_and_circuits_of_other_graphs(setup):  # type: ignore[no-untyped-def]
    model, clean, corrupted = setup
    with pytest.raises(ValueError, match="faithfulness is undefined"):
        faithfulness(model, clean, clean, [], metric)
    other = Graph(Config(n_layers=3, d_model=36, n_heads=3, d_vocab=60, n_ctx=16))
    with pytest.raises(ValueError, match="circuit of another graph"):
        faithfulness(model, clean, corrupted, Circuit(other), metric)


# ----------------------------------------------------------------------------
# ACDC
# ----------------------------------------------------------------------------
def sequential_acdc(model, clean, corrupted, tau):  # type: ignore[no-untyped-def]
    """ACDC as written in the paper, one plain `patch_edges` run per try."""
    g = Graph(TWO)
    mask = torch.ones(g.n_edges, dtype=torch.bool)

    def value(m: torch.Tensor) -> float:
        return float(patch_edges(model, clean, corrupted, [~m], metric, progress=False)[0])

    current = value(mask)
    for r in reversed(range(len(g.receivers))):
        rec = g.receivers[r]
        node = (
            None
            if rec.kind == "logits"
            else (g.mlp_sender(rec.layer) if rec.kind == "mlp" else g.head_sender(rec.layer, rec.head))
        )
        edges = list(range(g.receiver_offsets[r], g.receiver_offsets[r] + g.receiver_n_senders[r]))
        if node is not None and not bool(mask[g.edge_sender == node].any()):
            mask[edges] = False
            continue
        for e in reversed(edges):
            mask[e] = False
            v = value(mask)
            if abs(v - current) < tau:
                current = v
            else:
                mask[e] = True
    return Circuit(g, mask).pruned()


def test_acdc_batched_makes_the_sequential_algorithms_decisions(setup):  # type: ignore[no-untyped-def]
    model, clean, corrupted = setup
    g = Graph(TWO)
    effects = patch_edges(model, clean, corrupted, [[i] for i in range(g.n_edges)], metric, progress=False)
    with torch.no_grad():
        tau = float((effects - float(metric(model(clean)))).abs().median())
    got = acdc(model, clean, corrupted, metric, tau, progress=False)
    want = sequential_acdc(model, clean, corrupted, tau)
    assert 0 < got.n_edges < g.n_edges  # some kept, some removed: the walk's branches all ran
    assert got.edges == want.edges


def test_acdc_keeps_a_planted_path():
    """Every head but a0.h1 and a1.h2 writes nothing (W_O = 0), the MLPs too (W_out = 0): what
    matters runs input -> a0.h1 -> a1.h2 -> logits (and input -> logits)."""
    model = random_model(TWO, seed=5)
    with torch.no_grad():
        for layer, block in enumerate(model.blocks):
            block.mlp.W_out.zero_()
            for h in range(TWO.n_heads):
                if (layer, h) not in ((0, 1), (1, 2)):
                    block.attn.W_O[h].zero_()
    clean, corrupted = tokens(7), tokens(8)
    c = acdc(model, clean, corrupted, metric, tau=1e-6, progress=False)
    live = {"input", "a0.h1", "a1.h2", "logits"}
    for e in c.edges:
        s, r = (x.strip() for x in e.split("->"))
        assert s in live and r.split("<")[0] in live, e
    assert "a1.h2 -> logits" in c.edges and "input -> logits" in c.edges
    assert any(e.startswith("a0.h1 -> a1.h2<") for e in c.edges), c.edges
    assert abs(faithfulness(model, clean, corrupted, c, metric) - 1) < 1e-4


# ----------------------------------------------------------------------------
# pictures
# ----------------------------------------------------------------------------
def test_circuit_figure_data_widths_colours_and_names():
    g = Graph(TWO)
    scores = torch.zeros(g.n_edges)
    chosen = {"a0.h0 -> a1.h2<q>": 2.0, "a0.h0 -> a1.h2<k>": -4.0, "a0.h1 -> a1.h0<v>": 1.0, "a1.h2 -> logits": 0.5}
    for n, v in chosen.items():
        scores[g.edge_index(n)] = v
    c = Circuit.top_k(g, scores, 4)
    fig = circuit_graph(c)
    edges = {t.meta: t for t in fig.data if t.meta}
    assert set(edges) == set(chosen)
    widths = {n: edges[n].line.width for n in chosen}
    # width grows with |score| (the sign does not matter)
    assert sorted(chosen, key=lambda n: abs(chosen[n])) == sorted(widths, key=lambda n: widths[n])
    ratio = (widths["a0.h0 -> a1.h2<k>"] - widths["a1.h2 -> logits"]) / (
        widths["a0.h0 -> a1.h2<q>"] - widths["a1.h2 -> logits"]
    )
    assert abs(ratio - (4 - 0.5) / (2 - 0.5)) < 1e-9  # linear in |score|
    colours = {n: edges[n].line.color for n in chosen}
    assert len({colours["a0.h0 -> a1.h2<q>"], colours["a0.h0 -> a1.h2<k>"], colours["a0.h1 -> a1.h0<v>"]}) == 3
    assert edges["a0.h0 -> a1.h2<q>"].name == "query" and edges["a0.h1 -> a1.h0<v>"].name == "value"
    assert "score -4" in edges["a0.h0 -> a1.h2<k>"].text[1]
    # layers top to bottom: the input's y is smallest, the logits' largest, on a reversed axis
    nodes = next(t for t in fig.data if t.name == "nodes")
    ys = dict(zip(nodes.text, nodes.y, strict=True))
    assert ys["input"] < ys["a0.h0"] < ys["a1.h2"] < ys["logits"] and fig.layout.yaxis.autorange == "reversed"


def test_faithfulness_plot_and_page_hold_the_curves(setup):  # type: ignore[no-untyped-def]
    model, clean, corrupted = setup
    g = Graph(TWO)
    scores = torch.randn(g.n_edges, generator=torch.Generator().manual_seed(4))
    curve = faithfulness_curve(model, clean, corrupted, scores, metric, [0, 10, g.n_edges], progress=False)
    fig = faithfulness_plot({"random": curve})
    assert list(fig.data[0].x) == [0, 10, g.n_edges] and list(fig.data[0].y) == curve.faithfulness.tolist()
    page = circuit_page(Circuit.top_k(g, scores, 10), {"random": curve})
    assert any(t.meta for t in page.data) and any(t.name == "random" for t in page.data)
    with pytest.raises(TypeError, match="curves must be a FaithfulnessCurve"):
        faithfulness_plot([1, 2])


def test_readme_circuit_example_runs_and_means_what_it_says(tmp_path: Path) -> None:
    """The second python block of the README's Circuits section, after the first (which sets up
    the model, tokens, metric and scores)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    body = text.split("\n## Circuits\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    assert len(blocks) >= 2, "README's Circuits section lost its circuit example"
    page = tmp_path / "circuit.html"
    ns: dict = {}
    exec(compile(blocks[0], "README.md (Circuits 1)", "exec"), ns)
    exec(compile(blocks[1].replace('"circuit.html"', repr(str(page))), "README.md (Circuits 2)", "exec"), ns)
    assert 0 < ns["circuit"].n_edges <= 36 and page.is_file()
    f = faithfulness(ns["model"], ns["clean"], ns["corrupted"], ns["circuit"], ns["metric"])
    bottom = Circuit(ns["graph"], ns["eap_ig"].abs().argsort()[:36])  # the 36 lowest-scored edges
    f_bottom = faithfulness(ns["model"], ns["clean"], ns["corrupted"], bottom, ns["metric"])
    assert f > 0.3 and f > f_bottom + 0.3, (f, f_bottom)  # the top edges carry much of the metric, the bottom ones not
    curve = ns["curve"]
    assert curve.faithfulness[0] == 0.0 and curve.faithfulness[-1] == 1.0
    assert 0 < ns["greedy"].n_edges < ns["graph"].n_edges
