"""Where do the induction circuit's edges rank on the shipped tiny-gpt2, and why not higher?

The previous-token head (highest previous-token score in layer 0) and the two induction heads
(highest induction scores in later layers) are found from the model's own attention
(`inspect.head_scores`). On repeated random tokens, for each corruption ("other": fresh random
tokens everywhere but BOS; "first half": the first copy replaced, so the second repeats nothing),
each metric (mean log-prob of the next token over the second copy; KL(clean || patched) there)
and each score (EAP, EAP-IG, exact), it prints the 1-based ranks by |score| of the edges
previous-token head -> induction heads' keys, among all edges and among head -> head edges, and
the top 6 edges. Then the exact effect (`patch_edges`) of the two routes the previous-token
signal takes into the induction keys: directly, and through MLP 0.

    python scripts/induction_edge_ranks.py [--batch 16] [--seq 20] [--steps 10] [--seed 0]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from interp_gpt import GPT
from interp_gpt.circuits import Graph, eap_ig_scores, eap_scores, exact_edge_scores, patch_edges
from interp_gpt.inspect import head_scores, repeated_tokens

Metric = Callable[[Tensor], Tensor]


def find_heads(model: GPT, seq: int) -> tuple[int, list[tuple[int, int]]]:
    """The layer-0 previous-token head and the top-2 induction heads (layer, head) after layer 0."""
    hs = head_scores(model, seq_len=seq)
    prev = int(hs["previous token"][0].argmax())
    order = hs["induction"][1:].flatten().argsort(descending=True)[:2]
    return prev, [(1 + int(i) // model.cfg.n_heads, int(i) % model.cfg.n_heads) for i in order]


def corruptions(model: GPT, clean: Tensor, seq: int, seed: int) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(seed + 1)
    other = torch.randint(0, model.cfg.d_vocab - 1, clean.shape, generator=gen)
    other[:, 0] = clean[:, 0]  # the same BOS
    first = clean.clone()
    first[:, 1 : seq + 1] = torch.randint(0, model.cfg.d_vocab - 1, (clean.shape[0], seq), generator=gen)
    return {"other": other, "first half": first}


def metrics(model: GPT, clean: Tensor, seq: int) -> dict[str, Metric]:
    with torch.no_grad():
        clean_lp: Tensor = model(clean)[:, seq + 1 : -1].log_softmax(-1)

    def log_prob(logits: Tensor) -> Tensor:
        lp: Tensor = logits[:, seq + 1 : -1].log_softmax(-1)
        return lp.gather(-1, clean[:, seq + 2 :, None]).mean()

    def kl(logits: Tensor) -> Tensor:
        lp: Tensor = logits[:, seq + 1 : -1].log_softmax(-1)
        return (clean_lp.exp() * (clean_lp - lp)).sum(-1).mean()

    return {"log-prob": log_prob, "KL": kl}


def m0_path_value(
    model: GPT, clean: Tensor, corrupted: Tensor, prev: int, induction: list[tuple[int, int]], metric: Metric
) -> float:
    """The metric with only the path a0.h{prev} -> m0 -> induction keys patched: the head's
    corrupted-minus-clean output added to MLP 0's input, and the change that makes in MLP 0's
    output added to the induction heads' key inputs only (plain hooks; every other input clean)."""
    names = ["blocks.0.attn.hook_z", "blocks.0.hook_mlp_out"]
    (_, c), (_, x) = (model.run_with_cache(t, names_filter=names) for t in (clean, corrupted))
    d_head = (x[names[0]][:, :, prev] - c[names[0]][:, :, prev]) @ model.W_O[0, prev]
    out: dict[str, Tensor] = {}

    def into_keys(t: Tensor, hook: object, heads: list[int]) -> Tensor:  # t: [batch, pos, n_heads, d_model]
        t = t.clone()
        t[:, :, heads] += (out["m0"] - c[names[1]])[:, :, None]
        return t

    saved = model.cfg.use_hook_mlp_in, model.cfg.use_split_qkv_input
    model.set_use_hook_mlp_in(True)
    model.set_use_split_qkv_input(True)
    try:
        hooks = [("blocks.0.hook_mlp_in", lambda t, hook: t + d_head), (names[1], lambda t, hook: out.update(m0=t))]
        model.run_with_hooks(clean, fwd_hooks=hooks)
        layers = sorted({L for L, _ in induction})
        hooks = [
            (f"blocks.{L}.hook_k_input", partial(into_keys, heads=[h for i, h in induction if i == L])) for L in layers
        ]
        return float(metric(model.run_with_hooks(clean, fwd_hooks=hooks)))
    finally:
        model.set_use_hook_mlp_in(saved[0])
        model.set_use_split_qkv_input(saved[1])


def rank(scores: Tensor, among: Tensor, edge: int) -> int:
    """1-based rank of `edge` by |score| among the edges of the bool mask `among`."""
    return int((scores[among].abs() > scores[edge].abs()).sum()) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="prompts (default 16)")
    parser.add_argument("--seq", type=int, default=20, help="random tokens per copy (default 20)")
    parser.add_argument("--steps", type=int, default=10, help="EAP-IG interpolation steps (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts; corruptions use seed + 1")
    args = parser.parse_args(argv)
    for name in ("batch", "seq", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: got {getattr(args, name)}, expected a positive integer")

    torch.set_grad_enabled(False)  # the edge scores turn gradients on for themselves
    model = GPT.from_pretrained("tiny-gpt2")
    if 2 * args.seq + 1 > model.cfg.n_ctx:
        parser.error(f"--seq: got {args.seq}, expected at most {(model.cfg.n_ctx - 1) // 2}")
    graph = Graph.from_model(model)
    prev, induction = find_heads(model, args.seq)
    keys = [f"a0.h{prev} -> a{L}.h{h}<k>" for L, h in induction]
    via_m0 = [f"m0 -> a{L}.h{h}<k>" for L, h in induction]
    into_m0 = [f"a0.h{prev} -> m0"]
    print(f"previous-token head a0.h{prev}; induction heads " + ", ".join(f"a{L}.h{h}" for L, h in induction))
    head_to_head = torch.tensor([n.startswith("a") and n.split(" -> ")[1].startswith("a") for n in graph.edge_names])
    n_all, n_hh = graph.n_edges, int(head_to_head.sum())
    clean = repeated_tokens(model, seq_len=args.seq, batch_size=args.batch, seed=args.seed)
    positions = list(range(args.seq + 1, 2 * args.seq))  # the positions the metrics read
    print(f"{tuple(clean.shape)} tokens; ranks 1-based by |score|, of {n_all} edges / of {n_hh} head -> head edges")
    print(f"edges: {', '.join(keys)}\n")
    print(f"{'corruption':11s} {'metric':9s} {'score':7s} {'of ' + str(n_all):>9s} {'of ' + str(n_hh):>8s}  top 6")
    metric_fns = metrics(model, clean, args.seq)
    runs = [(c, m) for c in corruptions(model, clean, args.seq, args.seed).items() for m in metric_fns.items()]
    for (cname, corrupted), (mname, metric) in runs:
        for sname, scores in (
            ("EAP", eap_scores(model, clean, corrupted, metric)),
            ("EAP-IG", eap_ig_scores(model, clean, corrupted, metric, steps=args.steps, progress=False)),
            ("exact", exact_edge_scores(model, clean, corrupted, metric, logit_positions=positions, progress=False)),
        ):
            idx = [graph.edge_index(e) for e in keys]
            r_all = ",".join(str(rank(scores, torch.ones_like(head_to_head), i)) for i in idx)
            r_hh = ",".join(str(rank(scores, head_to_head, i)) for i in idx)
            top = "; ".join(name for name, _ in graph.top_edges(scores, k=6))
            print(f"{cname:11s} {mname:9s} {sname:7s} {r_all:>9s} {r_hh:>8s}  {top}")

    sets = {
        "direct": keys,
        f"a0.h{prev}->m0": into_m0,
        "m0->keys": via_m0,
        "direct+m0->keys": keys + via_m0,
        "all three": keys + into_m0 + via_m0,
    }
    print(f"\nexact patching: share of (clean - corrupted) lost; m0 path: a0.h{prev} -> m0 -> keys alone (by hooks)")
    head = " ".join(f"{k:>15s}" for k in [*sets, "m0 path"])
    print(f"{'corruption':11s} {'metric':9s} {'clean':>7s} {'corrupt':>7s} {head}")
    for (cname, corrupted), (mname, metric) in runs:
        with torch.no_grad():
            corrupted_value = float(metric(model(corrupted)))
        sweep = patch_edges(
            model, clean, corrupted, [[], *sets.values()], metric, logit_positions=positions, progress=False
        )
        values = sweep.tolist() + [m0_path_value(model, clean, corrupted, prev, induction, metric)]
        shares = [(values[0] - v) / (values[0] - corrupted_value) for v in values[1:]]
        print(
            f"{cname:11s} {mname:9s} {values[0]:+7.3f} {corrupted_value:+7.3f} "
            + " ".join(f"{x:15.1%}" for x in shares)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
