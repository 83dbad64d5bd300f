"""N SAEs from one forward (`train_saes`) vs N runs of one SAE each, in one run, on tiny-gpt2.

    PYTHONPATH=. python bench/sae_multi.py [--mode hooks|widths] [--n N] [--windows W] [--batch-tokens B]
                                           [--repeats R] [--threads T] [--device cpu|cuda] [--json OUT]

Both train the same N TopK SAEs (k 32, Adam, lr 2e-3) on the first W 128-token windows of the training text
(`split_corpus`'s train part of data/corpus), B rows per step, one pass (keep_in_memory=False: the model runs
for every batch of windows):
  --mode hooks   N hooks of d_model (blocks.L.hook_attn_out / hook_mlp_out / hook_resid_post, L = 0, 1; at most
                 6), d_sae 1024 each;
  --mode widths  N widths 256 x 2^i on blocks.1.hook_resid_pre (the default hook).
  multi     `train_saes(model, saes, [text], n_steps, batch_size=B)`: one activation store, one forward per
            batch of windows, each SAE stepped on its hook's rows;
  separate  for each SAE, `SAETrainer.train(activation_batches(model, hook, [text], B), n_steps)`: its own
            store (tokenizing, forwards, mixing) and its trainer; the N runs one after the other.
Each side is timed end to end (the stores and trainers built inside, the model loaded before), in interleaved
rounds; the ratio is multi's median wall time over separate's (the goal: <= 0.6). A check after the rounds:
every SAE of the last multi round equals its separate twin bit for bit (the hooks mode's hooks and the widths
mode's one hook are served the same rows either way).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
import torch  # noqa: E402

from interp_gpt import GPT  # noqa: E402
from interp_gpt.sae import SAE, SAEConfig  # noqa: E402
from interp_gpt.sae.training import (  # noqa: E402
    SAETrainer,
    SAETrainingConfig,
    activation_batches,
    split_corpus,
    token_windows,
    train_saes,
)

K, LR, CONTEXT = 32, 2e-3, 128
HOOKS = [f"blocks.{layer}.{h}" for h in ("hook_attn_out", "hook_mlp_out", "hook_resid_post") for layer in (0, 1)]


def text_of(model: GPT, texts: list[str], n_windows: int) -> tuple[str, int]:
    """The shortest prefix of the training text (whole lines, grown by halves) with at least n_windows windows,
    and its number of windows."""
    text, cut = texts[0], 4096
    while True:
        cut = min(len(text), cut)
        end = text.find("\n", cut)
        prefix = text if end < 0 else text[: end + 1]
        n = int(token_windows(model, [prefix], CONTEXT).shape[0])
        if n >= n_windows or len(prefix) == len(text):
            return prefix, n
        cut = int(cut * 1.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("hooks", "widths"), default="hooks")
    p.add_argument("--n", type=int, default=4, help="SAEs (default 4; hooks mode: at most 6)")
    p.add_argument("--windows", type=int, default=512, help="128-token windows of training text (default 512)")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", help="also write the raw times here")
    args = p.parse_args(argv)
    if args.mode == "hooks" and not 1 <= args.n <= len(HOOKS):
        p.error(f"--n={args.n}: the hooks mode has 1..{len(HOOKS)} hooks")
    torch.set_num_threads(args.threads)
    model = GPT.from_pretrained("tiny-gpt2").to(args.device).eval()
    text, n_windows = text_of(model, split_corpus(ROOT / "data" / "corpus")[0], args.windows)
    b = args.batch_tokens
    n_steps = n_windows * CONTEXT // b
    if n_steps < 1:
        p.error(f"--windows={args.windows}: {n_windows * CONTEXT} tokens, fewer than one batch of {b}")
    if args.mode == "hooks":
        shapes = [(h, 1024) for h in HOOKS[: args.n]]
    else:
        shapes = [("blocks.1.hook_resid_pre", 256 * 2**i) for i in range(args.n)]

    def saes() -> list[SAE]:
        return [
            SAE(SAEConfig(d_in=128, d_sae=w, architecture="topk", k=K, metadata={"hook_name": h}, device=args.device))
            for h, w in shapes
        ]

    cfg = SAETrainingConfig(lr=LR, log_every=10**9)
    last: dict[str, Any] = {}

    def multi() -> None:
        last["multi"] = train_saes(model, saes(), [text], n_steps, cfg, batch_size=b, context_size=CONTEXT,
                                   device=args.device, progress=False)  # fmt: skip

    def separate() -> None:
        last["separate"] = []
        for sae in saes():
            trainer = SAETrainer(sae, cfg)
            hook = str(sae.cfg.hook_name)
            trainer.train(activation_batches(model, hook, [text], b, CONTEXT, device=args.device), n_steps, False)
            last["separate"].append(trainer.sae)

    times = C.interleaved({"multi": multi, "separate": separate}, args.repeats, 1, args.device)
    same = all(
        all(torch.equal(x, y) for x, y in zip(m.state_dict().values(), s.state_dict().values(), strict=True))
        for m, s in zip(last["multi"].saes.values(), last["separate"], strict=True)
    )
    med = {k: C.median(v) for k, v in times.items()}
    ratio = med["multi"] / med["separate"]
    load = os.getloadavg()[0]
    what = ", ".join(f"{h} x {w}" for h, w in shapes)
    print(f"tiny-gpt2, {args.n} TopK SAEs ({what}), k {K}; {n_steps} steps of {b} tokens ({n_windows} windows), "
          f"{args.threads} thread(s), {args.device}, torch {torch.__version__}; load average {load:.1f} on "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    for k in ("multi", "separate"):
        print(
            f"{k:9} median {med[k]:8.3f} s   min {min(times[k]):8.3f} s   {n_steps * b * args.n / med[k]:9.0f} SAE-rows/s"
        )
    print(f"each SAE the same in both: {same}")
    print(f"ratio multi / separate {ratio:.2f} ({'PASS' if ratio <= 0.6 else 'MISS'}: goal <= 0.6)")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "steps": n_steps,
                    "wall_s": times,
                    "ratio": ratio,
                    "same": same,
                    "load_average": load,
                },
                indent=1,
            )  # fmt: skip
        )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
