"""`python -m interp_gpt.activation_store harvest ...`: harvest activations to shards from the shell.

    python -m interp_gpt.activation_store harvest --model tiny-gpt2 --hook blocks.1.hook_resid_pre \\
        --data data/corpus --out acts/ --n-tokens 1000000
    torchrun --standalone --nproc_per_node=2 -m interp_gpt.activation_store harvest ...   # 2 ranks

Under torchrun (WORLD_SIZE > 1) the process group is set up here (nccl on GPU, gloo on CPU);
each rank harvests its own windows into its own shards and rank 0 writes the one manifest.
Running the same command again on the same folder resumes an interrupted harvest.
The library itself lives in `interp_gpt.store`; `interp_gpt.activation_store` re-exports it with this command.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..checks import BAD_INPUT, check_text_files, error_line
from ..cli.common import add_data_argument
from .core import ActivationStore

__all__ = ["add_arguments", "run", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The harvest options (shared by this module's command and `interp-gpt harvest`)."""
    p.add_argument(
        "--model", default="tiny-gpt2", help="model name, hub id, folder or weights file (default: tiny-gpt2)"
    )
    p.add_argument("--hook", action="append", required=True, metavar="NAME", help="hook to harvest (repeatable)")
    add_data_argument(p, "the text to harvest")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the shards and manifest.json")
    p.add_argument("--n-tokens", type=int, required=True, metavar="N", help="tokens to harvest (whole windows)")
    p.add_argument("--shard-tokens", type=int, default=1 << 20, metavar="N", help="rows per shard (default: 2^20)")
    p.add_argument("--context-size", type=int, metavar="N", help="tokens per window (default: the model's n_ctx)")
    p.add_argument("--batch-size", type=int, default=8, metavar="N", help="windows per forward pass (default: 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the per-shard shuffle (default: 0)")
    p.add_argument("--no-shuffle", action="store_true", help="keep rows in data order")
    p.add_argument("--dtype", help="dtype of the stored activations (default: the model's)")
    p.add_argument("--device", help="device of the model (default: cuda:LOCAL_RANK if available, else cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Run one harvest from parsed arguments; prints the manifest's path and token count (rank 0)."""
    import torch
    import torch.distributed as dist

    from ..loading import from_pretrained

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = args.device or (f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    started = False
    if world > 1 and not dist.is_initialized():
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        started = True
    try:
        model: Any = from_pretrained(args.model).to(device)
        store = ActivationStore(
            model,
            args.hook[0] if len(args.hook) == 1 else args.hook,
            check_text_files(args.data, "--data"),
            context_size=args.context_size,
            batch_size=args.batch_size,
            shuffle=not args.no_shuffle,
            seed=args.seed,
            dtype=args.dtype,
            device="cpu",
        )
        manifest = store.harvest(args.out, args.n_tokens, args.shard_tokens, progress=not args.no_progress)
        if store.rank == 0:
            print(
                f"{Path(args.out) / 'manifest.json'}: {manifest['n_tokens']} tokens in {len(manifest['shards'])} shards"
            )
    finally:
        if started:
            dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m interp_gpt.activation_store harvest ...`; returns the exit status (2: bad input)."""
    parser = argparse.ArgumentParser(prog="python -m interp_gpt.activation_store", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_arguments(sub.add_parser("harvest", help="harvest activations to safetensors shards"))
    args = parser.parse_args(argv)
    try:
        return run(args)
    except BAD_INPUT as e:
        print(f"error: {error_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
