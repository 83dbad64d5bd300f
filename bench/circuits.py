"""Benchmark: edge attribution patching (EAP) and batched exact edge patching, on the GPT-2-small
shape with seeded random weights, CPU.

    python bench/circuits.py [--batch 8] [--tokens 20] [--edges 100] [--repeats 3] [--threads 1]

(a) `eap_scores` for all 32,491 edges vs one forward+backward of our model on the same tokens
    (`metric(model(tokens)).backward()`); goal: ratio <= 2 (the floor is about 1.33: two forwards and one backward).
(b) `patch_edges` with 100 single-edge sets in batched forwards vs 100 separate hooked forwards
    (`run_with_hooks` with `use_split_qkv_input` / `use_hook_mlp_in` on, each adding the edge's
    corrupted-minus-clean sender output to its receiver's input); goal: ratio <= 1/5. The script
    checks that both give the same metric values (max |diff| < 1e-4). Measured twice: computing
    every position's logits, and with `logit_positions=-1` (the metric reads the last position only,
    so only it is unembedded: the unembedding is a third of the compute on 20-token prompts).
    For scale it also times 100 plain forwards and counts the work (multiply-adds) the batched
    copies do and the least any exact method must do (`work`): on a machine where a forward
    already runs its matmuls at full speed (a CPU), that bounds the ratio from below.

Times are medians of the repeats after one warm-up (for (b) the checking runs are the warm-up), the competitors interleaved (A B, A B, ...)
so that load from other processes lands on both. Only the ratios mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, median, random_tokens  # noqa: E402

from interp_gpt import GPT, preset  # noqa: E402
from interp_gpt.circuits import Graph, eap_scores, patch_edges  # noqa: E402
from interp_gpt.circuits._run import base_run  # noqa: E402


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 1000].mean() - logits[:, -1, 2000].mean()


def separate_forwards(
    model: GPT, graph: Graph, clean: torch.Tensor, corrupted: torch.Tensor, edges: list[int]
) -> list[float]:
    """The plain way: one hooked forward per edge, adding (corrupted - clean) sender output at the receiver."""
    with torch.no_grad():
        delta = base_run(model, corrupted).senders - base_run(model, clean).senders  # [batch, pos, n_senders, d_model]
    n = graph.n_layers
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    out = []
    try:
        with torch.no_grad():
            for e in edges:
                s, r = int(graph.edge_sender[e]), graph.receivers[int(graph.edge_receiver[e])]
                d = delta[:, :, s]

                def add(x: torch.Tensor, hook: Any, d: torch.Tensor = d, head: int | None = r.head) -> torch.Tensor:
                    x = x.clone()
                    if head is None:
                        return x + d
                    x[:, :, head] += d
                    return x

                if r.kind == "logits":
                    name = f"blocks.{n - 1}.hook_resid_post"
                elif r.kind == "mlp":
                    name = f"blocks.{r.layer}.hook_mlp_in"
                else:
                    name = f"blocks.{r.layer}.hook_{r.kind}_input"
                out.append(float(metric(model.run_with_hooks(clean, fwd_hooks=[(name, add)]))))
    finally:
        model.set_use_split_qkv_input(False)
        model.set_use_hook_mlp_in(False)
    return out


def work(graph: Graph, cfg: Any, edges: list[int], n_pos: int, scored: int) -> tuple[float, float, float]:
    """Multiply-adds per prompt of (1) one plain forward, (2) our batched copy of the clean run
    with one edge patched, summed over `edges` (every layer from the receiver's on, `scored`
    positions unembedded), (3) the least any exact method must compute for those copies: at
    the receiver's layer only the patched head's projection, attention and output (or the MLP
    receiver) then the MLP, the later layers in full except the last, where the positions nobody
    scores need only their keys and values, and `scored` positions unembedded. Dense matmuls
    and attention; LayerNorms, activations and adds left out (a few percent)."""
    d, h, dh, m, v, n = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.d_vocab, cfg.n_layers
    scores = 2 * h * dh * (n_pos + 1) / 2  # q.k and pattern.v of one query over its causal keys, all heads
    qkv, out, mlp = 3 * d * h * dh, h * dh * d, 2 * d * m
    layer = n_pos * (qkv + out + mlp + scores)
    unembed = scored * d * v
    forward = n * layer + n_pos * d * v
    ours = least = 0.0
    for e in edges:
        r = graph.receivers[int(graph.edge_receiver[e])]
        if r.kind == "logits":
            ours += unembed
            least += unembed
            continue
        ours += (n - r.layer) * layer + unembed
        rows = scored if r.layer == n - 1 else n_pos  # positions whose output is still needed
        at = rows * mlp  # the receiver's layer
        if r.kind != "mlp":  # one head's q, k or v, its attention and its output
            at += (n_pos if r.kind != "q" else rows) * d * dh + rows * (scores / h + dh * d)
        full = max(n - 2 - r.layer, 0)  # the layers after it but the last
        last = n_pos * 2 * d * h * dh + scored * (d * h * dh + out + mlp + 2 * h * dh * n_pos)
        least += at + full * layer + (last if r.layer < n - 1 else 0) + unembed
    return forward, ours, least


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--edges", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", default="eap,exact")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    model = GPT(preset("gpt2"))
    model.init_weights(seed=0)
    model.eval()
    graph = Graph.from_model(model)
    clean = random_tokens(args.batch, args.tokens, seed=1)
    corrupted = random_tokens(args.batch, args.tokens, seed=2)
    print(
        f"GPT-2-small shape, random weights, {args.batch}x{args.tokens} tokens, {graph.n_edges} edges, "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    )

    if "eap" in args.only:

        def fwd_bwd() -> None:
            model.zero_grad(set_to_none=True)
            metric(model(clean)).backward()

        def eap() -> torch.Tensor:
            return eap_scores(model, clean, corrupted, metric)

        t = interleaved({"forward+backward": fwd_bwd, "eap_scores": eap}, repeats=args.repeats)
        model.zero_grad(set_to_none=True)
        a, b = median(t["forward+backward"]), median(t["eap_scores"])
        print(
            f"(a) one forward+backward {a:.3f} s | EAP, all {graph.n_edges} edges {b:.3f} s | "
            f"ratio {b / a:.2f} (goal <= 2: {'PASS' if b / a <= 2 else 'MISS'})"
        )

    if "exact" in args.only:
        edges = torch.randperm(graph.n_edges, generator=torch.Generator().manual_seed(0))[: args.edges].tolist()
        sets = [[e] for e in edges]
        batched_vals = patch_edges(model, clean, corrupted, sets, metric, progress=False)
        separate_vals = separate_forwards(model, graph, clean, corrupted, edges)
        diff = float((batched_vals - torch.tensor(separate_vals)).abs().max())
        assert diff < 1e-4, f"batched and separate patching disagree: max |diff| {diff:.2e}"
        fast_vals = patch_edges(model, clean, corrupted, sets, metric, logit_positions=-1, progress=False)
        fast_diff = float((fast_vals - torch.tensor(separate_vals)).abs().max())
        assert fast_diff < 1e-4, f"logit_positions=-1 changes the values: max |diff| {fast_diff:.2e}"

        def plain() -> None:
            with torch.no_grad():
                for _ in edges:
                    model(clean)

        t = interleaved(
            {
                "plain": plain,
                "separate": lambda: separate_forwards(model, graph, clean, corrupted, edges),
                "batched": lambda: patch_edges(model, clean, corrupted, sets, metric, progress=False),
                "batched, last position": lambda: patch_edges(
                    model, clean, corrupted, sets, metric, logit_positions=-1, progress=False
                ),
            },
            repeats=args.repeats,
            warmup=0,  # the checks above ran each of them once already
        )
        a = median(t["separate"])
        print(f"(b) {args.edges} separate hooked forwards {a:.3f} s; same values everywhere (max |diff| {diff:.1e})")
        p = median(t["plain"])
        print(f"    {args.edges} plain forwards (no hooks, no split inputs) {p:.3f} s: {p / a:.3f} of the hooked ones")
        for label, scored in (("every position scored", args.tokens), ("last position scored", 1)):
            fwd, ours, least = work(graph, model.cfg, edges, args.tokens, scored)
            ours, least = ours / (args.edges * fwd), least / (args.edges * fwd)
            print(
                f"    work (multiply-adds) of {args.edges} plain forwards, {label}: our batched copies {ours:.3f}, "
                f"the least any exact method needs {least:.3f}, i.e. at a plain forward's speed "
                f"{least * p / a:.3f} of the hooked forwards' time"
            )
        for name in ("batched", "batched, last position"):
            b = median(t[name])
            print(
                f"    patch_edges, {name}: {b:.3f} s, ratio {b / a:.3f} (goal <= 0.2: {'PASS' if b / a <= 0.2 else 'MISS'})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
