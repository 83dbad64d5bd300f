"""Harvest throughput of the activation store vs a bare forward with `stop_at_layer`, in one run.

    python bench/activation_store.py [--n-tokens N] [--batch-size B] [--repeats R] [--threads T]
                                     [--hook NAME] [--device cpu|cuda] [--json OUT]

On the shipped tiny-gpt2 and the corpora in data/corpus, for the first N tokens (whole
128-token windows):
  bare      the same windows, tokenized beforehand and stacked into the same batches, through
            `model(tokens, stop_at_layer=S)` with the store's S (for blocks.L.hook_resid_pre S = L:
            the stream entering layer L is what that forward returns);
  bare+1    the same with S + 1, the stop sae-lens uses for that hook (for reference);
  harvest   `ActivationStore(...).harvest(fresh_dir, N)`: reading and tokenizing the text,
            run_with_cache, the per-shard shuffle, safetensors shards (sha256, fsync), manifest;
  memory    the in-memory store: `next_batch()` until N tokens went through the model (its
            mixing buffer fills before it serves; the time is scaled to N tokens forwarded).
All under torch.inference_mode(), in interleaved rounds (bare, harvest, memory, bare, ...);
the ratios are store tokens/s over bare tokens/s of the medians (the goal: harvest >= 0.9), by
wall time and by this process's CPU time (all its threads; on a machine shared with other jobs
the CPU time is what the store costs, the wall time also what the neighbours cost); "main cpu" is the
calling thread's CPU time alone (the forwards' thread; tokenizing and writing run in threads of their own).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
import torch  # noqa: E402

from interp_gpt import GPT  # noqa: E402
from interp_gpt.store import ActivationStore  # noqa: E402

GOAL = 0.9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-tokens", type=int, default=1 << 17)
    p.add_argument("--batch-size", type=int, default=32, help="windows per forward pass")
    p.add_argument("--shard-tokens", type=int, default=1 << 15)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hook", default="blocks.1.hook_resid_pre")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="also write the raw times here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = GPT.from_pretrained("tiny-gpt2").to(args.device)
    data = [ROOT / "data" / "corpus" / "tinyshakespeare_input.txt", ROOT / "data" / "corpus" / "warpeace_input.txt"]

    def store(**kw: object) -> ActivationStore:
        return ActivationStore(model, args.hook, data, context_size=128, batch_size=args.batch_size, **kw)  # type: ignore[arg-type]

    probe = store(shuffle=False)
    n_windows = args.n_tokens // 128
    windows = list(itertools.islice(probe.windows, n_windows))
    batches = [
        torch.stack(windows[i : i + args.batch_size]).to(args.device) for i in range(0, n_windows, args.batch_size)
    ]
    n = n_windows * 128
    stop = probe.stop_at_layer
    scratch = Path(tempfile.mkdtemp(prefix="bench-store-"))
    rounds = iter(range(10**6))

    def bare() -> None:
        with torch.inference_mode():
            for b in batches:
                model(b, stop_at_layer=stop)

    def bare_plus_one() -> None:  # sae-lens' stop for the same hook: layer + 1 (one block more for resid_pre)
        with torch.inference_mode():
            for b in batches:
                model(b, stop_at_layer=stop + 1)

    def harvest() -> None:
        out = scratch / f"h{next(rounds)}"
        store(device="cpu").harvest(out, n, args.shard_tokens, progress=False)
        shutil.rmtree(out)

    forwarded: list[int] = []

    def memory() -> None:  # the buffer fills before it serves: count the tokens that went through the model
        s = store(out_batch_size=4096)
        while s.n_tokens_seen < n:
            s.next_batch()
        forwarded.append(s.n_tokens_seen)

    cpu: dict[str, list[float]] = {"bare": [], "bare+1": [], "harvest": [], "memory": []}
    main_cpu: dict[str, list[float]] = {k: [] for k in cpu}  # the calling thread's CPU seconds only

    def cpu_timed(name: str, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            t0, m0 = time.process_time(), time.thread_time()  # CPU seconds: all threads; this thread
            fn()
            cpu[name].append(time.process_time() - t0)
            main_cpu[name].append(time.thread_time() - m0)

        return run

    try:
        fns = {"bare": bare, "bare+1": bare_plus_one, "harvest": harvest, "memory": memory}
        times = C.interleaved({k: cpu_timed(k, f) for k, f in fns.items()}, args.repeats, 1, args.device)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for d in (times, cpu, main_cpu):  # the in-memory store's seconds per n tokens forwarded
        d["memory"] = [t * n / f for t, f in zip(d["memory"][-args.repeats :], forwarded[1:], strict=True)]
    cpu = {k: v[-args.repeats :] for k, v in cpu.items()}  # drop the warm-up round
    main_cpu = {k: v[-args.repeats :] for k, v in main_cpu.items()}
    med = {k: C.median(v) for k, v in times.items()}
    med_cpu = {k: C.median(v) for k, v in cpu.items()}
    med_main = {k: C.median(v) for k, v in main_cpu.items()}
    load = os.getloadavg()[0]
    print(f"tiny-gpt2 {args.hook}, {n} tokens ({n_windows} windows of 128, {args.batch_size} a forward), "
          f"device {args.device}, {args.threads} thread(s), load average {load:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"stop_at_layer={stop} (bare, store), {stop + 1} (bare+1)")
    print(f"{'':8} {'median s':>9} {'min s':>8} {'tokens/s':>10} {'/ bare':>7} {'cpu s':>8} {'/ bare':>7} "
          f"{'main cpu':>9} {'/ bare':>7}")  # fmt: skip
    for k, v in times.items():
        print(
            f"{k:8} {med[k]:9.3f} {min(v):8.3f} {n / med[k]:10.0f} {med['bare'] / med[k]:7.3f} "
            f"{med_cpu[k]:8.3f} {med_cpu['bare'] / med_cpu[k]:7.3f} {med_main[k]:9.3f} {med_main['bare'] / med_main[k]:7.3f}"
        )
    ratio = med["bare"] / med["harvest"]
    print(f"goal: harvest >= {GOAL} x bare throughput (wall): {ratio:.3f} {'PASS' if ratio >= GOAL else 'MISS'}")
    if args.json:
        raw = {"args": vars(args), "n_tokens": n, "wall_s": times, "cpu_s": cpu, "main_thread_cpu_s": main_cpu}
        Path(args.json).write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
