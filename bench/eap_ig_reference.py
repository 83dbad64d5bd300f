"""Benchmark: our `eap_ig_scores` against the EAP-IG research code's EAP-IG (inputs), same random
GPT-2-small-shaped weights and prompts, CPU, timed in one run (interleaved).

The reference is the EAP-IG research code, github.com/hannamw/EAP-IG at commit
795f5607b25638935aec89aee3c1cb4bd9ed72f1, its package (`eap`, under `src/`) on PYTHONPATH; it is
not on PyPI and is not installed here. It wraps a transformer-lens `HookedTransformer`, so it runs
from a bench-only venv holding its PyPI dependencies, our package on PYTHONPATH too:

    python3 -m venv /work/venvs/eapig
    /work/venvs/eapig/bin/pip install torch==2.13.0
    /work/venvs/eapig/bin/pip install transformer-lens==3.9.0 matplotlib
    PYTHONPATH=.:<EAP-IG checkout>/src /work/venvs/eapig/bin/python bench/eap_ig_reference.py \
        [--batch 8] [--tokens 20] [--steps 5] [--repeats 3] [--tiny]

Run-time patches (their files are not edited): `eap.attribute` makes its score matrices with
`torch.zeros(..., device='cuda')`, so its module global `torch` is replaced by a proxy whose
`zeros` puts a `device='cuda'` tensor on `--device` (cpu) and which hands every other name to
torch. Its `tokenize_plus` (strings -> tokens via the model's tokenizer, BOS prepended) is replaced
by one that passes our token-id prompts through with an all-ones attention mask: both sides see
the same ids.

The model: `GPT(preset("gpt2"))`, `init_weights(seed=0)`, its state dict loaded into a TL 3.9
`HookedTransformer` of the same config with `use_attn_result`, `use_split_qkv_input`,
`use_hook_mlp_in` on (their `attribute` asserts these). Metric: the logit difference at the last
position, `logit[1000] - logit[2000]`, a mean over prompts for us and a sum for them (they divide
the scores by the number of prompts). Both score `(corrupted - clean) sender . d metric / d
receiver input`, summed over positions, on the same edge graph (their edge `a0.h1->a1.h0<q>` is
our `a0.h1 -> a1.h0<q>`; their input sender is `hook_embed`, ours the embeddings plus positions:
the positions cancel in the difference and are equal on both ends of the interpolation).

Definitions: both interpolate only the input embeddings, `corrupted + a (clean - corrupted)`, and
average the gradient over `steps` runs. They use a = k/steps for k = 0..steps-1 (the corrupted
run, not the clean one); we use k = 1..steps (the clean run, not the corrupted one). So, with
g(a) the per-edge score with the gradient taken at a, theirs = ours + (g(0) - g(1)) / steps,
where g(1) is our `eap_scores(clean, corrupted)` and g(0) = -`eap_scores(corrupted, clean)`: the
comparison adds that to ours. Their `EAP` (g(1)) and `clean-corrupted` ((g(0) + g(1)) / 2) are
compared directly. Their `EAP-IG-activations` (every sender group's output interpolated in turn,
k = 1..steps, the gradient averaged over all (2 n_layers + 1) * steps runs) is not computed by us.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TorchOn, edge_hooked_transformer, interleaved, median, random_tokens  # noqa: E402

from interp_gpt import GPT, preset  # noqa: E402
from interp_gpt.circuits import Graph, eap_ig_scores, eap_scores  # noqa: E402

ANSWER, WRONG = 1000, 2000
COMMIT = "795f5607b25638935aec89aee3c1cb4bd9ed72f1"


def metric(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, ANSWER] - logits[:, -1, WRONG]).mean()


def their_metric(logits: torch.Tensor, clean_logits: Any, input_lengths: Any, label: Any) -> torch.Tensor:
    return (logits[:, -1, ANSWER] - logits[:, -1, WRONG]).sum()


def tokens_as_is(model: Any, tokens: torch.Tensor, max_length: Any = None) -> tuple:
    """`eap.utils.tokenize_plus` for prompts that are token ids already: no BOS, no padding."""
    mask = torch.ones_like(tokens)
    return tokens, mask, mask.sum(1), tokens.shape[1]


def compare(name: str, ours: torch.Tensor, theirs: torch.Tensor, tops: tuple[int, ...] = (100, 1000)) -> float:
    diff = float((ours - theirs).abs().max())
    scale = float(theirs.abs().max())
    overlap = []
    for k in (min(k, ours.numel()) for k in tops):
        a = set(ours.abs().topk(k).indices.tolist())
        b = set(theirs.abs().topk(k).indices.tolist())
        overlap.append(f"top-{k} by |score| shared {len(a & b)}/{k}")
    print(
        f"  {name}: max |diff| {diff:.2e}, largest |score| {scale:.2e}, relative {diff / scale:.1e}; {', '.join(overlap)}"
    )
    return diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tiny", action="store_true", help="2 layers, d_model 64: a quick equality check")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import eap.attribute  # noqa: F401  (fails here, with its reason, where it is not on PYTHONPATH)
    from eap.attribute import attribute
    from eap.graph import Graph as TheirGraph

    eap.attribute.torch = TorchOn(args.device)  # type: ignore[assignment]
    eap.attribute.tokenize_plus = tokens_as_is  # type: ignore[assignment]

    cfg = dataclasses.replace(preset("gpt2"), tokenizer_name=None)  # token ids only: no vocabulary files needed
    if args.tiny:
        cfg = dataclasses.replace(cfg, n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=256)
    model = GPT(cfg)
    model.init_weights(seed=0)
    model.to(args.device).eval()
    graph = Graph.from_model(model)
    tl = edge_hooked_transformer(model, args.device)

    clean = random_tokens(args.batch, args.tokens, seed=1).to(args.device)
    corrupted = random_tokens(args.batch, args.tokens, seed=2).to(args.device)
    with torch.no_grad():
        same = float((tl(clean) - model(clean)).abs().max())
    shape = "tiny (2 layers, d_model 64)" if args.tiny else "GPT-2-small shape"
    print(
        f"{shape}, random weights, {args.batch}x{args.tokens} tokens, {args.steps} steps, {graph.n_edges} edges, "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.device}; EAP-IG code {COMMIT[:7]}; "
        f"TL vs our logits max |diff| {same:.1e}"
    )

    theirs_graph = TheirGraph.from_model(tl)
    loader = [(clean, corrupted, None)]
    # Their edges' cells in the [n_forward, n_backward] score matrix, in our edge order.
    cells = torch.zeros(graph.n_edges, 2, dtype=torch.long)
    seen = torch.zeros(graph.n_edges, dtype=torch.bool)
    for edge in theirs_graph.edges.values():
        i = graph.edge_index(edge.name.replace("->", " -> "))
        cells[i] = torch.tensor(edge.matrix_index)
        seen[i] = True
    print(f"edges: theirs {len(theirs_graph.edges)}, ours {graph.n_edges}, matched {int(seen.sum())}")

    def theirs(method: str, steps: int | None = None) -> torch.Tensor:
        attribute(tl, theirs_graph, loader, their_metric, method=method, ig_steps=steps, quiet=True)
        return theirs_graph.scores[cells[:, 0], cells[:, 1]].clone()

    def ours() -> torch.Tensor:
        return eap_ig_scores(model, clean, corrupted, metric, steps=args.steps, progress=False)

    g1 = eap_scores(model, clean, corrupted, metric).cpu()  # gradient at the clean run
    g0 = -eap_scores(model, corrupted, clean, metric).cpu()  # gradient at the corrupted run
    mine = ours().cpu()
    their_ig = theirs("EAP-IG-inputs", args.steps)
    print("scores, ours against theirs (abs diff over every edge):")
    d_eap = compare("EAP: eap_scores vs their 'EAP'", g1, theirs("EAP"))
    d_cc = compare("clean-corrupted: (g(0) + g(1)) / 2 vs theirs", (g0 + g1) / 2, theirs("clean-corrupted"))
    d_ig = compare(
        f"EAP-IG, alphas matched: ours + (g(0) - g(1))/{args.steps} vs their 'EAP-IG-inputs'",
        mine + (g0 - g1) / args.steps,
        their_ig,
    )
    compare("EAP-IG as each defines it (k=1..steps vs k=0..steps-1)", mine, their_ig)
    worst = max(d_eap, d_cc, d_ig)
    print(
        f"goal: scores equal to 1e-4 where the definitions match: max |diff| {worst:.2e}: {'PASS' if worst <= 1e-4 else 'MISS'}"
    )

    fns = {"their EAP-IG-inputs": lambda: theirs("EAP-IG-inputs", args.steps), "our eap_ig_scores": ours}
    t = interleaved(fns, repeats=args.repeats, device=args.device)
    a, b = median(t["their EAP-IG-inputs"]), median(t["our eap_ig_scores"])
    print(
        f"their attribute(method='EAP-IG-inputs', ig_steps={args.steps}) {a:.3f} s | our eap_ig_scores(steps="
        f"{args.steps}) {b:.3f} s | ratio ours/theirs {b / a:.3f} (goal <= 0.25: {'PASS' if b / a <= 0.25 else 'MISS'})"
    )
    print("times (s):", {k: [round(x, 3) for x in v] for k, v in t.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
