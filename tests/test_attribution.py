"""`attribute` against brute force: the frozen local replacement model built here from plain hooks (attention
patterns and LayerNorm scales replaced by the clean run's, each MLP output by the clean one plus the change
of the transcoders' skip plus whatever is ablated), in which removing a source -- a feature (its
activation times its decoder rows), an error node (its error vector) or a token embedding -- changes every
target (a feature's pre-activation, a logit target's demeaned logit at the last position) by exactly its
column of the adjacency matrix. Removing every source at once leaves what no node explains (biases,
positional embeddings, position 0), so each row sums to the target's clean value minus that.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.attribution import AttributionGraph, attribute
from interp_gpt.sae import CLTConfig, CrossLayerTranscoder, Transcoder, TranscoderConfig

TOKENS = torch.tensor([0, 5, 9, 17, 3, 42, 8, 61, 23, 7])


def plts(d: int, n: int, skip: bool, seed: int = 0) -> list[Transcoder]:
    out = []
    for layer in range(n):
        tc = Transcoder(
            TranscoderConfig(
                d_in=d, d_sae=40, d_out=d, skip=skip,
                metadata={"hook_name": f"blocks.{layer}.ln2.hook_normalized", "hook_name_out": f"blocks.{layer}.hook_mlp_out"},
            )
        )  # fmt: skip
        tc.init_weights(seed=seed + layer)
        g = torch.Generator().manual_seed(100 + seed + layer)
        with torch.no_grad():
            tc.b_enc.copy_(torch.randn(40, generator=g) * 0.5 - 0.5)
            tc.b_dec.copy_(torch.randn(d, generator=g) * 0.1)
            if skip:
                tc.W_skip.copy_(torch.randn(d, d, generator=g) * 0.1)
        out.append(tc)
    return out


def a_clt(d: int, n: int, skip: bool) -> CrossLayerTranscoder:
    clt = CrossLayerTranscoder(
        CLTConfig(n_layers=n, d_in=d, d_sae=30, d_out=d, skip=skip,
                  metadata={"hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out"})
    )  # fmt: skip
    clt.init_weights(seed=7)
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        clt.b_enc.copy_(torch.randn(clt.b_enc.shape, generator=g) * 0.5 - 0.5)
        if skip:
            clt.W_skip.copy_(torch.randn(clt.W_skip.shape, generator=g) * 0.1)
    return clt


class Frozen:
    """The frozen local replacement model by plain hooks, and the graph's targets read from it."""

    def __init__(self, model: GPT, tokens: torch.Tensor, tcs: Any):
        self.model, self.tokens, self.tcs = model, tokens, tcs
        self.n = model.cfg.n_layers
        self.clt = isinstance(tcs, CrossLayerTranscoder)
        self.bos = 1 if model.tokenizer is not None else 0  # without a tokenizer no BOS is put first
        names = lambda name: name.endswith(("hook_pattern", "hook_scale", "ln2.hook_normalized", "hook_mlp_out"))  # noqa: E731
        with torch.no_grad():
            _, self.cache = model.run_with_cache(tokens[None], names_filter=names)
        self.x = [self.cache[f"blocks.{i}.ln2.hook_normalized"][0] for i in range(self.n)]
        self.mlp_out = [self.cache[f"blocks.{i}.hook_mlp_out"][0] for i in range(self.n)]
        with torch.no_grad():
            if self.clt:
                self.acts = [tcs.encode_layer(self.x[i], i) for i in range(self.n)]
            else:
                self.acts = [tcs[i].encode(self.x[i]) for i in range(self.n)]
            for a in self.acts:
                a[: self.bos] = 0  # position 0, where it is a BOS (a tokenizer put it there), is no node's value
            self.errors = []
            for i in range(self.n):
                rec = (
                    tcs.decode_layer(torch.stack(self.acts), i, self.x[i])
                    if self.clt
                    else tcs[i].decode(self.acts[i], self.x[i])
                )
                err = self.mlp_out[i] - rec
                err[: self.bos] = 0
                self.errors.append(err)

    def skip(self, i: int, x: torch.Tensor) -> torch.Tensor:
        tc = self.tcs if self.clt else self.tcs[i]
        if not tc.cfg.skip:
            return torch.zeros_like(x)
        return x @ (self.tcs.W_skip[i] if self.clt else tc.W_skip).T

    def writes(self, layer: int, pos: int, feature: int) -> dict[int, torch.Tensor]:
        """The feature's activation times its decoder row, per layer it writes."""
        a = self.acts[layer][pos, feature]
        if self.clt:
            return {layer + j: a * self.tcs.W_dec[layer][feature, j] for j in range(self.n - layer)}
        return {layer: a * self.tcs[layer].W_dec[feature]}

    def run(self, features=(), errors=(), embeds=()) -> tuple[list[torch.Tensor], torch.Tensor]:  # type: ignore[no-untyped-def]
        """(each layer's MLP input, ln_final's output) with those sources removed."""
        delta = [torch.zeros_like(o) for o in self.mlp_out]
        for layer, pos, f in features:
            for m, v in self.writes(layer, pos, f).items():
                delta[m][pos] += v
        for layer, pos in errors:
            delta[layer][pos] += self.errors[layer][pos]
        xs: dict[int, torch.Tensor] = {}
        out: dict[str, torch.Tensor] = {}

        def frozen(t, hook):  # type: ignore[no-untyped-def]
            return self.cache[hook.name]

        def read_x(t, hook, i):  # type: ignore[no-untyped-def]
            xs[i] = t[0]

        def mlp(t, hook, i):  # type: ignore[no-untyped-def]
            return (self.mlp_out[i] + self.skip(i, xs[i]) - self.skip(i, self.x[i]) - delta[i])[None]

        def embed(t, hook):  # type: ignore[no-untyped-def]
            t = t.clone()
            for p in embeds:
                t[0, p] -= self.model.W_E[self.tokens[p]]
            return t

        def final(t, hook):  # type: ignore[no-untyped-def]
            out["final"] = t[0]

        hooks = [(name, frozen) for name in self.cache if name.endswith(("hook_pattern", "hook_scale"))]
        hooks += [("hook_embed", embed)]
        for i in range(self.n):
            hooks += [(f"blocks.{i}.ln2.hook_normalized", lambda t, hook, i=i: read_x(t, hook, i))]
            hooks += [(f"blocks.{i}.hook_mlp_out", lambda t, hook, i=i: mlp(t, hook, i))]
        with torch.no_grad(), self.model.hooks(fwd_hooks=hooks):
            resid = self.model(self.tokens[None], stop_at_layer=self.n)
            ln = self.model.ln_final
            out["final"] = (
                (resid[0] - resid[0].mean(-1, keepdim=True)) / self.cache["ln_final.hook_scale"][0]
            ) * ln.w + ln.b
        return [xs[i] for i in range(self.n)], out["final"]

    def targets(self, graph: AttributionGraph, xs: list[torch.Tensor], final: torch.Tensor) -> torch.Tensor:
        """Every target's value: the active features' pre-activations (less b_enc), then the logit targets."""
        vals = []
        for layer, pos, f in graph.active_features.tolist():
            w = self.tcs.W_enc[layer][:, f] if self.clt else self.tcs[layer].W_enc[:, f]
            vals.append(xs[layer][pos] @ w)
        W_U = self.model.W_U
        for t in graph.logit_targets:
            vals.append(final[-1] @ (W_U[:, t.vocab_idx] - W_U.mean(-1)))
        return torch.stack(vals).detach()


def target_rows(graph: AttributionGraph) -> torch.Tensor:
    n = graph.adjacency_matrix.shape[0]
    return torch.cat([torch.arange(graph.n_features), torch.arange(n - graph.n_logits, n)])


@pytest.mark.parametrize(("kind", "skip"), [("plt", False), ("plt", True), ("clt", False), ("clt", True)])
def test_each_edge_is_the_change_when_its_source_is_removed(tiny_model: GPT, kind: str, skip: bool) -> None:
    d, n = tiny_model.cfg.d_model, tiny_model.cfg.n_layers
    tcs = plts(d, n, skip) if kind == "plt" else a_clt(d, n, skip)
    graph = attribute(tiny_model, TOKENS, tcs, batch_size=7)
    fz = Frozen(tiny_model, TOKENS, tcs)
    n_active, n_pos = graph.active_features.shape[0], graph.n_pos
    assert graph.n_features == n_active > 30 and graph.n_logits >= 1
    # the graph's features and activations are the transcoders' on the clean run
    acts = torch.stack(fz.acts)
    assert torch.equal(graph.active_features, acts.nonzero())
    torch.testing.assert_close(graph.activation_values, acts[acts != 0], rtol=1e-5, atol=1e-6)
    clean = fz.targets(graph, *fz.run())
    rows = target_rows(graph)
    g = torch.Generator().manual_seed(0)
    picked = torch.randperm(n_active, generator=g)[:6].tolist()
    picked += [int(torch.where(graph.active_features[:, 0] == 0)[0][-1])]  # a layer-0 feature, read by layer 1
    sources: list[tuple[int, dict]] = [(i, {"features": [tuple(graph.active_features[i].tolist())]}) for i in picked]
    sources += [(n_active + layer * n_pos + pos, {"errors": [(layer, pos)]}) for layer, pos in [(0, 3), (1, 9), (0, 9)]]
    sources += [(n_active + n * n_pos + pos, {"embeds": [pos]}) for pos in (0, 4, 9)]
    scale = float(graph.adjacency_matrix.abs().max())
    for node, removed in sources:
        brute = clean - fz.targets(graph, *fz.run(**removed))
        column = graph.adjacency_matrix[rows, node]
        torch.testing.assert_close(column, brute, rtol=0, atol=1e-4 * scale, msg=f"source node {node}: {removed}")
    assert bool((graph.adjacency_matrix[n_active : n_active + (n + 1) * n_pos] == 0).all())  # no row writes these

    # every source removed at once: what is left is what no node explains; each row sums to the rest
    everything = {
        "features": [tuple(f) for f in graph.active_features.tolist()],
        "errors": [(layer, pos) for layer in range(n) for pos in range(n_pos)],
        "embeds": list(range(n_pos)),
    }
    unexplained = fz.targets(graph, *fz.run(**everything))
    sums = graph.adjacency_matrix[rows].sum(dim=1)
    torch.testing.assert_close(sums, clean - unexplained, rtol=0, atol=1e-4 * float(clean.abs().max()))


def test_top_logits_and_probabilities_are_the_models(tiny_model: GPT) -> None:
    tcs = plts(tiny_model.cfg.d_model, tiny_model.cfg.n_layers, skip=True)
    graph = attribute(tiny_model, TOKENS, tcs, max_n_logits=5, desired_logit_prob=0.99)
    with torch.no_grad():
        probs = tiny_model(TOKENS[None])[0, -1].softmax(-1)
    top = probs.topk(5)
    cum = top.values.cumsum(0)
    n = min(5, int((cum < 0.99).sum()) + 1)
    assert graph.logit_token_ids.tolist() == top.indices[:n].tolist()
    torch.testing.assert_close(graph.logit_probabilities, top.values[:n], rtol=1e-5, atol=1e-7)
    few = attribute(tiny_model, TOKENS, tcs, desired_logit_prob=float(top.values[0]) / 2)
    assert few.logit_token_ids.tolist() == top.indices[:1].tolist()


def test_max_feature_nodes_keeps_the_most_influential(tiny_model: GPT) -> None:
    tcs = plts(tiny_model.cfg.d_model, tiny_model.cfg.n_layers, skip=False)
    full = attribute(tiny_model, TOKENS, tcs)
    part = attribute(tiny_model, TOKENS, tcs, max_feature_nodes=10, batch_size=4, update_interval=1)
    assert part.n_features == 10 and torch.equal(part.active_features, full.active_features)
    n_nodes = part.adjacency_matrix.shape[0]
    assert n_nodes == full.adjacency_matrix.shape[0] - (full.n_features - 10)
    # the kept rows and columns are the full graph's
    keep = torch.cat([part.selected_features, torch.arange(full.n_features, full.adjacency_matrix.shape[0])])
    rows = torch.cat([torch.arange(10), torch.arange(n_nodes - part.n_logits, n_nodes)])
    full_rows = keep[rows]
    torch.testing.assert_close(
        part.adjacency_matrix[rows], full.adjacency_matrix[full_rows][:, keep], rtol=1e-6, atol=1e-6
    )


def test_custom_direction_targets(tiny_model: GPT) -> None:
    """A custom direction `W_U[:, a] - W_U[:, b]` has the difference of the two demeaned logit rows."""
    tcs = plts(tiny_model.cfg.d_model, tiny_model.cfg.n_layers, skip=True)
    W_U = tiny_model.W_U.detach()
    both = attribute(tiny_model, TOKENS, tcs, attribution_targets=torch.tensor([3, 11]))
    diff = attribute(tiny_model, TOKENS, tcs, attribution_targets=[("3 - 11", 1.0, W_U[:, 3] - W_U[:, 11])])
    assert diff.logit_targets[0].token_str == "3 - 11" and diff.logit_targets[0].vocab_idx == tiny_model.cfg.d_vocab
    a = both.adjacency_matrix
    torch.testing.assert_close(
        diff.adjacency_matrix[-1, :-1], (a[-2] - a[-1])[:-2], rtol=0, atol=1e-5 * float(a.abs().max())
    )


def test_shipped_tiny_gpt2_transcoders_build_a_graph() -> None:
    from interp_gpt.sae.training import shipped_clt, shipped_transcoders

    model = GPT.from_pretrained("tiny-gpt2")
    prompt = "The cat sat on the mat because it was warm"
    graph = attribute(model, prompt, shipped_transcoders(model))
    tokens = model.to_tokens(prompt)[0]  # the BOS first
    assert torch.equal(graph.input_tokens, tokens) and graph.input_string == model.to_string(tokens)
    assert (
        graph.n_features > 0 and graph.adjacency_matrix.shape[0] == graph.n_features + 3 * graph.n_pos + graph.n_logits
    )
    assert graph.adjacency_matrix[-graph.n_logits :].abs().sum() > 0
    clt_graph = attribute(model, prompt, shipped_clt(), max_feature_nodes=16)
    assert clt_graph.n_features == 16


def test_the_docstring_example_runs() -> None:
    import doctest
    import importlib

    module = importlib.import_module("interp_gpt.attribution.attribute")  # (the package's `attribute` is the function)

    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = doctest.DocTestFinder(recurse=False).find(module)
    assert sum(len(t.examples) for t in tests) >= 5
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_readme_attribution_example_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    body = text.split("\n## Attribution graphs\n", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", body, flags=re.S)[0]
    ns: dict = {}
    exec(compile(block.replace("/tmp/graph.json", str(tmp_path / "g.json")), "README.md (Attribution)", "exec"), ns)
    graph = ns["graph"]
    n_nodes = graph.n_features + graph.n_errors + graph.n_pos + graph.n_logits
    assert graph.adjacency_matrix.shape == (n_nodes, n_nodes) and graph.n_logits == 5
    assert bool(ns["node_mask"][-graph.n_logits :].all())  # pruning keeps every logit
    assert 0.0 <= ns["replacement"] <= 1.0 and 0.0 <= ns["completeness"] <= 1.0
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["metadata"]["slug"] == "romeo" and data["nodes"] and data["links"]


def test_a_graph_under_no_grad_is_the_same_graph(tiny_model: GPT) -> None:
    """Notebooks switch gradients off globally; attribute turns them on for itself (and no batch size changes
    a value: every target is read in its own sample of the batched backward pass)."""
    tcs = plts(tiny_model.cfg.d_model, tiny_model.cfg.n_layers, skip=True)
    graph = attribute(tiny_model, TOKENS, tcs, batch_size=7)
    with torch.no_grad():
        quiet = attribute(tiny_model, TOKENS, tcs, batch_size=64)
    assert quiet.adjacency_matrix.abs().max() > 0
    torch.testing.assert_close(quiet.adjacency_matrix, graph.adjacency_matrix, rtol=1e-5, atol=1e-5)


def test_a_graph_that_would_not_fit_is_refused_before_any_work(tiny_model: GPT, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Dense matrices beyond the memory available (the dense layout forced: by default such a graph is built
    sparse, tests/test_attribution_sparse.py): a ValueError naming max_feature_nodes and a value that fits,
    raised before the backward passes; that value then builds the graph."""
    import importlib
    import re

    attribute_module = importlib.import_module("interp_gpt.attribution.attribute")

    tcs = plts(tiny_model.cfg.d_model, tiny_model.cfg.n_layers, skip=False)
    full = attribute(tiny_model, TOKENS, tcs)
    n = full.adjacency_matrix.shape[0]
    monkeypatch.setattr(attribute_module, "_available_bytes", lambda: 4 * n * n // 2)
    with pytest.raises(
        ValueError, match=r"attribute: a graph of \d+ of \d+ active features .* max_feature_nodes=(\d+)"
    ):
        attribute(tiny_model, TOKENS, tcs, sparse=False)
    try:
        attribute(tiny_model, TOKENS, tcs, sparse=False)
    except ValueError as e:
        fits = int(re.search(r"max_feature_nodes=(\d+)", str(e)).group(1))  # type: ignore[union-attr]
    assert 0 < fits < full.n_features
    assert attribute(tiny_model, TOKENS, tcs, max_feature_nodes=fits).n_features == fits
    with pytest.raises(ValueError, match="max_feature_nodes"):
        attribute(tiny_model, TOKENS, tcs, max_feature_nodes=fits + 1)
