"""How much a first touch of fresh memory costs on this machine, next to the same copy into
memory already in use. It bounds what caching N bytes of new activations can cost even when
no arithmetic is done: the kernel must hand out (and zero) every new page.

    python bench/first_touch.py [--mb 154] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=154.0, help="size of the copy in MB (default: GPT-2's W_U)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if not args.mb > 0:
        p.error(f"--mb: expected a size above 0 MB, got {args.mb}")
    if args.repeats < 1:
        p.error(f"--repeats: expected at least 1, got {args.repeats}")
    n = int(args.mb * 1e6 / 4)
    src = torch.randn(n)
    used = torch.empty(n)
    used.copy_(src)  # touched once: its pages are resident from here on
    fresh_s, used_s = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        dst = torch.empty(n)  # above glibc's mmap threshold: new, untouched pages every time
        dst.copy_(src)
        fresh_s.append(time.perf_counter() - t0)
        del dst
        t0 = time.perf_counter()
        used.copy_(src)
        used_s.append(time.perf_counter() - t0)
    f, u = statistics.median(fresh_s), statistics.median(used_s)
    print(
        f"copy of {args.mb:.0f} MB, median of {args.repeats}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"  into fresh memory: {f * 1e3:7.1f} ms  ({args.mb / 1e3 / f:5.2f} GB/s)")
    print(f"  into used memory:  {u * 1e3:7.1f} ms  ({args.mb / 1e3 / u:5.2f} GB/s)")
    print(f"  first touch costs {f / u:.1f}x the copy itself")


if __name__ == "__main__":
    main()
