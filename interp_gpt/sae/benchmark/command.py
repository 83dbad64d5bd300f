"""The `sae-bench` command (`interp-gpt sae-bench`, `python -m interp_gpt.sae.benchmark`): every trainable SAE
architecture on synthetic ground truth and on a real hook, written up in OUT.

    interp-gpt sae-bench --out bench-out                       # every architecture, 3 seeds (about 2 min on 2 cores)
    interp-gpt sae-bench --out bench-out --architecture topk jumprelu --seeds 5 --no-real
    interp-gpt sae-bench --out bench-out --set standard.l1_coefficient=4 --n-tokens 2000000 --d-sae 1024 --k 32
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ...checks import check_int_in_range
from ..common import command_main, run_subcommand
from ..saes.architectures import REGISTRY
from .real_hook import RealHookBench
from .recipes import parse_override, recipe, trainable_architectures
from .run import SAEBenchConfig, benchmark_architectures
from .synthetic import SyntheticBench

__all__ = ["HELP", "DESCRIPTION", "EXAMPLES", "add_arguments", "run", "run_command", "main"]

HELP = "compare SAE architectures: ground-truth scores on synthetic data and core metrics on a real hook"
DESCRIPTION = (
    "Train every trainable SAE architecture (or those of --architecture) on the same data with the same budget: on "
    "a synthetic model with known features (MCC, uniqueness, F1, shrinkage, L0, dead latents; absorption on a "
    "planted hierarchy), over --seeds seeds, and on a real hook of a model (explained variance, CE loss recovered, "
    "KL, L0, dead and dense latents on held-out text). Writes OUT/sae_bench.md (the table), OUT/sae_bench.json "
    "(SAEBench's core layout plus the synthetic scores) and OUT/sae_bench.html (the plot, offline). Per-architecture "
    "settings: interp_gpt.sae.benchmark.recipes.ARCHITECTURE_DEFAULTS (change one with --set)."
)
EXAMPLES = [
    "--out bench-out",
    "--out bench-out --architecture topk matching_pursuit --seeds 5 --no-real",
    "--out bench-out --set standard.l1_coefficient=4 --n-tokens 2000000 --d-sae 1024 --k 32",
]

# option (argparse dest) -> the config field it sets
_SYNTHETIC = {"num_features": "num_features", "hidden_dim": "hidden_dim", "synthetic_d_sae": "d_sae",
              "synthetic_steps": "steps", "synthetic_batch_size": "batch_size", "synthetic_lr": "lr",
              "target_l0": "target_l0", "eval_samples": "eval_samples"}  # fmt: skip
_REAL = {"model": "model", "hook": "hook", "data": "data", "d_sae": "d_sae", "k": "target_l0",
         "n_tokens": "n_tokens", "batch_size": "batch_size", "lr": "lr", "context_size": "context_size",
         "val_windows": "val_windows"}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The sae-bench options."""
    s, r = SyntheticBench(), RealHookBench()
    p.add_argument("--out", required=True, help="folder for sae_bench.md, sae_bench.json and sae_bench.html")
    every = " ".join(trainable_architectures())
    p.add_argument("--architecture", action="extend", nargs="+", metavar="NAME",
                   help=f"architectures to compare (default: every trainable one: {every})")  # fmt: skip
    p.add_argument("--seeds", type=int, default=3, help="synthetic runs per architecture, seeds 0..N-1 (the spread)")
    change = "change a setting of the table, e.g. standard.l1_coefficient=4 (repeatable; default: none)"
    p.add_argument("--set", action="append", default=[], metavar="ARCH.FIELD=VALUE", dest="overrides", help=change)
    p.add_argument("--no-synthetic", action="store_true", help="skip the synthetic ground truth")
    p.add_argument("--no-real", action="store_true", help="skip the real hook")
    g = p.add_argument_group("synthetic ground truth")
    g.add_argument("--num-features", type=int, default=s.num_features, help="true features")
    g.add_argument("--hidden-dim", type=int, default=s.hidden_dim, help="their width (the SAEs' d_in)")
    g.add_argument("--synthetic-d-sae", type=int, help="latents (default: --num-features)")
    g.add_argument("--synthetic-steps", type=int, default=s.steps, help="training steps, on each model")
    g.add_argument("--synthetic-batch-size", type=int, default=s.batch_size, help="samples per step")
    g.add_argument("--synthetic-lr", type=float, default=s.lr, help="Adam's learning rate")
    g.add_argument("--target-l0", type=int, help="target L0 (default: the data's true L0, rounded)")
    g.add_argument("--eval-samples", type=int, default=s.eval_samples, help="fresh samples the scores read")
    g = p.add_argument_group("real hook")
    g.add_argument("--model", default=r.model, help="model name, hub id, folder or weights file")
    g.add_argument("--hook", default=r.hook, help="a hook of one vector per token")
    g.add_argument("--data", action="extend", nargs="+", metavar="PATH",
                   help=f"text files or folders, the last 10%% of each held out (default: {r.data[0]})")  # fmt: skip
    g.add_argument("--d-sae", type=int, default=r.d_sae, help="latents")
    g.add_argument(
        "--k", type=int, default=r.target_l0, help="target L0 (the topk family's k, matching pursuit's steps)"
    )
    g.add_argument("--n-tokens", type=int, default=r.n_tokens, help="training tokens")
    g.add_argument("--batch-size", type=int, default=r.batch_size, help="tokens per step")
    g.add_argument("--lr", type=float, default=r.lr, help="Adam's learning rate")
    g.add_argument("--context-size", type=int, default=r.context_size, help="tokens per window (BOS first)")
    g.add_argument("--val-windows", type=int, default=r.val_windows, help="held-out windows for the metrics")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads, 0 for torch's own choice (the default shapes are small: on a busy machine a "
                   "second thread's waits can cost more than it gives)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _part(cls: Any, options: dict[str, str], args: argparse.Namespace) -> Any:
    """`cls` from the options that map onto its fields; an error names the option, not the field."""
    values = {field: getattr(args, option) for option, field in options.items() if getattr(args, option) is not None}
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        msg = str(e).removeprefix(f"{cls.__name__}: ")
        for option, field in options.items():
            if re.match(rf"{field}\b", msg) and field in values:
                msg = "--" + option.replace("_", "-") + msg[len(field) :]
                break
        raise type(e)(msg) from None


def config_from_args(args: argparse.Namespace) -> SAEBenchConfig:
    """The benchmark's config from parsed options, every value checked (naming the option) before any work."""
    n_seeds = check_int_in_range(args.seeds, "--seeds", 1, None)
    check_int_in_range(args.threads, "--threads", 0, None)
    overrides: dict[str, dict[str, Any]] = {}
    for text in args.overrides:
        arch, name, value = parse_override(text, "--set")
        overrides.setdefault(arch, {})[name] = value
    for text in args.overrides:  # each checked alone, so that the error names the --set it comes from
        arch, name, value = parse_override(text, "--set")
        if arch in REGISTRY and arch in (args.architecture or trainable_architectures()):
            try:
                recipe(arch, {name: value})
            except ValueError as e:
                raise ValueError(f"--set {text}: {str(e).split(': ', 1)[1]}") from None
    synthetic = None if args.no_synthetic else _part(SyntheticBench, _SYNTHETIC, args)
    real = None if args.no_real else _part(RealHookBench, _REAL, args)
    if synthetic is None and real is None:
        raise ValueError("--no-synthetic and --no-real: nothing left to benchmark; drop one")
    try:
        return SAEBenchConfig(args.architecture, tuple(range(n_seeds)), synthetic, real, overrides)
    except (TypeError, ValueError) as e:
        msg = str(e).removeprefix("SAEBenchConfig: ")
        msg = re.sub(r"^architectures\b", "--architecture", msg)
        raise type(e)(re.sub(r"^overrides\b", "--set", msg)) from None


def run(args: argparse.Namespace, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark from parsed options; prints the table and where the files are. Returns the results."""
    cfg = config_from_args(args)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out={args.out!r} is a file; expected a folder (it gets sae_bench.md, .json, .html)")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        results = benchmark_architectures(cfg, out, progress=not args.no_progress)
    except (TypeError, ValueError, KeyError, OSError) as e:  # the real hook's checks name its fields: say the option
        text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        for field in ("context_size", "hook", "data"):
            text = re.sub(rf"^{field}\b", "--" + field.replace("_", "-"), text)
        raise type(e)(text) from None
    print(Path(results["files"]["table"]).read_text(encoding="utf-8"))
    print("written: " + ", ".join(results["files"].values()))
    return results


def run_command(args: argparse.Namespace) -> int:
    """`interp-gpt sae-bench ...`."""
    return run_subcommand(run, args, "sae-bench")


def main(argv: list[str] | None = None) -> int:
    """`python -m interp_gpt.sae.benchmark ...`; returns the exit status (2: bad input)."""
    return command_main("python -m interp_gpt.sae.benchmark", HELP, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
