"""`run_with_cache` of every hook against the plain forward when called again and again, each call's cache
dropped before the next (the pattern an outside A/B measures), under the settings that decide what that
pattern pays (issue 39's reconcile with bench/cache_floor.py).

    python bench/cache_repeated.py [--shape 1x1024] [--repeats 6] [--threads 2]

Each variant runs in a fresh process (bench/_common's random GPT-2 small, processed), interleaved rounds of
`model(tokens)` and `model.run_with_cache(tokens)` (its result dropped), medians:
  inference     under torch.inference_mode() (bench/cache_floor.py's setting)
  grad          plain calls, autograd on (what a user's script does without no_grad)
and each with glibc's default malloc (which gives a large freed block back to the OS, so the next call's
cache lands on fresh pages: a page fault per 4 KiB) and with MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_
set high (freed blocks stay in the process and the next call reuses them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**34), "MALLOC_TOP_PAD_": str(2**28)}


def worker(shape: str, repeats: int, threads: int, grad: bool) -> dict[str, float]:
    import torch

    sys.path.insert(0, str(HERE))
    import _common as C
    from run import load_ours

    torch.set_num_threads(threads)
    batch, pos = C.parse_shapes(shape)[0]
    folder, _ = C.checkpoint()
    model = load_ours(folder, "cpu", processed=True)
    toks = C.random_tokens(batch, pos)
    fns = {"forward": lambda: model(toks), "cache": lambda: model.run_with_cache(toks)}
    if grad:
        times = C.interleaved(fns, repeats, warmup=1)
    else:
        with torch.inference_mode():
            times = C.interleaved(fns, repeats, warmup=1)
    return {k: C.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1x1024")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    p.add_argument("--worker", choices=["inference", "grad"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.shape, args.repeats, args.threads, args.worker == "grad")))
        return 0
    out = {}
    for mode in ("inference", "grad"):
        for malloc, extra in (("glibc default", {}), ("freed blocks kept", KEEP)):
            env = {**os.environ, **extra}
            cmd = [sys.executable, __file__, "--worker", mode, "--shape", args.shape, "--repeats", str(args.repeats),
                   "--threads", str(args.threads)]  # fmt: skip
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            med = json.loads(done.stdout.strip().splitlines()[-1])
            ratio = med["cache"] / med["forward"]
            out[f"{mode}, {malloc}"] = {**med, "ratio": ratio}
            print(f"{mode:9s} {malloc:18s} forward {med['forward']:.3f} s  cache {med['cache']:.3f} s  {ratio:.3f} x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
