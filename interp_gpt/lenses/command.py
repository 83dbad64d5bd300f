"""`interp-gpt train-lens` (train a tuned lens on a corpus) and what `interp-gpt lens --tuned` reads.

    interp-gpt train-lens tiny-gpt2 --data data/corpus --steps 250 --out lens-tiny
    interp-gpt lens tiny-gpt2 "The cat sat on the mat" --tuned lens-tiny

`train-lens` loads the model processed, as every command does (fold_ln, centring), and the lens records
that. `lens --tuned` loads the model the way the lens records it: processed, or raw for a lens trained on
raw weights (tuned-lens' own lenses, trained on Hugging Face's weights, record nothing and are read raw).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..cli.common import add_data_argument, table

__all__ = [
    "HELP", "DESCRIPTION", "EXAMPLES", "RESULT_OPTIONS", "OTHER_OPTIONS", "add_arguments", "run", "tuned_lens_logits",
    "load_for_lens",
]  # fmt: skip

HELP = "train a tuned lens (tuned-lens 0.2's objective and files) on a text corpus"
DESCRIPTION = (
    "Split --data into training and validation text, train one affine translator per layer so that the final "
    "LayerNorm and unembedding of the translated residual stream match the model's output (KL, tuned-lens' "
    "SGD with Nesterov momentum, linear decay), and save tuned-lens' folder (config.json, params.pt) with "
    "metrics.json: each layer's held-out KL for the logit lens and the tuned lens. Ctrl-C saves what was "
    "trained; --resume goes on from there. Read it with interp-gpt lens MODEL PROMPT --tuned OUT."
)
EXAMPLES = [
    "--data data/corpus --steps 250 --out lens-tiny",
    "--data data/corpus --steps 250 --out lens-tiny --resume     # after Ctrl-C: goes on from there",
    "gpt2 --data my_corpus/ --steps 250 --batch-size 4 --context-size 512 --out lens-gpt2",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `train-lens` options."""
    p.add_argument(
        "model",
        nargs="?",
        default="tiny-gpt2",
        metavar="MODEL",
        help="model name, hub id, folder or file (default: tiny-gpt2)",
    )
    add_data_argument(p, "the text to train on (each file split by --val-frac)")
    p.add_argument("--val-frac", type=float, default=0.1, help="tail of each file kept for validation")
    p.add_argument("--steps", type=int, default=250, metavar="N", help="optimiser steps (default: 250, as tuned-lens)")
    p.add_argument("--batch-size", type=int, default=8, metavar="N", help="windows per step")
    p.add_argument("--context-size", type=int, default=128, metavar="N", help="tokens per window (BOS first)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD's learning rate, decayed linearly to 0")
    p.add_argument("--momentum", type=float, default=0.9, help="Nesterov momentum")
    p.add_argument("--weight-decay", type=float, default=1e-3, help="pulls each translator towards the identity")
    p.add_argument("--val-windows", type=int, default=64, metavar="N", help="validation windows for the KL (0: all)")
    p.add_argument("--seed", type=int, default=0, help="seeds the data order")
    p.add_argument("--threads", type=int, default=0, help="torch threads, 0 for torch's own choice (default: 0)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for config.json, params.pt, metrics.json")
    p.add_argument("--resume", action="store_true", help="go on from the run saved in --out (same options)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _check(args: argparse.Namespace) -> None:
    """Every option that needs no model, checked before the model loads."""
    from ..checks import check_float, check_int_in_range, check_seed

    for option, low in (("steps", 1), ("batch_size", 1), ("context_size", 2), ("val_windows", 0), ("threads", 0)):
        check_int_in_range(getattr(args, option), "--" + option.replace("_", "-"), low, None)
    check_seed(args.seed, "--seed", high=2**63 - 1 - args.steps)  # fit_tuned_lens' bound: seed + epoch < 2**63
    check_float(args.val_frac, "--val-frac", 0.0, 0.5)
    check_float(args.lr, "--lr", 0.0)
    check_float(args.momentum, "--momentum", 0.0, 1.0)
    if not 0 <= args.weight_decay < float("inf"):
        raise ValueError(f"--weight-decay={args.weight_decay!r} is out of range: expected a finite number >= 0")
    from .tuned import check_lens_folder

    check_lens_folder(args.out, "--out")


# The options that change what a run writes (the lens, its held-out KL), spelled out in metrics.json's command;
# and those that do not (where the run stops and resumes, threads: rounding only, the progress bar).
RESULT_OPTIONS = (
    "val_frac", "steps", "batch_size", "context_size", "lr", "momentum", "weight_decay", "val_windows", "seed",
)  # fmt: skip
OTHER_OPTIONS = ("model", "data", "out", "threads", "resume", "no_progress")


def _command(args: argparse.Namespace) -> str:
    """The command that repeats this run, every option that changes its results spelled out."""
    parts = ["interp-gpt", "train-lens", args.model, "--data", *args.data]
    for option in RESULT_OPTIONS:
        parts += ["--" + option.replace("_", "-"), str(getattr(args, option))]
    return " ".join(shlex.quote(str(p)) for p in [*parts, "--out", args.out])


def _split(parts: tuple[list[str], list[str]], val_frac: float) -> tuple[list[str], list[str]]:
    """`split_corpus`' (train, validation) texts, where a file's tail had no newline to cut at (its validation
    text came out empty) cut at the first space at or after the same place instead (at that character if
    there is none), so a text written on one line keeps a validation tail too."""
    train, val = list(parts[0]), list(parts[1])
    for i, text in enumerate(train):
        if not val[i] and text:
            at = int(len(text) * (1 - val_frac))
            space = text.find(" ", at)
            cut = space + 1 if 0 <= space < len(text) - 1 else at
            train[i], val[i] = text[:cut], text[cut:]
    return train, val


def _windows(model: Any, texts: list[str], args: argparse.Namespace, part: str) -> Any:
    """`lens_windows` of one part of --data, refusing one too short for a window by the options that size it."""
    from .train import lens_windows

    try:
        return lens_windows(model, texts, args.context_size)
    except ValueError as e:
        if "too short" not in str(e):
            raise
        raise ValueError(
            f"--data: the {part} is too short for one window of --context-size={args.context_size} tokens; give "
            f"more text, lower --context-size or change --val-frac={args.val_frac}"
        ) from None


def run(args: argparse.Namespace, load: Callable[[str], Any]) -> int:
    """Train, save, and print each layer's held-out KL (logit lens vs tuned lens); 130 on Ctrl-C (saved)."""
    import torch

    from ..checks import check_int_in_range, check_text_files
    from ..files import write_atomic
    from ..sae.training.data import split_corpus
    from .train import LensDiverged, fit_tuned_lens, lens_kl
    from .tuned import TunedLens

    _check(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load(args.model)
    check_int_in_range(args.context_size, "--context-size", 2, model.cfg.n_ctx, f"contexts of {args.model}")
    train, val = _split(split_corpus(check_text_files(args.data, "--data"), args.val_frac), args.val_frac)
    train_windows = _windows(model, train, args, "training part (the text before each file's validation tail)")
    val_windows = _windows(model, val, args, f"validation split (the last {args.val_frac * 100:g}% of each file)")
    val_windows = val_windows[: args.val_windows or None]
    out = Path(args.out)
    start = time.perf_counter()
    try:
        lens = fit_tuned_lens(
            model, train_windows, steps=args.steps, batch_size=args.batch_size, context_size=args.context_size, lr=args.lr,
            momentum=args.momentum, weight_decay=args.weight_decay, seed=args.seed, save_to=out, resume=args.resume,
            progress=not args.no_progress,
        )  # fmt: skip
    except KeyboardInterrupt:
        print(
            f"train-lens: interrupted; the lens so far is in {out} (run again with --resume to go on)", file=sys.stderr
        )
        return 130
    except LensDiverged as e:  # bad input (an lr too large): one line, exit 2, as every command's
        raise ValueError(f"--lr={args.lr!r}: training diverged at step {e.step} (the KL is {e.kl}); lower --lr") from e
    seconds = time.perf_counter() - start
    logit = lens_kl(TunedLens.from_model(model), val_windows, batch_size=args.batch_size)
    tuned = lens_kl(lens, val_windows, batch_size=args.batch_size)
    tokens = args.steps * args.batch_size * args.context_size
    metrics = {
        "held_out_kl": {"layers": list(range(len(lens))), "logit_lens": logit.tolist(), "tuned_lens": tuned.tolist()},
        "validation_text": (
            f"the last {args.val_frac:.0%} (cut at a newline, or at a space where the tail has none) of each text "
            f"file in {', '.join(args.data)}"
        ),
        "validation_tokens": int(val_windows.numel()),
        "steps": args.steps,
        "train_tokens": tokens,
        "train_seconds": round(seconds, 1),
        "command": _command(args),
    }
    write_atomic(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    rows = [
        [str(i), f"{a:.4f}", f"{b:.4f}"] for i, (a, b) in enumerate(zip(logit.tolist(), tuned.tolist(), strict=True))
    ]
    print(f"tuned lens of {args.model} saved in {out}; held-out KL(final || lens) in nats, per layer\n")
    print(table(["layer", "logit lens", "tuned lens"], rows, right=frozenset({0, 1, 2})))
    return 0


def load_for_lens(source: Any, path: str) -> Any:
    """`interp-gpt lens MODEL PROMPT --tuned PATH`: the model loaded with the weights the lens was trained
    on: processed (as every command loads it) when its config.json records a centred residual stream,
    without processing when it records a raw one or nothing (tuned-lens' own lenses, trained on Hugging
    Face's weights). A folder that cannot be read is left to `TunedLens.from_pretrained` to refuse by name.

    Example:
        >>> TunedLens.from_model(GPT.from_pretrained_no_processing("tiny-gpt2")).save("raw_lens")
        PosixPath('raw_lens')
        >>> load_for_lens("tiny-gpt2", "raw_lens").cfg.normalization_type     # raw: LayerNorms not folded
        'LN'
    """
    import json
    from pathlib import Path

    from ..loading import from_pretrained, from_pretrained_no_processing
    from .tuned import PROCESSING_KEY

    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        recorded = config.get(PROCESSING_KEY) if isinstance(config, dict) else None
    except (OSError, ValueError):
        return from_pretrained(source)
    centred = isinstance(recorded, dict) and recorded.get("center_writing_weights") is True
    return from_pretrained(source) if centred else from_pretrained_no_processing(source)


def tuned_lens_logits(model: Any, cache: Any, path: str) -> tuple[Any, list[str]]:
    """`interp-gpt lens --tuned PATH`: the tuned lens' logits of the cached prompt at every layer and the
    model's own output last, `[n_layers + 1, pos, d_vocab]`, with the logit lens' labels.

    Example:
        >>> TunedLens.from_model(model).save("my_lens")
        PosixPath('my_lens')
        >>> logits, labels = tuned_lens_logits(model, cache, "my_lens")
        >>> logits.shape, labels
        (torch.Size([3, 15, 2048]), ['0_pre', '1_pre', 'final_post'])
    """
    import torch

    from .tuned import TunedLens

    lens = TunedLens.from_pretrained(path, model)
    n = model.cfg.n_layers
    final = lens.unembed(cache[f"blocks.{n - 1}.hook_resid_post"][0]).detach()
    logits = torch.cat([lens.forward_all(cache)[:, 0], final[None]])
    return logits, [f"{layer}_pre" for layer in range(n)] + ["final_post"]
