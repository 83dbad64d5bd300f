"""Benchmark: edge-attribution methods as MIB scores them, offline, on the shipped tiny-gpt2 and on a random
GPT-2-small-shaped model: each method's correlation with exact single-edge patching, its CPR and CMD
(MIB's patching intervention, edge level) on the offline tasks, and its time; the random-circuit baseline.

    PYTHONPATH=. .venv/bin/python bench/mib_methods.py                 # both models (about 10 min, 1 thread)
    PYTHONPATH=. .venv/bin/python bench/mib_methods.py --quick         # tiny-gpt2 only, small tasks (~1 min)

Methods: EAP, EAP-IG (5 steps), GIM, RelP, AtP* (with GradDrop, and without).
"Exact" is `exact_edge_scores` (each edge patched alone, its metric change): on tiny-gpt2 over every edge;
on the GPT-2-small-shaped model over a sample of edges (`--edges`, random plus the largest by EAP, so the
correlation sees the edges that matter). Pearson correlations over all scored edges and over the edges
out of MLP nodes (the RelP paper's comparison is on MLP outputs), and of |score| with |exact| over all
(MIB ranks edges by magnitude; AtP* with GradDrop scores magnitudes only, so only this one applies). Times: one run each after a warm-up, one
thread, the model's default batching. Writes a JSON and a markdown table (`--out`).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import interp_gpt
from interp_gpt import GPT
from interp_gpt.circuits import Graph, eap_ig_scores, eap_scores, exact_edge_scores
from interp_gpt.circuits.mib import Task, induction_task, mib_random_baseline, mib_score, name_mover_task

Method = Callable[[GPT, Task], Tensor]


def methods() -> dict[str, Method]:
    """The scorers this checkout has, by name."""
    import interp_gpt.circuits as circuits

    out: dict[str, Method] = {
        "EAP": lambda m, t: eap_scores(m, t.clean, t.corrupted, t.metric),
        "EAP-IG (5 steps)": lambda m, t: eap_ig_scores(m, t.clean, t.corrupted, t.metric, steps=5, progress=False),
    }
    for name, attr, kw in (
        ("GIM", "gim_scores", {}),
        ("RelP", "relp_scores", {}),
        ("AtP*", "atp_star_scores", {}),
        ("AtP* (no GradDrop)", "atp_star_scores", {"grad_drop": False}),
    ):
        fn = getattr(circuits, attr, None)
        if fn is not None:
            out[name] = lambda m, t, fn=fn, kw=kw: fn(m, t.clean, t.corrupted, t.metric, **kw)
    return out


def pearson(a: Tensor, b: Tensor) -> float:
    keep = ~(a.isnan() | b.isnan())
    a, b = a[keep].double(), b[keep].double()
    if len(a) < 3 or float(a.std()) == 0 or float(b.std()) == 0:
        return float("nan")
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


def sample_edges(graph: Graph, eap: Tensor, n: int, seed: int) -> Tensor:
    """`n` edges: half the largest by |EAP|, half at random from the rest (every MLP edge into the logits too)."""
    if n >= graph.n_edges:
        return torch.arange(graph.n_edges)
    top = eap.abs().argsort(descending=True)[: n // 2]
    rest = torch.ones(graph.n_edges, dtype=torch.bool)
    rest[top] = False
    pool = rest.nonzero().flatten()
    pick = pool[torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[: n - len(top)]]
    return torch.cat([top, pick]).sort().values


def run_model(label: str, model: GPT, tasks: list[Task], n_edges: int, n_random: int) -> dict[str, Any]:
    graph = Graph(model.cfg)
    mlp_senders = {graph.mlp_sender(layer) for layer in range(graph.n_layers)}
    out_of_mlp = torch.tensor([int(s) in mlp_senders for s in graph.edge_sender])
    rows: dict[str, Any] = {"model": label, "n_edges": graph.n_edges, "tasks": {}}
    for task in tasks:
        print(f"== {label}: {task!r}", flush=True)
        eap = eap_scores(model, task.clean, task.corrupted, task.metric)
        edges = sample_edges(graph, eap, n_edges, 0)
        t0 = time.perf_counter()
        exact = exact_edge_scores(model, task.clean, task.corrupted, task.metric, edges, logit_positions=task.positions,
                                  progress=False)  # fmt: skip
        t_exact = time.perf_counter() - t0
        with torch.no_grad():
            clean, corrupted = float(task.metric(model(task.clean))), float(task.metric(model(task.corrupted)))
        entry: dict[str, Any] = {
            "prompts": len(task),
            "tokens": task.clean.shape[1],
            "metric_clean": clean,
            "metric_corrupted": corrupted,
            "exact_edges": len(edges),
            "exact_time_s": t_exact,
            "methods": {},
        }
        for name, fn in methods().items():
            fn(model, task.head(min(2, len(task))))  # warm-up
            t0 = time.perf_counter()
            scores = fn(model, task)
            seconds = time.perf_counter() - t0
            result = mib_score(model, task, scores, progress=False)
            mlp = out_of_mlp[edges]
            signed = not name.startswith("AtP*") or "no GradDrop" in name  # GradDrop's scores are magnitudes
            entry["methods"][name] = {
                "time_s": seconds,
                "corr_exact_all": pearson(scores[edges], exact[edges]) if signed else float("nan"),
                "corr_exact_mlp_out": pearson(scores[edges][mlp], exact[edges][mlp]) if signed else float("nan"),
                "corr_abs_all": pearson(scores[edges].abs(), exact[edges].abs()),
                "cpr": result.cpr,
                "cmd": result.cmd,
                "faithfulness": [round(float(f), 4) for f in result.faithfulness],
            }
            m = entry["methods"][name]
            print(f"  {name:22s} {seconds:7.2f} s  corr {m['corr_exact_all']:+.3f} (MLP out {m['corr_exact_mlp_out']:+.3f}, "
                  f"|.| {m['corr_abs_all']:+.3f})  CPR {result.cpr:.4f}  CMD {result.cmd:.4f}", flush=True)  # fmt: skip
        base = mib_random_baseline(model, task, n_samples=n_random, progress=False)
        entry["random"] = {"cpr_mean": base.cpr_mean, "cpr_std": base.cpr_std, "cmd_mean": base.cmd_mean,
                           "cmd_std": base.cmd_std, "samples": n_random}  # fmt: skip
        print(f"  random ({n_random} draws)       CPR {base.cpr_mean:.4f} ± {base.cpr_std:.4f}  "
              f"CMD {base.cmd_mean:.4f} ± {base.cmd_std:.4f}", flush=True)  # fmt: skip
        rows["tasks"][task.name] = entry
    return rows


def _r(x: float) -> str:
    return "n/a" if x != x else f"{x:+.3f}"


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model | task | method | r with exact: all / out of MLPs / \\|score\\| vs \\|exact\\| | CPR ↑ | CMD ↓ | time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for task, e in r["tasks"].items():
            for name, m in e["methods"].items():
                lines.append(
                    f"| {r['model']} | {task} | {name} | {_r(m['corr_exact_all'])} / {_r(m['corr_exact_mlp_out'])} / "
                    f"{_r(m['corr_abs_all'])} | "
                    f"{m['cpr']:.4f} | {m['cmd']:.4f} | {m['time_s']:.2f} s |"
                )
            rnd = e["random"]
            lines.append(
                f"| {r['model']} | {task} | random ({rnd['samples']} draws) | | {rnd['cpr_mean']:.4f} ± {rnd['cpr_std']:.4f} | "
                f"{rnd['cmd_mean']:.4f} ± {rnd['cmd_std']:.4f} | |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny-gpt2 only, 8 prompts per task")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--edges", type=int, default=400, help="edges patched exactly on the GPT-2-small-shaped model")
    p.add_argument("--random", type=int, default=10, help="random-circuit draws")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="write <out>.json and <out>.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    n = 8 if args.quick else args.prompts
    tiny = GPT.from_pretrained("tiny-gpt2")
    results = [
        run_model("tiny-gpt2", tiny, [induction_task(tiny, n=n), name_mover_task(tiny, n=n)], 10**9, args.random)
    ]
    if not args.quick:
        small = GPT(interp_gpt.config.preset("gpt2"))
        small.init_weights(seed=0)
        small.eval()
        results.append(
            run_model("random GPT-2 small", small, [induction_task(small, n=8, half=6)], args.edges, args.random)
        )
    md = table(results)
    print(md)
    if args.out is not None:
        meta = {"date": str(date.today()), "machine": platform.processor() or platform.machine(), "threads": args.threads,
                "torch": torch.__version__, "command": "bench/mib_methods.py"}  # fmt: skip
        args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        args.out.with_suffix(".txt").write_text(md + "\n")


if __name__ == "__main__":
    main()
