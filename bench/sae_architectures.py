"""SAE training throughput per architecture: interp_gpt's SAETrainer vs sae-lens' SAETrainer, in one run.

    PYTHONPATH=. python bench/sae_architectures.py [--d-in 768] [--d-sae 6144] [--batch 4096] [--steps 20]
        [--repeats 3] [--threads 2] [--arch topk,batchtopk,...] [--json out.json]

Needs sae-lens 6 (its venv: transformer-lens 3.9). The model's forward is the same for every
architecture and is measured by bench/sae_training.py; here both trainers step on the SAME in-memory
batches of planted sparse activations (`x = f @ D`, `f` with ~k of `d_sae` directions active per row),
so the ratio is the training step's alone:
  ours      `SAETrainer(sae, SAETrainingConfig(...)).train(iter(batches), steps, progress=False)`;
  sae-lens  `SAETrainer(SAETrainerConfig(...), <its *TrainingSAE>, data_provider=iter(batches)).fit()`
            (wandb off, no checkpoints: its Adam, clip to 1.0, schedules and sparsity counters).
Both from the same start, with the same shapes and hyper-parameters (lr 2e-4, k 32 where the
architecture has k, sae-lens' coefficient defaults):
  --start fresh    each library's own initialisation: the first steps of a run, where a ReLU SAE fires
                   about half its features (dense: the matmul floor binds both libraries alike);
  --start trained  (default) the same weights loaded into both: the planted dictionary as decoder, its
                   transpose as encoder, a negative encoder bias (threshold 0.6): a trained SAE's
                   sparsity (~k of d_sae features per row), the regime where a run spends most steps. Each side is timed end to end in interleaved rounds; the ratio is ours /
sae-lens' tokens/s of the medians (issue 37's goal: >= 1.5 for every architecture).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")  # sae-lens' progress bar, not asked for here
HOOK = "blocks.0.hook_resid_pre"
LR = 2e-4


def _ours_kwargs(arch: str, k: int, d_sae: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(SAEConfig fields, SAETrainingConfig fields) for `arch`, as sae-lens' defaults set them."""
    sae: dict[str, Any] = {}
    if arch in ("topk", "abstopk", "batchtopk", "matryoshka_batchtopk"):
        sae["k"] = k
    if arch == "matryoshka_batchtopk":
        sae["matryoshka_widths"] = [d_sae // 8, d_sae // 2, d_sae]
    if arch == "matching_pursuit":
        sae["max_iterations"] = k
    return sae, {"aux_coefficient": 1.0}  # sae-lens' aux_loss_coefficient default


def _saelens_kwargs(arch: str, k: int, d_sae: int) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if arch in ("topk", "abstopk", "batchtopk", "matryoshka_batchtopk"):
        kw["k"] = k
    if arch == "matryoshka_batchtopk":
        kw["matryoshka_widths"] = [d_sae // 8, d_sae // 2, d_sae]
    if arch == "matching_pursuit":
        kw["max_iterations"] = k
    return kw


def dictionary(d_in: int, d_sae: int, seed: int = 0) -> Any:
    """The planted unit directions `[d_sae, d_in]`."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(d_sae, d_in, generator=g), dim=-1)


def trained_state(arch: str, d_in: int, d_sae: int) -> dict[str, Any]:
    """A trained-like start, by sae-lens' tensor names (ours are the same): decoder = the dictionary."""
    import torch

    w = dictionary(d_in, d_sae)
    state = {"W_dec": w.clone(), "W_enc": w.T.contiguous(), "b_enc": torch.full((d_sae,), -0.6),
             "b_dec": torch.zeros(d_in), "threshold": torch.full((d_sae,), 0.6),
             "b_gate": torch.full((d_sae,), -0.6), "b_mag": torch.zeros(d_sae), "r_mag": torch.zeros(d_sae)}  # fmt: skip
    if arch in ("jumprelu",):
        state["b_enc"] = torch.zeros(d_sae)
    return state


def load_into(module: Any, state: dict[str, Any]) -> None:
    """Copy the tensors `module` has by name (its own dtype and device)."""
    import torch

    with torch.no_grad():
        for name, param in module.named_parameters():
            if name in state:
                param.copy_(state[name])


def batches(d_in: int, d_sae: int, k: int, batch: int, n: int, seed: int = 0) -> list[Any]:
    """`n` batches `[batch, d_in]` of planted sparse activations (k of d_sae unit directions per row)."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    dictionary_ = dictionary(d_in, d_sae, seed)
    out = []
    for _ in range(n):
        idx = torch.randint(0, d_sae, (batch, k), generator=g)
        mags = torch.rand(batch, k, generator=g) * 2
        out.append(torch.nn.functional.embedding_bag(idx, dictionary_, per_sample_weights=mags, mode="sum"))
    return out


def ours(arch: str, data: list[Any], args: argparse.Namespace) -> float:
    from interp_gpt.sae import SAE, SAEConfig
    from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

    sae_kw, train_kw = _ours_kwargs(arch, args.k, args.d_sae)
    start = time.perf_counter()
    sae = SAE(SAEConfig(d_in=args.d_in, d_sae=args.d_sae, architecture=arch, metadata={"hook_name": HOOK}, **sae_kw))
    if args.start == "trained":
        load_into(sae, trained_state(arch, args.d_in, args.d_sae))
    trainer = SAETrainer(sae, SAETrainingConfig(lr=LR, log_every=10**9, init_weights=args.start == "fresh", **train_kw))
    trainer.train(iter(data), len(data), progress=False)
    return time.perf_counter() - start


def saelens(arch: str, data: list[Any], args: argparse.Namespace) -> float:
    from sae_lens.config import SAETrainerConfig
    from sae_lens.registry import get_sae_training_class
    from sae_lens.training.sae_trainer import SAETrainer

    cls, cfg_cls = get_sae_training_class(arch)
    start = time.perf_counter()
    sae = cls(cfg_cls(d_in=args.d_in, d_sae=args.d_sae, **_saelens_kwargs(arch, args.k, args.d_sae)))
    if args.start == "trained":
        load_into(sae, trained_state(arch, args.d_in, args.d_sae))
    n = len(data) * args.batch
    cfg = SAETrainerConfig(total_training_samples=n, train_batch_size_samples=args.batch, lr=LR, lr_end=LR,
                           dead_feature_window=200, feature_sampling_window=400)  # fmt: skip
    SAETrainer(cfg, sae, data_provider=iter(data)).fit()
    return time.perf_counter() - start


ARCHS = ("standard", "topk", "abstopk", "batchtopk", "matryoshka_batchtopk", "gated", "jumprelu", "matching_pursuit")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-in", type=int, default=768)
    p.add_argument("--d-sae", type=int, default=6144)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--start", choices=("trained", "fresh"), default="trained", help="see the module docstring")
    p.add_argument("--arch", default=",".join(ARCHS), help="comma-separated architectures (default: all)")
    p.add_argument("--json", help="also write the raw times here")
    args = p.parse_args(argv)

    from importlib.metadata import version

    import torch

    from interp_gpt.sae.saes.architectures import REGISTRY

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    data = batches(args.d_in, args.d_sae, args.k, args.batch, args.steps)
    print(f"start {args.start}; d_in {args.d_in}, d_sae {args.d_sae}, k {args.k}, {args.steps} steps of {args.batch} rows, "
          f"{args.threads} thread(s); sae-lens {version('sae-lens')}, torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    results: dict[str, Any] = {}
    for arch in args.arch.split(","):
        if arch not in REGISTRY or not REGISTRY[arch].trainable:
            print(f"{arch:22s} not trained here yet")
            continue
        ours(arch, data[:2], args), saelens(arch, data[:2], args)  # warm-up: imports, first allocations
        times: dict[str, list[float]] = {"ours": [], "sae-lens": []}
        for _ in range(args.repeats):
            times["ours"].append(ours(arch, data, args))
            times["sae-lens"].append(saelens(arch, data, args))
        med = {k: statistics.median(v) for k, v in times.items()}
        tokens = args.steps * args.batch
        ratio = med["sae-lens"] / med["ours"]
        results[arch] = {"times": times, "tokens": tokens, "ratio": ratio}
        print(f"{arch:22s} tokens/s ours {tokens / med['ours']:9.0f}  sae-lens {tokens / med['sae-lens']:9.0f}  "
              f"ratio {ratio:5.2f} ({'PASS' if ratio >= 1.5 else 'MISS'}: goal >= 1.5)", flush=True)  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
