"""interp_gpt.circuits: the edge graph, exact edge patching and path patching against brute-force
references written with plain hooks (tests/circuit_refs.py), and the bad-input errors."""

from __future__ import annotations

import dataclasses
import itertools
import sys
import warnings
from pathlib import Path

import pytest
import torch

from interp_gpt import Config, preset
from interp_gpt.circuits import (
    Circuit,
    Graph,
    acdc,
    eap_ig_scores,
    eap_scores,
    faithfulness,
    faithfulness_curve,
    patch_edges,
    path_patch,
)
from interp_gpt.plots import circuit_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
from circuit_refs import (  # noqa: E402
    all_flags,
    brute_patch,
    random_model,
    sender_names,
    sender_values,
)

TWO = Config(n_layers=2, d_model=36, n_heads=3, d_vocab=60, n_ctx=16)
FOUR = Config(n_layers=4, d_model=48, n_heads=4, d_vocab=80, n_ctx=16, d_mlp=96)
# The toy configurations: no MLPs (the classic induction-circuit setting), shortformer positions
# (added to q and k after ln1, so the residual stream starts as the token embedding alone), no
# LayerNorm, and both of the first two.
TOYS = {
    "attn-only": dict(attn_only=True),
    "shortformer": dict(positional_embedding_type="shortformer"),
    "no-norm": dict(normalization_type=None),
    "attn-only-shortformer": dict(attn_only=True, positional_embedding_type="shortformer"),
}


def tokens(cfg: Config, seed: int, shape: tuple[int, int] = (2, 6)) -> torch.Tensor:
    return torch.randint(0, cfg.d_vocab, shape, generator=torch.Generator().manual_seed(seed))


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3].mean() - logits[:, -1, 5].mean() + 0.1 * logits[:, :, 7].mean()


# ----------------------------------------------------------------------------
# the graph
# ----------------------------------------------------------------------------
def test_gpt2_small_has_32491_edges_from_the_config_alone():
    g = Graph(preset("gpt2"))
    assert g.n_edges == 32491
    assert g.n_nodes == 1 + 12 * 13 + 1  # input, 144 heads, 12 MLPs, logits
    assert len(g.edge_names) == 32491 == len(set(g.edge_names))


def _expected_edges(cfg: Config) -> set[str]:
    """Every (sender, receiver input) pair with the sender upstream, enumerated from layers."""

    def layer_of(s: str) -> int:
        return -1 if s == "input" else int(s[1:].split(".")[0])

    receivers = [(f"a{L}.h{h}<{c}>", L, False) for L in range(cfg.n_layers) for h in range(cfg.n_heads) for c in "qkv"]
    receivers += [] if cfg.attn_only else [(f"m{L}", L, True) for L in range(cfg.n_layers)]
    receivers.append(("logits", cfg.n_layers, False))
    out = set()
    for s in sender_names(cfg):
        for r, layer, is_mlp in receivers:
            if layer_of(s) < layer or (is_mlp and s.startswith("a") and layer_of(s) == layer):
                out.add(f"{s} -> {r}")
    return out


@pytest.mark.parametrize(
    "cfg",
    [TWO, FOUR, preset("distilgpt2"), dataclasses.replace(FOUR, attn_only=True)],
    ids=["2-layer", "4-layer", "distilgpt2", "4-layer-attn-only"],
)
def test_edges_are_every_sender_upstream_of_every_receiver_input(cfg):
    g = Graph(cfg)
    assert set(g.edge_names) == _expected_edges(cfg)
    assert g.n_edges == len(g.edge_names)


@pytest.mark.parametrize("n_layers, n_heads", [(1, 1), (2, 3), (2, 12), (4, 4)])
def test_an_attention_only_graph_has_no_mlp_nodes(n_layers, n_heads):
    g = Graph(Config(n_layers=n_layers, d_model=12 * n_heads, n_heads=n_heads, d_vocab=50, n_ctx=8, attn_only=True))
    L, H = n_layers, n_heads
    assert len(g.senders) == 1 + L * H and g.n_nodes == 2 + L * H
    assert len(g.receivers) == 3 * H * L + 1
    # Layer l's 3H head inputs each read the input and the H heads of every earlier layer; the
    # logits read every sender.
    assert g.n_edges == sum(3 * H * (1 + layer * H) for layer in range(L)) + 1 + L * H
    assert not any(n.startswith("m") for n in g.nodes)
    last = f"a{L - 1}.h{H - 1}"
    assert g.edge_name(g.n_edges - 1) == f"{last} -> logits"
    for i, name in enumerate(g.edge_names):  # the index arithmetic agrees with the names
        assert g.edge_index(name) == i
    for s, name in enumerate(g.senders[1:], start=1):
        layer, head = (int(x) for x in name[1:].split(".h"))
        assert g.sender_layer(s) == layer and g.sender_head(s) == head and g.head_sender(layer, head) == s
    with pytest.raises(KeyError, match="attention-only"):
        g.edge_index("m0 -> logits")
    with pytest.raises(ValueError, match="attention-only"):
        g.mlp_receiver(0)


def test_edge_names_and_indices_round_trip():
    g = Graph(FOUR)
    for i, name in enumerate(g.edge_names):
        assert g.edge_index(name) == i and g.edge_name(i) == name
    assert g.edge_index("a0.h1->a1.h0<k>") == g.edge_index("  a0.h1  ->  a1.h0<k> ")
    assert g.edge_name(g.edge_index("m3 -> logits")) == "m3 -> logits"
    assert g.edge_name(0) == "input -> a0.h0<q>"
    assert g.nodes[0] == "input" and g.nodes[-1] == "logits" and "a3.h2" in g.nodes
    mat = g.to_matrix(torch.arange(g.n_edges, dtype=torch.float))
    assert mat[g.sender_index("a0.h1"), g.receiver_index("a1.h0<k>")] == g.edge_index("a0.h1 -> a1.h0<k>")
    assert torch.isnan(mat[g.sender_index("m3"), g.receiver_index("a1.h0<q>")])


def test_a_model_and_its_config_give_the_same_graph():
    model = random_model(TWO)
    assert Graph.from_model(model).edge_names == Graph(TWO).edge_names


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a0.h1 -> a1.h0<x>", "a1.h0<q>"),
        ("a0.h7 -> a1.h0<k>", "a0.h1"),
        ("mm0 -> logits", "m0"),
        ("a0.h1 -> logit", "logits"),
        ("a0.h1 -> a1.h0", "a1.h0<k>"),
    ],
)
def test_unknown_names_list_close_ones(name, expected):
    with pytest.raises(KeyError, match=expected.replace(".", r"\.").replace("<", "<")):
        Graph(FOUR).edge_index(name)


def test_an_edge_that_goes_upstream_is_refused_by_name():
    with pytest.raises(ValueError, match=r"no edge m3 -> a1\.h0<q>"):
        Graph(FOUR).edge_index("m3 -> a1.h0<q>")
    with pytest.raises(ValueError, match="sender -> receiver"):
        Graph(FOUR).edge_index("a0.h1 a1.h0<q>")


# ----------------------------------------------------------------------------
# exact edge patching against the brute-force reference
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("toy", [None, *TOYS])
def test_every_single_edge_of_a_2_layer_model_matches_brute_force(toy):
    cfg = dataclasses.replace(TWO, **TOYS[toy]) if toy else TWO
    model = random_model(cfg)
    clean, corrupted = tokens(cfg, 1), tokens(cfg, 2)
    g = Graph(cfg)
    got = patch_edges(model, clean, corrupted, [[e] for e in g.edge_names], progress=False)
    other = sender_values(model, corrupted)
    clean_logits = model(clean)
    moved = 0
    for i, e in enumerate(g.edge_names):
        want = brute_patch(model, clean, other, [e])
        torch.testing.assert_close(got[i], want, atol=1e-8, rtol=1e-8, msg=e)
        moved += bool((want - clean_logits).abs().max() > 1e-6)
    assert moved > 0.9 * g.n_edges  # the reference really patches: nearly every edge moves the logits


def test_sampled_edge_sets_on_a_4_layer_model_match_brute_force():
    model = random_model(FOUR, seed=3)
    clean, corrupted = tokens(FOUR, 4, (3, 7)), tokens(FOUR, 5, (3, 7))
    g = Graph(FOUR)
    gen = torch.Generator().manual_seed(0)
    singles = [[g.edge_names[i]] for i in torch.randperm(g.n_edges, generator=gen)[:25].tolist()]
    multis = [[g.edge_names[i] for i in torch.randperm(g.n_edges, generator=gen)[:k].tolist()] for k in (3, 40, 300)]
    sets = singles + multis
    got = patch_edges(model, clean, corrupted, sets, metric, batch_size=4, progress=False)
    other = sender_values(model, corrupted)
    want = torch.tensor([float(metric(brute_patch(model, clean, other, s))) for s in sets])
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("toy", [None, "attn-only", "attn-only-shortformer"])
def test_all_edges_give_the_corrupted_run_and_none_the_clean_run(toy):
    cfg = dataclasses.replace(FOUR, **TOYS[toy]) if toy else FOUR
    model = random_model(cfg, seed=7)
    clean, corrupted = tokens(cfg, 8), tokens(cfg, 9)
    g = Graph(cfg)
    out = patch_edges(
        model, clean, corrupted, [[], g.edge_names, torch.ones(g.n_edges, dtype=torch.bool)], progress=False
    )
    torch.testing.assert_close(out[0], model(clean), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out[1], model(corrupted), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out[2], model(corrupted), atol=1e-10, rtol=1e-10)


def test_float32_model_matches_to_1e_5():
    model = random_model(FOUR, seed=2, dtype=torch.float32)
    clean, corrupted = tokens(FOUR, 3), tokens(FOUR, 4)
    g = Graph(FOUR)
    sets = [[g.edge_names[i]] for i in range(0, g.n_edges, 97)] + [g.edge_names[::3]]
    got = patch_edges(model, clean, corrupted, sets, progress=False)
    other = sender_values(model, corrupted)
    for i, s in enumerate(sets):
        torch.testing.assert_close(got[i], brute_patch(model, clean, other, s), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("toy", [None, "attn-only", "shortformer"])
@pytest.mark.parametrize("ablation", ["zero", "mean", "resample"])
def test_ablations_match_brute_force(ablation, toy):
    # (Zero-ablating a shortformer model's input removes the embeddings alone: the positions are
    # no sender's; corrupted tokens, means and resamples patch differences, where they cancel.)
    cfg = dataclasses.replace(TWO, **TOYS[toy]) if toy else TWO
    model = random_model(cfg, seed=4)
    clean = tokens(cfg, 5, (4, 6))
    g = Graph(cfg)
    last = ["a1.h2 -> logits", "input -> a1.h0<v>"] if cfg.attn_only else ["m1 -> logits", "input -> m0"]
    sets = [g.edge_names[::5], ["a0.h1 -> a1.h0<k>"], last]
    got = patch_edges(model, clean, ablation, sets, seed=3, progress=False)
    values = sender_values(model, clean)
    if ablation == "zero":
        other = {k: torch.zeros_like(v) for k, v in values.items()}
    elif ablation == "mean":
        other = {k: v.mean(0, keepdim=True).expand_as(v) for k, v in values.items()}
    else:  # every prompt takes another prompt's outputs: find which from one set's result
        for perm in _derangements(4):
            other = {k: v[perm] for k, v in values.items()}
            if torch.allclose(got[0], brute_patch(model, clean, other, sets[0]), atol=1e-8):
                break
        else:
            pytest.fail("the resample ablation matches no permutation of the batch without a fixed point")
    for i, s in enumerate(sets):
        torch.testing.assert_close(got[i], brute_patch(model, clean, other, s), atol=1e-8, rtol=1e-8)
    again = patch_edges(model, clean, ablation, sets, seed=3, progress=False)
    torch.testing.assert_close(again, got, atol=0, rtol=0)  # seeded


def _derangements(n: int) -> list[list[int]]:
    import itertools

    return [list(p) for p in itertools.permutations(range(n)) if all(p[i] != i for i in range(n))]


def test_mean_ablation_over_reference_tokens():
    model = random_model(TWO, seed=4)
    clean, ref = tokens(TWO, 5, (2, 6)), tokens(TWO, 6, (5, 6))
    s = ["a0.h2 -> a1.h1<v>", "a1.h0 -> logits"]
    got = patch_edges(model, clean, "mean", [s], reference=ref, progress=False)
    other = {k: v.mean(0, keepdim=True).expand(2, -1, -1) for k, v in sender_values(model, ref).items()}
    torch.testing.assert_close(got[0], brute_patch(model, clean, other, s), atol=1e-8, rtol=1e-8)


def test_results_do_not_depend_on_batch_size_and_flags_come_back():
    model = random_model(FOUR, seed=1)
    clean, corrupted = tokens(FOUR, 1), tokens(FOUR, 2)
    g = Graph(FOUR)
    sets = [[g.edge_names[i]] for i in range(0, g.n_edges, 37)]
    a = patch_edges(model, clean, corrupted, sets, metric, batch_size=1, progress=False)
    b = patch_edges(model, clean, corrupted, sets, metric, progress=False)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    cfg = model.cfg
    assert not (cfg.use_split_qkv_input or cfg.use_hook_mlp_in or cfg.use_attn_result)

    def failing(logits: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError, match="metric failed"):
        patch_edges(model, clean, corrupted, sets, failing, progress=False)
    assert not (cfg.use_split_qkv_input or cfg.use_hook_mlp_in)
    assert not any(hp.fwd_hooks for hp in model._all_hook_points)


def test_a_users_hook_unbatches_with_a_warning_and_sees_single_runs():
    model = random_model(TWO, seed=2)
    clean, corrupted = tokens(TWO, 1), tokens(TWO, 2)
    g = Graph(TWO)
    sets = [[e] for e in g.edge_names[::9]]
    want = patch_edges(model, clean, corrupted, sets, metric, progress=False)
    seen = []
    model.add_hook("blocks.1.hook_resid_pre", lambda x, hook: seen.append(x.shape[0]))
    try:
        with pytest.warns(UserWarning, match="forward hooks are attached"):
            got = patch_edges(model, clean, corrupted, sets, metric, progress=False)
    finally:
        model.reset_hooks()
    torch.testing.assert_close(got, want, atol=1e-8, rtol=1e-8)
    assert set(seen) == {clean.shape[0]}


# ----------------------------------------------------------------------------
# the toy configurations: edge scores, circuits and pictures
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("toy", ["attn-only", "shortformer", "attn-only-shortformer"])
def test_eap_and_eap_ig_equal_the_autograd_reference_on_toy_models(toy):
    from test_circuits_scores import _reference_scores
    from test_circuits_scores import metric as eap_metric

    cfg = dataclasses.replace(TWO, **TOYS[toy])
    model = random_model(cfg, seed=5)
    clean, corrupted = tokens(cfg, 3, (3, 6)), tokens(cfg, 4, (3, 6))
    want = _reference_scores(model, clean, corrupted, [1.0])
    torch.testing.assert_close(eap_scores(model, clean, corrupted, eap_metric).double(), want, atol=1e-5, rtol=1e-4)
    assert (want.abs() > 1e-4).float().mean() > 0.5  # most edges carry something: the check can fail
    # EAP-IG interpolates from the corrupted input sender: with shortformer, the embeddings alone.
    want = _reference_scores(model, clean, corrupted, [0.5, 1.0])
    got = eap_ig_scores(model, clean, corrupted, eap_metric, steps=2, progress=False)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)


def test_circuit_faithfulness_and_picture_of_an_attention_only_model():
    cfg = dataclasses.replace(TWO, attn_only=True)
    model = random_model(cfg, seed=6)
    clean, corrupted = tokens(cfg, 5), tokens(cfg, 6)
    g = Graph(cfg)
    kept = ["input -> a0.h1<v>", "a0.h1 -> a1.h2<k>", "input -> a1.h2<q>", "a1.h2 -> logits", "a0.h0 -> a1.h1<q>"]
    c = Circuit(g, kept).pruned()  # a1.h1 reaches nothing, and nothing reaches a0.h0
    assert set(c.edges) == set(kept[:4]) and c.nodes == ["input", "a0.h1", "a1.h2", "logits"]
    # the circuit keeps its edges clean and patches every other one: brute force, by hand
    other = sender_values(model, corrupted)
    m_circuit = float(metric(brute_patch(model, clean, other, [e for e in g.edge_names if e not in c.edges])))
    with torch.no_grad():
        m_full, m_empty = float(metric(model(clean))), float(metric(model(corrupted)))
    want = (m_circuit - m_empty) / (m_full - m_empty)
    assert faithfulness(model, clean, corrupted, c, metric) == pytest.approx(want, abs=1e-6)
    assert abs(want) > 1e-3 and abs(want - 1) > 1e-3  # neither the empty nor the full graph's
    scores = torch.linspace(1.0, 2.0, g.n_edges, dtype=torch.float64)
    curve = faithfulness_curve(model, clean, corrupted, scores, metric, [0, g.n_edges], progress=False)
    assert curve.faithfulness.tolist() == pytest.approx([0.0, 1.0], abs=1e-6)
    found = acdc(model, clean, corrupted, metric, tau=0.0, progress=False)  # tau 0: nothing is removed
    assert found.n_edges == g.n_edges
    fig = circuit_graph(c)
    assert {t.meta for t in fig.data if t.meta} == set(c.edges)
    nodes = next(t for t in fig.data if t.name == "nodes")
    ys = dict(zip(nodes.text, nodes.y, strict=True))
    assert ys == {"input": 0, "a0.h1": 1, "a1.h2": 2, "logits": 3}  # one row per layer: no MLP rows
    assert list(fig.layout.yaxis.ticktext) == ["input", "attn 0", "attn 1", "logits"]
    assert "MLP" not in fig.layout.xaxis.ticktext


# ----------------------------------------------------------------------------
# path patching against the IOI paper's two-step procedure
# ----------------------------------------------------------------------------
def _reference_path_patch(model, clean, corrupted, senders, receivers):  # type: ignore[no-untyped-def]
    """Step 1: cache both runs. Step 2: clean run with the senders' outputs from the corrupted run
    and every other head and MLP frozen to the clean run; keep the receivers' inputs. Step 3:
    clean run with the receivers' inputs set to those; the logits."""
    n = model.cfg.n_layers
    with all_flags(model), torch.no_grad():
        _, cc = model.run_with_cache(clean)
        _, xc = model.run_with_cache(corrupted)
        hooks = []
        for layer in range(n):

            def heads(x, hook, layer=layer):  # type: ignore[no-untyped-def]
                out = cc[f"blocks.{layer}.attn.hook_result"].clone()
                for sl, sh in senders:
                    if sl == layer:
                        out[:, :, sh] = xc[f"blocks.{layer}.attn.hook_result"][:, :, sh]
                return out

            hooks += [(f"blocks.{layer}.attn.hook_result", heads)]
            if not model.cfg.attn_only:
                hooks += [(f"blocks.{layer}.hook_mlp_out", lambda x, hook: cc[hook.name])]
        kept = {}
        for rl, rh, c in receivers:
            hooks.append(
                (
                    f"blocks.{rl}.hook_{c}_input",
                    lambda x, hook, key=(rl, rh, c): kept.__setitem__(key, x[:, :, key[1]].clone()),
                )
            )
        model.run_with_hooks(clean, fwd_hooks=hooks)

        def setter(key):  # type: ignore[no-untyped-def]
            def fn(x, hook):  # type: ignore[no-untyped-def]
                x = x.clone()
                x[:, :, key[1]] = kept[key]
                return x

            return fn

        return model.run_with_hooks(clean, fwd_hooks=[(f"blocks.{k[0]}.hook_{k[2]}_input", setter(k)) for k in kept])


@pytest.mark.parametrize("toy", [None, "attn-only", "attn-only-shortformer"])
def test_path_patching_matches_the_two_step_procedure(toy):
    cfg = Config(n_layers=3, d_model=36, n_heads=3, d_vocab=60, n_ctx=16, **(TOYS[toy] if toy else {}))
    model = random_model(cfg, seed=5)
    clean, corrupted = tokens(cfg, 1, (3, 6)), tokens(cfg, 2, (3, 6))
    # Chained receivers: a1.h0's value input and a2.h1's query (a1.h0 is upstream of a2.h1).
    receivers = [(1, 0, "v"), (2, 1, "q"), (2, 2, "k")]
    senders = [(0, 0), (0, 2), (1, 1), [(0, 1), (1, 2)]]
    got = path_patch(model, clean, corrupted, senders, receivers, progress=False)
    for i, s in enumerate(senders):
        group = s if isinstance(s, list) else [s]
        want = _reference_path_patch(model, clean, corrupted, group, receivers)
        torch.testing.assert_close(got[i], want, atol=1e-8, rtol=1e-8)
    named = path_patch(model, clean, corrupted, ["a0.h0"], ["a1.h0<v>", "a2.h1<q>", "a2.h2<k>"], metric, progress=False)
    assert float(named[0]) == pytest.approx(float(metric(got[0])), abs=1e-6)
    assert not (model(clean) - got[0]).abs().max() < 1e-6  # the patch did something


@pytest.mark.parametrize("toy", [None, "attn-only", "shortformer", "attn-only-shortformer"])
def test_direct_path_sweeps_match_plain_hooks_on_toy_models(toy):
    """transformer-lens 4.3's direct-path sweeps (checked against TL itself in test_circuits_tl.py,
    which cannot build these toy models from a Hugging Face GPT-2) against one hooked corrupted
    run per path: the source head's clean-minus-corrupted `z @ W_O` added to the destination
    head's split `component` input."""
    from interp_gpt.circuits import get_act_patch_direct_path, get_act_patch_direct_path_all_sources

    cfg = Config(n_layers=3, d_model=36, n_heads=3, d_vocab=60, n_ctx=16, **(TOYS[toy] if toy else {}))
    model = random_model(cfg, seed=7)
    clean, corrupted = tokens(cfg, 1, (3, 6)), tokens(cfg, 2, (3, 6))
    _, clean_cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)
    W_O = [block.attn.W_O.detach() for block in model.blocks]

    def reference(sl: int, sh: int, dl: int, dh: int, component: str) -> float:
        name = f"blocks.{sl}.attn.hook_z"
        delta = (clean_cache[name][:, :, sh] - corrupted_cache[name][:, :, sh]) @ W_O[sl][sh]

        def add(x: torch.Tensor, hook) -> torch.Tensor:  # type: ignore[no-untyped-def]
            x = x.clone()
            x[:, :, dh] += delta
            return x

        with all_flags(model), torch.no_grad():
            return float(
                metric(model.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{dl}.hook_{component}_input", add)]))
            )

    for component in "qkv":
        every = get_act_patch_direct_path_all_sources(
            model, corrupted, clean_cache, corrupted_cache, metric, component, verbose=False
        )
        one = get_act_patch_direct_path(model, corrupted, clean_cache, corrupted_cache, metric, 0, 1, component, False)
        torch.testing.assert_close(one, every[0, 1])
        want = torch.zeros_like(every)
        for sl, sh, dl, dh in itertools.product(range(3), range(3), range(3), range(3)):
            if dl > sl:
                want[sl, sh, dl, dh] = reference(sl, sh, dl, dh, component)
        torch.testing.assert_close(every, want, atol=1e-6, rtol=1e-6)
        corrupted_metric = float(metric(model(corrupted).detach()))
        assert (want[0, :, 1:] - corrupted_metric).abs().max() > 1e-3  # the paths move the metric


# ----------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------
def test_bad_inputs_say_what_was_expected():
    model = random_model(TWO)
    clean = tokens(TWO, 1)
    with pytest.raises(ValueError, match="corrupted_tokens has shape"):
        patch_edges(model, clean, tokens(TWO, 2, (2, 5)), [["m0 -> logits"]], progress=False)
    with pytest.raises(ValueError, match="must return a scalar"):
        patch_edges(model, clean, tokens(TWO, 2), [["m0 -> logits"]], lambda lg: lg[:, -1, 0], progress=False)
    with pytest.raises(KeyError, match="did you mean .*'m0'"):
        patch_edges(model, clean, tokens(TWO, 2), [["mo -> logits"]], progress=False)
    with pytest.raises(TypeError, match="wrap a single set in a list"):
        patch_edges(model, clean, tokens(TWO, 2), "m0 -> logits", progress=False)
    with pytest.raises(ValueError, match="resample ablation needs at least 2 prompts"):
        patch_edges(model, clean[:1], "resample", [["m0 -> logits"]], progress=False)
    with pytest.raises(ValueError, match=r"the input must be 'q', 'k' or 'v'"):
        path_patch(model, clean, tokens(TWO, 2), [(0, 0)], [(1, 0, "z")], progress=False)
    with pytest.raises(ValueError, match="layers are 0..1"):
        path_patch(model, clean, tokens(TWO, 2), [(2, 0)], [(1, 0, "q")], progress=False)
    with pytest.raises(KeyError, match="did you mean"):
        path_patch(model, clean, tokens(TWO, 2), ["a0.h9"], ["logits"], progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        patch_edges(model, clean, tokens(TWO, 2), [["m0 -> logits"]], progress=False)  # no warning without user hooks


def test_logit_positions_unembed_only_what_the_metric_reads():
    model = random_model(FOUR, seed=6)
    clean, corrupted = tokens(FOUR, 1), tokens(FOUR, 2)
    g = Graph(FOUR)
    sets = [[e] for e in g.edge_names[::41]] + [g.edge_names[::2]]

    def last(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1, 3].mean() - logits[:, -1, 5].mean()

    full = patch_edges(model, clean, corrupted, sets, progress=False)
    fast = patch_edges(model, clean, corrupted, sets, logit_positions=-1, progress=False)
    torch.testing.assert_close(fast[:, :, -1], full[:, :, -1], atol=1e-10, rtol=1e-10)
    clean_logits = model(clean).detach()
    torch.testing.assert_close(fast[:, :, :-1], clean_logits[None, :, :-1].expand_as(fast[:, :, :-1]))
    assert (full[:, :, :-1] - clean_logits[:, :-1]).abs().max() > 1e-3  # so the check above can fail
    a = patch_edges(model, clean, corrupted, sets, last, logit_positions=[-1], progress=False)
    torch.testing.assert_close(a, torch.stack([last(x) for x in full]).float(), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="logit_positions=6 is out of range"):
        patch_edges(model, clean, corrupted, sets, last, logit_positions=[6], progress=False)

    # The metric sees one reused buffer: a metric that writes into its logits must not change
    # what the next set's metric reads at the positions it did not score.
    def scribbling(logits: torch.Tensor) -> torch.Tensor:
        value = last(logits) + logits[:, 0, 3].mean()
        logits[:, 0] += 100.0
        return value

    reads_first = torch.stack([last(x) + x[:, 0, 3].mean() for x in full]).float()
    b = patch_edges(model, clean, corrupted, sets, scribbling, logit_positions=[-1], progress=False)
    assert (reads_first - a).abs().max() > 1e-3  # position 0 matters to this metric
    torch.testing.assert_close(b, torch.stack([last(x) + clean_logits[:, 0, 3].mean() for x in full]).float())
