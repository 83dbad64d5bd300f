"""Where the plain forward's time goes, ours against Hugging Face sdpa, by kind of operation,
next to what the matmul roofline allows (issue 27, item 4).

    python bench/forward_breakdown.py [--shapes 4x128,1x1024] [--rounds 5] [--threads N] [--json OUT]

Both models are loaded from the same random GPT-2-small-shaped checkpoint (bench/_common's), ours
processed (as bench/run.py's headline row). Each round profiles one forward of each, taking turns,
with `torch.profiler` (CPU activities, input shapes recorded); every top-level aten op's own time
goes to one kind:

    linear     the four attention and two MLP products (mm / addmm / bmm / matmul not of the vocabulary)
    unembed    any product with the vocabulary (d_vocab) as its output width
    attention  q.k, softmax and pattern.v: the fused sdpa kernel, or the explicit ops
    other      LayerNorm, GELU, the adds, copies, views, the embedding lookup

FLOPs per kind come from bench/_common.forward_flops (causal pairs only for attention), and each
kind's rate is shown against the roofline measured in the same run (the best of GPT-2-sized products
alone). The wall times are medians of unprofiled forwards run in the same rounds, so the ratio at the
bottom is the one bench/run.py reports. The last line of each shape is the floor: the products at the
roofline, the attention and the rest as measured, over HF's profiled time.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from run import load_hf, load_ours  # noqa: E402

from interp_gpt.model import Unembed  # noqa: E402

KINDS = ("linear", "unembed", "attention", "other")
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::baddbmm")
ATTENTION = ("scaled_dot_product", "flash_attention", "softmax", "masked_fill", "_efficient_attention")


def kind_of(name: str, shapes: list[Any], d_vocab: int, d_model: int) -> str:
    """The kind of one aten op, from its name and its operands' shapes (see the module docstring)."""
    if any(a in name for a in ATTENTION):
        return "attention"
    if name in MATMULS:
        dims = {d for s in shapes if isinstance(s, (list, tuple)) for d in s}
        if d_vocab in dims or any(
            list(s) == [d_model, Unembed.VOCAB_SLICE] for s in shapes if isinstance(s, (list, tuple))
        ):
            return "unembed"  # the whole vocabulary, or one of the forward's [d_model, 2048] slices of W_U
        return "linear" if d_model in dims or 4 * d_model in dims else "attention"  # else q.k^T, pattern.v
    return "other"


def profile_once(fn: Any, d_vocab: int, d_model: int) -> dict[str, float]:
    """Self CPU time (s) per kind of one call of `fn`, over every aten op (a composite op such as
    aten::linear keeps only its own overhead; the mm it calls counts as a product)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    out: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.name.startswith("aten::"):
            out[kind_of(ev.name, list(ev.input_shapes or []), d_vocab, d_model)] += ev.self_cpu_time_total / 1e6
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4x128,1x1024", help="batch x positions, comma-separated")
    p.add_argument("--rounds", type=int, default=5, help="profiled and timed rounds per shape (median)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds: expected at least 1, got {args.rounds}")
    try:
        shapes = C.parse_shapes(args.shapes)
    except ValueError as e:
        p.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    folder, how = C.checkpoint()
    hf, ours = load_hf(folder, "sdpa", "cpu"), load_ours(folder, "cpu", processed=True)
    d_vocab = ours.cfg.d_vocab
    peak, rows = C.matmul_roofline("cpu", repeats=5)
    print(f"checkpoint: {how}; torch {torch.__version__}; threads {torch.get_num_threads()}")
    print(f"matmul roofline: {peak:.1f} GFLOP/s (" + ", ".join(f"{r['shape']} {r['gflops']:.0f}" for r in rows) + ")")
    report: dict[str, Any] = {"roofline_gflops": peak, "shapes": {}}
    for batch, pos in shapes:
        toks = C.random_tokens(batch, pos)
        fns = {
            "hf_sdpa": lambda t=toks: hf(t, use_cache=False).logits,
            "ours": lambda t=toks: ours(t),
        }
        per: dict[str, list[dict[str, float]]] = {k: [] for k in fns}
        with torch.inference_mode():
            d = float((fns["hf_sdpa"]().log_softmax(-1) - fns["ours"]().log_softmax(-1)).abs().max())
            walls = C.interleaved(fns, args.rounds, warmup=1)
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    per[name].append(profile_once(fn, d_vocab, ours.cfg.d_model))
        flops = C.forward_flops(batch, pos)
        wall = {k: C.median(v) for k, v in walls.items()}
        print(
            f"\n== {batch}x{pos}: wall (unprofiled median) ours {wall['ours'] * 1e3:.1f} ms, HF sdpa "
            f"{wall['hf_sdpa'] * 1e3:.1f} ms, ratio {wall['ours'] / wall['hf_sdpa']:.3f}; logits agree: "
            f"max |log-prob diff| {d:.1e}"
        )
        print(
            f"  {'kind':<10} {'GFLOP':>7} {'ours ms':>9} {'HF ms':>9} {'ours/HF':>8} {'ours % roof':>12} {'HF % roof':>10}"
        )
        shape_rep: dict[str, Any] = {"wall_s": wall, "kinds": {}}
        for kind in KINDS:
            t = {k: C.median([r.get(kind, 0.0) for r in per[k]]) for k in per}
            gf = flops.get(kind, 0.0) / 1e9
            roof = gf / peak if gf else 0.0  # seconds at the roofline
            frac = {k: (roof / t[k] if t[k] and gf else None) for k in t}
            print(
                f"  {kind:<10} {gf:7.1f} {t['ours'] * 1e3:9.1f} {t['hf_sdpa'] * 1e3:9.1f} "
                f"{(t['ours'] / t['hf_sdpa'] if t['hf_sdpa'] else float('nan')):8.2f} "
                + "".join(
                    f"{(f'{100 * f:.0f}%' if f else '-'):>{w}}" for f, w in ((frac["ours"], 12), (frac["hf_sdpa"], 10))
                )
            )
            shape_rep["kinds"][kind] = {"gflop": gf, "ours_s": t["ours"], "hf_s": t["hf_sdpa"]}
        tot = {k: sum(shape_rep["kinds"][kind][f"{'ours' if k == 'ours' else 'hf'}_s"] for kind in KINDS) for k in per}
        print(
            f"  {'profiled':<10} {flops['total'] / 1e9:7.1f} {tot['ours'] * 1e3:9.1f} {tot['hf_sdpa'] * 1e3:9.1f} "
            f"{tot['ours'] / tot['hf_sdpa']:8.2f}"
        )
        # What no change to our products could beat: every product at the roofline, attention and the rest as
        # measured (the attention is the same fused kernel on both sides; the rest is already below HF's).
        k = shape_rep["kinds"]
        floor = (flops["linear"] + flops["unembed"]) / 1e9 / peak + k["attention"]["ours_s"] + k["other"]["ours_s"]
        print(
            f"  floor: products at the roofline + attention and the rest as measured = {floor * 1e3:.1f} ms, "
            f"{floor / tot['hf_sdpa']:.3f} x HF's profiled time"
        )
        shape_rep["floor_s"] = floor
        report["shapes"][f"{batch}x{pos}"] = shape_rep
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
