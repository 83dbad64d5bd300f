"""How well do the edge estimators track exact edge patching on the shipped tiny-gpt2?

Induction prompts (repeated random tokens after BOS); two corruptions ("other": fresh random tokens
everywhere but BOS; "first half": the first copy replaced, so the second repeats nothing); the metric
is the mean log-prob of the next token over the second copy. For EAP, EAP-IG, RelP (with and without
its opt-in AH-rule) and GIM it prints the Pearson correlation with `exact_edge_scores` over the edges
out of the MLP nodes, over the edges out of the heads, and over all edges, and the Spearman rank
correlation over all edges.

    python scripts/estimator_correlations.py [--batch 8] [--seq 20] [--steps 5] [--seed 0]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from torch import Tensor

from interp_gpt import GPT
from interp_gpt.circuits import Graph, eap_ig_scores, eap_scores, exact_edge_scores, gim_scores, relp_scores
from interp_gpt.inspect import repeated_tokens


def pearson(a: Tensor, b: Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1])


def spearman(a: Tensor, b: Tensor) -> float:
    return pearson(a.argsort().argsort().double(), b.argsort().argsort().double())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8, help="prompts (default 8)")
    parser.add_argument("--seq", type=int, default=20, help="random tokens per copy (default 20)")
    parser.add_argument("--steps", type=int, default=5, help="EAP-IG interpolation steps (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts; corruptions use seed + 1")
    args = parser.parse_args(argv)
    for name in ("batch", "seq", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: got {getattr(args, name)}, expected a positive integer")

    torch.set_grad_enabled(False)
    model = GPT.from_pretrained("tiny-gpt2")
    if 2 * args.seq + 1 > model.cfg.n_ctx:
        parser.error(f"--seq: got {args.seq}, expected at most {(model.cfg.n_ctx - 1) // 2}")
    graph = Graph.from_model(model)
    senders = [name.split(" -> ")[0] for name in graph.edge_names]
    groups = {
        "MLP out": torch.tensor([s.startswith("m") for s in senders]),
        "heads out": torch.tensor([s.startswith("a") for s in senders]),
        "all": torch.ones(graph.n_edges, dtype=torch.bool),
    }
    seq = args.seq
    clean = repeated_tokens(model, seq_len=seq, batch_size=args.batch, seed=args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    other = torch.randint(0, model.cfg.d_vocab - 1, clean.shape, generator=gen)
    other[:, 0] = clean[:, 0]
    first = clean.clone()
    first[:, 1 : seq + 1] = torch.randint(0, model.cfg.d_vocab - 1, (clean.shape[0], seq), generator=gen)

    def log_prob(logits: Tensor) -> Tensor:
        lp: Tensor = logits[:, seq + 1 : -1].log_softmax(-1)
        return lp.gather(-1, clean[:, seq + 2 :, None]).mean()

    estimators = {
        "EAP": eap_scores,
        f"EAP-IG({args.steps})": partial(eap_ig_scores, steps=args.steps, progress=False),
        "RelP": relp_scores,
        "RelP+AH": partial(relp_scores, ah_rule=True),
        "GIM": gim_scores,
    }
    print(f"tiny-gpt2, {tuple(clean.shape)} tokens, metric: log-prob of the second copy's next tokens")
    counts = ", ".join(f"{k} {int(v.sum())}" for k, v in groups.items())
    print(f"edges: {counts}; Pearson r with exact edge patching (Spearman over all edges last)\n")
    head = " ".join(f"{k:>10s}" for k in groups)
    print(f"{'corruption':11s} {'estimator':11s} {head} {'Spearman':>9s}")
    positions = list(range(seq + 1, 2 * seq))
    for cname, corrupted in (("other", other), ("first half", first)):
        exact = exact_edge_scores(model, clean, corrupted, log_prob, logit_positions=positions, progress=False)
        for ename, fn in estimators.items():
            scores = fn(model, clean, corrupted, log_prob)
            cells = " ".join(f"{pearson(scores[m], exact[m]):10.3f}" for m in groups.values())
            print(f"{cname:11s} {ename:11s} {cells} {spearman(scores, exact):9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
