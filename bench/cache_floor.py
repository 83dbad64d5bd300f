"""`run_with_cache` of every hook against our plain forward, next to what caching must cost on this machine
whatever the code does (issue 27, item 3).

    python bench/cache_floor.py [--shapes 4x128,1x1024] [--repeats 15] [--threads N]

Four competitors in interleaved rounds, one process, ours processed on bench/_common's random GPT-2-small:

    forward        model(tokens): the fused attention kernel, no pattern made
    cache          model.run_with_cache(tokens): every hook (210 on GPT-2 small)
    cache, whole   the same with the attention's query blocks switched off (interp_gpt.model.attention_blocks.BLOCK
                   set past the context): q.k^T, softmax and pattern.v over whole [query, key] squares
    forward+write  the plain forward, then as many new tensors as the cache holds, of the same shapes,
                   each written once (`torch.empty(shape).fill_(1.0)`)

`forward+write` is the reference for what caching must cost: a cache leaves its bytes in new memory that
outlives the call, and this VM hands out fresh pages at a few GB/s (bench/first_touch.py). It over-counts
a little (the cached tensors are the forward's own outputs, written once, not twice) and leaves out the
scores and pattern that the fused kernel never makes; a cache at or under it spends nothing measurable
beyond keeping its bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from run import load_ours  # noqa: E402

import interp_gpt.model.attention_blocks as blocks  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4x128,1x1024", help="batch x positions, comma-separated")
    p.add_argument("--repeats", type=int, default=15, help="interleaved rounds (median)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats: expected at least 1, got {args.repeats}")
    try:
        shapes = C.parse_shapes(args.shapes)
    except ValueError as e:
        p.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    folder, how = C.checkpoint()
    model = load_ours(folder, "cpu", processed=True)
    block = blocks.BLOCK
    print(f"checkpoint: {how}; torch {torch.__version__}; threads {torch.get_num_threads()}; query block {block}")
    for batch, pos in shapes:
        toks = C.random_tokens(batch, pos)
        with torch.inference_mode():
            _, cache = model.run_with_cache(toks)
            held = [t.shape for t in cache.values()]
            nbytes = sum(t.numel() * t.element_size() for t in cache.values())
            del cache

            def whole(toks=toks):  # type: ignore[no-untyped-def]
                blocks.BLOCK = 1 << 30
                try:
                    return model.run_with_cache(toks)
                finally:
                    blocks.BLOCK = block

            fns = {
                "forward": lambda toks=toks: model(toks),
                "cache": lambda toks=toks: model.run_with_cache(toks),
                "cache, whole": whole,
                "forward+write": lambda toks=toks, held=held: (model(toks), [torch.empty(s).fill_(1.0) for s in held]),
            }
            times = C.interleaved(fns, args.repeats, warmup=1)
        med = {k: C.median(v) for k, v in times.items()}
        print(f"\n{batch}x{pos}: the cache holds {len(held)} tensors, {nbytes / 2**30:.2f} GiB")
        for name, t in med.items():
            print(f"  {name:<14} {t * 1e3:8.1f} ms  {t / med['forward']:.3f} x forward")
        print(
            f"  goal: cache <= 1.1 x forward: {med['cache'] / med['forward']:.3f} "
            f"({'PASS' if med['cache'] <= 1.1 * med['forward'] else 'MISS'}); forward+write {med['forward+write'] / med['forward']:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
