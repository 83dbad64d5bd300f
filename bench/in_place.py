"""A/B: the forward with and without its in-place bias adds and MLP activation, in one process.

    python bench/in_place.py [--repeats 15] [--shapes 4x128,1x1024] [--threads N]

Without autograd, `interp_gpt.model.add_bias` adds each bias into the fresh matmul output
and `MLP.forward` runs the activation in place when nothing hooks `hook_pre`. "B" is the same
model with both switched off (module attributes patched: every bias is `x + b`, every
activation makes a new tensor), which is the code before the change. The two run in
alternating rounds on the same tokens, so machine noise lands on both; the script checks
first that they give bit-identical logits, then prints medians of wall time and of
process CPU time (CPU time leaves out time the VM was not scheduled), and A / B.
Also timed: `run_with_cache` of every hook, where the activation must not run in place
(hook_pre is cached), so only the bias adds differ.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import interp_gpt.model.gpt as M  # noqa: E402
from interp_gpt import GPT  # noqa: E402


def switched_off():  # type: ignore[no-untyped-def]
    """Patch the in-place ops out; returns a function that puts them back."""
    saved = M.add_bias, M.IN_PLACE
    M.add_bias, M.IN_PLACE = (lambda x, b: x + b), {}

    def restore() -> None:
        M.add_bias, M.IN_PLACE = saved

    return restore


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--shapes", default="4x128,1x1024")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--checkpoint", default=None)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats: expected at least 1, got {args.repeats}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads: expected at least 1, got {args.threads}")
    try:
        shapes = _common.parse_shapes(args.shapes)
    except ValueError as e:
        p.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    folder, _ = _common.checkpoint(args.checkpoint)
    model = GPT.from_pretrained(str(folder), tokenizer=None)
    print(
        f"interp_gpt forward, in-place ops on (A) vs off (B); torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {args.repeats} rounds after 1 warm-up, medians"
    )
    failed = False
    for batch, pos in shapes:
        shape = f"{batch}x{pos}"
        tokens = _common.random_tokens(batch, pos)
        with torch.inference_mode():
            a = model(tokens)
            restore = switched_off()
            b = model(tokens)
            restore()
        same = torch.equal(a, b)
        failed |= not same
        print(f"\n{shape}: logits bit-identical: {same}")
        del a, b
        for what in ["forward", "run_with_cache (all hooks)"]:
            run = (lambda t=tokens: model(t)) if what == "forward" else (lambda t=tokens: model.run_with_cache(t))
            wall: dict[str, list[float]] = {"A": [], "B": []}
            cpu: dict[str, list[float]] = {"A": [], "B": []}
            with torch.inference_mode():
                for round_ in range(args.repeats + 1):
                    for side in ("A", "B"):
                        restore = switched_off() if side == "B" else (lambda: None)
                        gc.collect()
                        t0, c0 = time.perf_counter(), time.process_time()
                        out = run()
                        t1, c1 = time.perf_counter(), time.process_time()
                        del out
                        restore()
                        if round_:
                            wall[side].append(t1 - t0)
                            cpu[side].append(c1 - c0)
            mw = {s: statistics.median(v) for s, v in wall.items()}
            mc = {s: statistics.median(v) for s, v in cpu.items()}
            print(
                f"  {what:28s} wall A {mw['A'] * 1e3:8.1f} ms  B {mw['B'] * 1e3:8.1f} ms  A/B {mw['A'] / mw['B']:.3f}"
                f"   cpu A {mc['A'] * 1e3:8.1f} ms  B {mc['B'] * 1e3:8.1f} ms  A/B {mc['A'] / mc['B']:.3f}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
