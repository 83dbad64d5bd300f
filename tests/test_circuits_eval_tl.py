"""`faithfulness` against transformer-lens 4.3's `tools.analysis.faithfulness` on a TransformerBridge
built offline from a random Hugging Face GPT-2 (tests/test_circuits_tl.py's way). transformer-lens'
graph is resolved by position (an edge per position); our edge is that edge at every position, so a
circuit of ours is given to it as its edges at all positions. With corrupted tokens both measure
`(metric(circuit) - metric(corrupted run)) / (metric(clean run) - metric(corrupted run))`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from interp_gpt import from_pretrained_no_processing
from interp_gpt.circuits import Circuit, Graph, eap_scores, faithfulness
from interp_gpt.compare import transformer_lens_major

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tl_bridge import word_level_bridge  # noqa: E402

tl = pytest.importorskip("transformer_lens")
pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(
        transformer_lens_major() < 4,
        reason="faithfulness is transformer-lens 4.3's (tools.analysis): the .venv (TL 4.3) checks this",
    ),
]


def _tl_circuit(graph: Graph, circuit: Circuit, n_pos: int) -> list:  # type: ignore[type-arg]
    from transformer_lens.tools.analysis.attribution_patching import Node

    def writer(name: str, p: int) -> Node:
        if name == "input":
            return Node(kind="embed", position=p)
        if name.startswith("m"):
            return Node(kind="mlp_out", layer=int(name[1:]), position=p)
        layer, head = name[1:].split(".h")
        return Node(kind="attn_head_out", layer=int(layer), head=int(head), position=p)

    out = []
    for i in circuit.indices.tolist():
        s = graph.senders[int(graph.edge_sender[i])]
        r = graph.receivers[int(graph.edge_receiver[i])]
        for p in range(n_pos):
            if r.kind == "logits":
                reader = Node(kind="logits", layer=graph.n_layers - 1, position=p)
            elif r.kind == "mlp":
                reader = Node(kind="mlp_in", layer=r.layer, position=p)
            else:
                reader = Node(kind=f"{r.kind}_input", layer=r.layer, head=r.head, position=p)  # type: ignore[arg-type]
            out.append((writer(s, p), reader))
    return out


def test_faithfulness_equals_transformer_lens_4_3s(hf_gpt2_factory):  # type: ignore[no-untyped-def]
    from transformer_lens.tools.analysis import faithfulness as tl_faithfulness

    hf = hf_gpt2_factory(seed=3)
    with torch.no_grad():  # GPT-2's init barely lets a patch move the logits: scale it up
        for name, p in hf.named_parameters():
            if name.endswith(".weight") and ".ln_" not in name:
                p.mul_(8.0)
    ours, bridge = (
        from_pretrained_no_processing(hf, tokenizer=None).eval(),
        word_level_bridge(hf, "interp_gpt-circuits-test"),
    )
    gen = torch.Generator().manual_seed(0)
    clean, corrupted = (torch.randint(0, 99, (1, 7), generator=gen) for _ in range(2))

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1, 3] - logits[0, -1, 5]

    g = Graph.from_model(ours)
    scores = eap_scores(ours, clean, corrupted, metric)
    values = []
    for k in (15, 30, 45, 60, 75, 90, 105):
        c = Circuit.top_k(g, scores, k)
        want = tl_faithfulness(bridge, clean, corrupted, metric, _tl_circuit(g, c, clean.shape[1])).recovered
        got = faithfulness(ours, clean, corrupted, c, metric)
        assert abs(got - want) < 1e-4, (k, got, want)
        values.append(want)
    # some circuits in between the empty one and the full model: the comparison can fail
    assert sum(0.05 < abs(v) and 0.05 < abs(v - 1) for v in values) >= 2, values
