"""Training sparse autoencoders: `SAETrainer`, the evaluation metrics, and the command line.

    python -m interp_gpt.sae.training --model tiny-gpt2 --hook blocks.1.hook_resid_pre \\
        --architecture topk --d-sae 1024 --k 32 --n-tokens 4000000 --out saes/resid1

The `train-sae` command (this module holds its options, `interp-gpt train-sae` and
`python -m interp_gpt.sae.training` run it): split the corpus, train, save the SAE and metrics.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .config import SAEConfig, SAEMetadata
from .core import SAE
from .data import activation_batches, split_corpus, token_windows
from .trainer import SAETrainer, SAETrainingConfig

__all__ = ["add_arguments", "run", "run_command", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The train-sae options (this module's command and `interp-gpt train-sae`)."""
    p.add_argument("--model", default="tiny-gpt2", help="model name, hub id, folder or weights file")
    p.add_argument("--hook", default="blocks.1.hook_resid_pre", help="the hook to train on")
    p.add_argument("--data", default="data/corpus", help="folder of .txt files (split by --val-frac)")
    p.add_argument("--val-frac", type=float, default=0.1, help="tail of each file kept for validation")
    p.add_argument("--architecture", choices=("topk", "standard"), default="topk")
    p.add_argument("--d-sae", type=int, default=1024)
    p.add_argument("--k", type=int, default=32, help="active features per token (topk)")
    p.add_argument("--l1-coefficient", type=float, default=1.0, help="(standard)")
    p.add_argument("--lr", type=float, default=4e-4)
    p.add_argument("--lr-warm-up-steps", type=int, default=0)
    p.add_argument("--lr-decay-steps", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=4096, help="rows (tokens) per step")
    p.add_argument("--context-size", type=int, default=128)
    p.add_argument("--n-tokens", type=int, default=4_000_000, help="training tokens (steps x batch size)")
    p.add_argument("--val-windows", type=int, default=0, help="validation windows for the metrics (0: all)")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", required=True, help="folder for cfg.json, sae_weights.safetensors, metrics.json")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train and save one SAE from parsed arguments; returns the metrics written to metrics.json."""
    from ..files import write_atomic
    from ..loading import from_pretrained

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = from_pretrained(args.model)
    model.eval()
    train_texts, val_texts = split_corpus(args.data, args.val_frac)
    val_tokens = token_windows(model, val_texts, args.context_size, args.val_windows or None)
    d_in = int(model.cfg.d_model) if "resid" in args.hook else None
    batches = activation_batches(model, args.hook, train_texts, args.batch_size, args.context_size, args.seed)
    first = next(batches)
    d_in = d_in or int(first.shape[1])
    metadata = SAEMetadata(
        hook_name=args.hook,
        model_name=model.cfg.model_name,
        context_size=args.context_size,
        prepend_bos=True,
        dataset_path=str(args.data),
    )
    sae = SAE(
        SAEConfig(
            d_in=d_in,
            d_sae=args.d_sae,
            architecture=args.architecture,
            k=args.k if args.architecture == "topk" else None,
            metadata=metadata,
        )
    )
    cfg = SAETrainingConfig(
        lr=args.lr,
        lr_warm_up_steps=args.lr_warm_up_steps,
        lr_decay_steps=args.lr_decay_steps,
        l1_coefficient=args.l1_coefficient,
        log_every=args.log_every,
        seed=args.seed,
    )
    trainer = SAETrainer(sae, cfg, model=model, eval_tokens=val_tokens)
    n_steps = max(1, args.n_tokens // args.batch_size)

    def all_batches() -> Iterator[Tensor]:
        yield first
        yield from batches

    start = time.perf_counter()
    log = trainer.train(all_batches(), n_steps, progress=not args.no_progress)
    seconds = time.perf_counter() - start
    sae.save_model(args.out)
    final = {k.removeprefix("val_"): v for k, v in log[-1].items() if k.startswith("val_")}
    command = "python -m interp_gpt.sae.training " + " ".join(shlex.quote(a) for a in (argv or []))
    metrics = {
        "validation": final,
        "validation_text": f"the last {args.val_frac:.0%} (cut at a newline) of each .txt file in {args.data}",
        "train": {k: log[-1][k] for k in ("l0", "mse", "explained_variance", "dead_fraction")},
        "steps": trainer.n_steps,
        "train_tokens": trainer.n_tokens,
        "train_seconds": round(seconds, 1),
        "command": command,
    }
    write_atomic(Path(args.out) / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(final, indent=2))
    return metrics


def run_command(args: argparse.Namespace) -> int:
    """`interp-gpt train-sae ...` (the same options; the command recorded is this module's equivalent)."""
    argv = sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1] == "train-sae" else None
    run(args, argv)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m interp_gpt.sae.training ...`; returns the exit status (2: bad input)."""
    parser = argparse.ArgumentParser(prog="python -m interp_gpt.sae.training", description=__doc__.split("\n")[0])
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    try:
        run(args, argv)
    except (OSError, ValueError, TypeError, KeyError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0
