"""The activation store's two-hook harvest (a transcoder's input and output) against a one-hook harvest.

    python bench/transcoder_store.py [--n-tokens N] [--batch-size B] [--repeats R] [--threads T]
                                     [--layer L] [--device cpu|cuda] [--json OUT]

On the shipped tiny-gpt2 and the corpora in data/corpus, for the first N tokens (whole 128-token
windows), `ActivationStore(...).harvest(fresh_dir, N)` (reading and tokenizing the text,
run_with_cache, the per-shard shuffle, safetensors shards with sha256 and fsync, the manifest) with:
  one       blocks.L.ln2.hook_normalized alone (what an SAE on the MLP's input harvests);
  two       blocks.L.ln2.hook_normalized and blocks.L.hook_mlp_out (a per-layer transcoder's pair);
  all       both hooks of every layer (what a cross-layer transcoder, or a set of PLTs, trains on).
In interleaved rounds (one, two, all, one, ...) after a warm-up round; the ratios are tokens/s over
the one-hook harvest's, from the medians of wall time and of this process's CPU time (all threads).
The goal (issue 26): two >= 0.9 x one. A two-hook harvest writes twice the bytes and, for the
output hook, runs the layer's MLP, which a one-hook harvest of ln2.hook_normalized stops before.
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--layer", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="also write the raw times here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = GPT.from_pretrained("tiny-gpt2").to(args.device)
    data = [ROOT / "data" / "corpus" / "tinyshakespeare_input.txt", ROOT / "data" / "corpus" / "warpeace_input.txt"]
    n = args.n_tokens // 128 * 128
    L = args.layer
    hooks = {
        "one": [f"blocks.{L}.ln2.hook_normalized"],
        "two": [f"blocks.{L}.ln2.hook_normalized", f"blocks.{L}.hook_mlp_out"],
        "all": [
            f"blocks.{layer}.{h}"
            for layer in range(model.cfg.n_layers)
            for h in ("ln2.hook_normalized", "hook_mlp_out")
        ],
    }
    scratch = Path(tempfile.mkdtemp(prefix="bench-tc-store-"))
    rounds = iter(range(10**6))
    cpu: dict[str, list[float]] = {k: [] for k in hooks}

    def harvest(name: str) -> Callable[[], None]:
        def run() -> None:
            out = scratch / f"h{next(rounds)}"
            t0 = time.process_time()
            store = ActivationStore(
                model, hooks[name], data, context_size=128, batch_size=args.batch_size, device="cpu"
            )
            store.harvest(out, n, args.shard_tokens, progress=False)
            cpu[name].append(time.process_time() - t0)
            shutil.rmtree(out)

        return run

    try:
        times = C.interleaved({k: harvest(k) for k in hooks}, args.repeats, 1, args.device)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    cpu = {k: v[-args.repeats :] for k, v in cpu.items()}  # drop the warm-up round
    med = {k: C.median(v) for k, v in times.items()}
    med_cpu = {k: C.median(v) for k, v in cpu.items()}
    load = os.getloadavg()[0]
    print(f"tiny-gpt2, {n} tokens ({n // 128} windows of 128, {args.batch_size} a forward), device {args.device}, "
          f"{args.threads} thread(s), load average {load:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'':5} {'hooks':>5} {'median s':>9} {'min s':>8} {'tokens/s':>10} {'/ one':>7} {'cpu s':>8} {'/ one':>7}")
    for k, v in times.items():
        print(
            f"{k:5} {len(hooks[k]):5} {med[k]:9.3f} {min(v):8.3f} {n / med[k]:10.0f} {med['one'] / med[k]:7.3f} "
            f"{med_cpu[k]:8.3f} {med_cpu['one'] / med_cpu[k]:7.3f}"
        )
    ratio = med["one"] / med["two"]
    print(
        f"goal: two-hook harvest >= {GOAL} x one-hook tokens/s (wall): {ratio:.3f} {'PASS' if ratio >= GOAL else 'MISS'}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "n_tokens": n, "wall_s": times, "cpu_s": cpu}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
