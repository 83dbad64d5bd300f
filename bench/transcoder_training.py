"""Transcoder training throughput beside SAE training on the same activations, in one run.

    python bench/transcoder_training.py [--n-tokens N] [--batch-tokens B] [--repeats R] [--threads T]

No other library trains transcoders (sae-lens loads them but cannot train them, its issue #182;
circuit-tracer only loads them), so the reference is our own SAE trainer on the same rows.
On the shipped tiny-gpt2, the first N tokens of the training text (`split_corpus`'s train part of
data/corpus, 128-token windows) are run through the model once, keeping both layers'
`ln2.hook_normalized` (the MLP's input) and `hook_mlp_out` (its output) in memory; then, in
interleaved rounds, each trainer takes N / B steps of B rows (d_sae 1024, Adam, lr 2e-3):
  sae       SAETrainer, TopK (k 32) on layer 1's MLP input: the SAE an MLP-input study would train;
  plt       TranscoderTrainer, one TopK (k 32) transcoder for layer 1: input -> output;
  plt-skip  the same with a skip connection (x @ W_skip.T);
  jumprelu  one JumpReLU skip transcoder for layer 1 (the shipped set's architecture);
  set       a JumpReLU skip transcoder for each of the 2 layers, trained together (one step each);
  clt       a JumpReLU cross-layer transcoder over the 2 layers (layer 0's features write into both).
The ratios are each trainer's rows/s over the SAE's (for `set` and `clt`, a row is one token's
input and output at every layer), from the medians of wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
import torch  # noqa: E402

from interp_gpt import GPT  # noqa: E402
from interp_gpt.sae import SAE, CLTConfig, CrossLayerTranscoder, SAEConfig, Transcoder, TranscoderConfig  # noqa: E402
from interp_gpt.sae.training import (  # noqa: E402
    SAETrainer,
    SAETrainingConfig,
    TranscoderTrainer,
    TranscoderTrainingConfig,
    split_corpus,
    token_windows,
)

D_SAE, K, LR = 1024, 32, 2e-3
IN, OUT = "ln2.hook_normalized", "hook_mlp_out"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-tokens", type=int, default=1 << 17)
    p.add_argument("--batch-tokens", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the raw times here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = GPT.from_pretrained("tiny-gpt2")
    n_windows = args.n_tokens // 128
    tokens = token_windows(model, split_corpus(ROOT / "data" / "corpus")[0], 128, max_windows=n_windows)
    hooks = [f"blocks.{layer}.{h}" for layer in (0, 1) for h in (IN, OUT)]
    acts: dict[str, list[torch.Tensor]] = {h: [] for h in hooks}
    with torch.inference_mode():
        for i in range(0, len(tokens), 32):
            _, cache = model.run_with_cache(tokens[i : i + 32], names_filter=hooks)
            for h in hooks:
                acts[h].append(cache[h].reshape(-1, model.cfg.d_model))
    perm = torch.randperm(len(tokens) * 128, generator=torch.Generator().manual_seed(0))
    rows = {h: torch.cat(v)[perm] for h, v in acts.items()}
    n, b = rows[hooks[0]].shape[0], args.batch_tokens
    n_steps = n // b

    def dict_batches() -> list[dict[str, torch.Tensor]]:
        return [{h: rows[h][i * b : (i + 1) * b] for h in hooks} for i in range(n_steps)]

    def pairs(layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, y = rows[f"blocks.{layer}.{IN}"], rows[f"blocks.{layer}.{OUT}"]
        return [(x[i * b : (i + 1) * b], y[i * b : (i + 1) * b]) for i in range(n_steps)]

    def tc(layer: int, arch: str, skip: bool) -> Transcoder:
        meta = {"hook_name": f"blocks.{layer}.{IN}", "hook_name_out": f"blocks.{layer}.{OUT}"}
        k = K if arch == "topk" else None
        cfg = TranscoderConfig(d_in=128, d_sae=D_SAE, d_out=128, architecture=arch, k=k, skip=skip, metadata=meta)
        return Transcoder(cfg)

    jump = {"l0_coefficient": 0.05, "jumprelu_bandwidth": 0.1, "jumprelu_init_threshold": 0.1}

    def trainer(name: str) -> Callable[[], None]:
        def run() -> None:
            if name == "sae":
                sae = SAE(SAEConfig(d_in=128, d_sae=D_SAE, architecture="topk", k=K, metadata={"hook_name": hooks[2]}))
                x = rows[hooks[2]]
                SAETrainer(sae, SAETrainingConfig(lr=LR)).train(
                    [x[i * b : (i + 1) * b] for i in range(n_steps)], n_steps, progress=False
                )
                return
            if name == "clt":
                c = CLTConfig(n_layers=2, d_in=128, d_sae=D_SAE, d_out=128, architecture="jumprelu",
                              metadata={"hook_name": IN, "hook_name_out": OUT})  # fmt: skip
                TranscoderTrainer(CrossLayerTranscoder(c), TranscoderTrainingConfig(lr=LR, **jump)).train(
                    dict_batches(), n_steps, progress=False
                )
                return
            if name == "set":
                tcs = [tc(0, "jumprelu", True), tc(1, "jumprelu", True)]
                TranscoderTrainer(tcs, TranscoderTrainingConfig(lr=LR, **jump)).train(
                    dict_batches(), n_steps, progress=False
                )
                return
            arch, skip = {"plt": ("topk", False), "plt-skip": ("topk", True), "jumprelu": ("jumprelu", True)}[name]
            kw = jump if arch == "jumprelu" else {}
            TranscoderTrainer(tc(1, arch, skip), TranscoderTrainingConfig(lr=LR, **kw)).train(
                pairs(1), n_steps, progress=False
            )

        return run

    names = ["sae", "plt", "plt-skip", "jumprelu", "set", "clt"]
    times = C.interleaved({k: trainer(k) for k in names}, args.repeats, 1, "cpu")
    med = {k: C.median(v) for k, v in times.items()}
    load = os.getloadavg()[0]
    print(f"tiny-gpt2, {n} rows ({n_steps} steps of {b}), d_sae {D_SAE}, {args.threads} thread(s), "
          f"load average {load:.1f} on {os.cpu_count()} CPUs; no other library trains transcoders")  # fmt: skip
    print(f"{'':9} {'median s':>9} {'min s':>8} {'rows/s':>9} {'/ sae':>7}")
    for k in names:
        print(f"{k:9} {med[k]:9.3f} {min(times[k]):8.3f} {n / med[k]:9.0f} {med['sae'] / med[k]:7.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": n, "wall_s": times}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
