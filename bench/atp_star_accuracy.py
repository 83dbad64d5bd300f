"""How well AtP* (`atp_star_scores`, with and without GradDrop) and EAP (`eap_scores`) estimate the exact
edge effects (`exact_edge_scores`) on the shipped tiny-gpt2, on an induction prompt, and what each costs.

    python bench/atp_star_accuracy.py [--batch 4] [--half 10] [--repeats 3] [--threads 1] [--seed 0]

Clean prompts: `bos, s, s` with s `--half` random tokens (the second copy is predictable by induction);
corrupted: `bos, s', s` (the first copy replaced by other random tokens, so nothing earlier predicts the
second copy). Metric: the mean log-probability of the induction targets (the next token of the second
copy). Correlations (Pearson and Spearman) with the exact scores over all edges and over the edges into
q / k inputs; GradDrop's scores are magnitudes, so they are set beside |exact|. Times: the best of
`--repeats` runs (a shared machine: only the ratios mean anything).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from interp_gpt import GPT
from interp_gpt.circuits import Graph, atp_star_scores, eap_scores, exact_edge_scores


def prompts(model: GPT, batch: int, half: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    vocab = model.cfg.d_vocab
    s = torch.randint(1, vocab, (batch, half), generator=gen)
    other = torch.randint(1, vocab, (batch, half), generator=gen)
    bos = torch.zeros(batch, 1, dtype=torch.long)
    return torch.cat([bos, s, s], 1), torch.cat([bos, other, s], 1)


def induction_metric(clean: torch.Tensor, half: int) -> Callable[[torch.Tensor], torch.Tensor]:
    # Positions 1 + half .. 2 * half - 1 + 1 read a token of the second copy and predict the next one.
    pos = torch.arange(1 + half, 2 * half)
    targets = clean[:, pos + 1]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        logp = logits[:, pos].log_softmax(-1)
        return logp.gather(-1, targets[..., None]).mean()

    return metric


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1])


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    def rank(x: torch.Tensor) -> torch.Tensor:
        return x.argsort().argsort().double()

    return pearson(rank(a), rank(b))


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> tuple[torch.Tensor, float]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    assert out is not None
    return out, best


def main(argv: Any = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--half", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = GPT.from_pretrained("tiny-gpt2")
    clean, corrupted = prompts(model, args.batch, args.half, args.seed)
    metric = induction_metric(clean, args.half)
    graph = Graph(model.cfg)
    qk = torch.tensor([graph.receivers[int(r)].kind in ("q", "k") for r in graph.edge_receiver])
    with torch.no_grad():
        m_clean, m_corr = float(metric(model(clean))), float(metric(model(corrupted)))
    print(f"tiny-gpt2: {graph.n_edges} edges ({int(qk.sum())} into q / k); prompts {tuple(clean.shape)}")
    print(f"metric (mean log-prob of the induction targets): clean {m_clean:.4f}, corrupted {m_corr:.4f}")
    runs = {
        "exact": lambda: exact_edge_scores(model, clean, corrupted, metric, progress=False),
        "EAP": lambda: eap_scores(model, clean, corrupted, metric),
        "AtP* (QK fix, no GradDrop)": lambda: atp_star_scores(model, clean, corrupted, metric, grad_drop=False),
        "AtP* (QK fix + GradDrop)": lambda: atp_star_scores(model, clean, corrupted, metric),
    }
    got = {name: timed(fn, args.repeats) for name, fn in runs.items()}
    exact = got["exact"][0]
    print(f"{'method':30} {'time s':>8} {'r all':>7} {'rho all':>8} {'r q/k':>7} {'rho q/k':>8}  vs")
    for name, (scores, secs) in got.items():
        magnitudes = name.endswith("+ GradDrop)")
        ref = exact.abs() if magnitudes else exact
        vs = "|exact|" if magnitudes else "exact"
        r_all, rho_all = pearson(scores, ref), spearman(scores, ref)
        r_qk, rho_qk = pearson(scores[qk], ref[qk]), spearman(scores[qk], ref[qk])
        print(f"{name:30} {secs:8.4f} {r_all:7.3f} {rho_all:8.3f} {r_qk:7.3f} {rho_qk:8.3f}  {vs}")
    for name in ("EAP", "AtP* (QK fix, no GradDrop)"):
        s = got[name][0]
        print(
            f"{name}: vs |exact| by |score|: r all {pearson(s.abs(), exact.abs()):.3f}, r q/k {pearson(s[qk].abs(), exact[qk].abs()):.3f}"
        )


if __name__ == "__main__":
    main()
