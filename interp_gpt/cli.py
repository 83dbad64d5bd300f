"""The `interp-gpt` command.

    interp-gpt compare [MODEL] [--prompt TEXT] [--unprocessed] [--per-layer] [--json]

MODEL is a hub id (gpt2, gpt2-medium, ...), a local folder or weights file, or
`random-gpt2-small` (the default): a GPT-2-small-shaped checkpoint built on this
machine from a fixed seed, so the command runs offline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "random-gpt2-small"
DEFAULT_PROMPT = "When Mary and John went to the store, John gave a drink to"


def _home() -> Path:
    return Path(os.environ.get("INTERP_GPT_HOME", Path.home() / ".cache" / "interp_gpt"))


def random_gpt2_small(seed: int = 0, folder: str | os.PathLike | None = None) -> Path:
    """A GPT-2-small-shaped Hugging Face checkpoint with seeded random weights (built once).

    Weights are N(0, 0.02) as GPT-2 initialises them; LayerNorm weights and every bias
    get seeded noise too, so each weight-processing step (fold_ln, centring, value-bias
    folding) has real work to do when it is compared.
    """
    import torch

    from .config import preset
    from .loading import save_hf_checkpoint
    from .model import GPT

    folder = Path(folder) if folder else _home() / f"random-gpt2-small-seed{seed}"
    if (folder / "model.safetensors").exists() and (folder / "config.json").exists():
        return folder
    with torch.device("meta"):
        model = GPT(preset("gpt2"))
    model = model.to_empty(device="cpu")
    model.init_weights(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.split(".")[-1].startswith("W_"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    # Write beside the final folder and rename, so an interrupted build is never picked up.
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    save_hf_checkpoint(model, tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def _resolve_model(name: str) -> Any:
    return random_gpt2_small() if name == DEFAULT_MODEL else name


def _cmd_compare(args: argparse.Namespace) -> int:
    import torch

    from .compare import compare, to_transformer_lens, to_transformers
    from .loading import from_pretrained, from_pretrained_no_processing

    source = _resolve_model(args.model)
    processed = not args.unprocessed
    ours = (from_pretrained if processed else from_pretrained_no_processing)(source)
    if ours.tokenizer is not None:
        tokens = ours.to_tokens(args.prompt)
        shown = f"prompt {args.prompt!r} ({tokens.shape[1]} tokens)"
    else:
        tokens = torch.randint(0, ours.cfg.d_vocab, (1, min(24, ours.cfg.n_ctx)), generator=torch.Generator().manual_seed(0))
        shown = f"{tokens.shape[1]} random tokens (seed 0; no tokenizer for this model)"
    print(f"model: {args.model} ({ours.cfg.n_layers} layers, d_model {ours.cfg.d_model}, "
          f"{'processed' if processed else 'unprocessed'} weights); input: {shown}\n")
    reports = []
    against = args.against.split(",")
    unknown = sorted(set(against) - {"tl", "hf"})
    if unknown:
        raise SystemExit(f"error: --against takes tl and/or hf, got {','.join(unknown)}")
    if "tl" in against:
        reports.append(compare(ours, to_transformer_lens(source, processed), tokens))
    if "hf" in against:
        hf_ours = ours if not processed else from_pretrained_no_processing(source, tokenizer=None)
        reports.append(compare(hf_ours, to_transformers(source), tokens))
    for r in reports:
        print(json.dumps(r.to_dict(), indent=1) if args.json else r.table(per_layer=args.per_layer))
        print()
    ok = all(r.passed for r in reports)
    print("all comparisons PASS" if ok else "some comparisons FAIL")
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="interp-gpt", description="A readable, hookable GPT-2 for interpretability.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "compare",
        help="compare a model's logits and every activation against transformer-lens and Hugging Face",
        description="Load MODEL into interp_gpt, transformer-lens and Hugging Face transformers and print, "
        "per hook, the largest difference.",
        epilog="examples:\n  interp-gpt compare\n  interp-gpt compare gpt2 --prompt 'Hello world'\n"
        "  interp-gpt compare ./my-gpt2-folder --unprocessed --per-layer",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help=f"hub id, local folder or weights file (default: {DEFAULT_MODEL}, built offline from seed 0)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="text to run (default: an IOI-style sentence)")
    p.add_argument("--unprocessed", action="store_true", help="compare weights as stored (no fold_ln / centring)")
    p.add_argument("--per-layer", action="store_true", help="one row per hook instead of per hook family")
    p.add_argument("--against", default="tl,hf", help="references: tl, hf or tl,hf (default)")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.set_defaults(func=_cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in ("transformer_lens", "transformers"):
            print(f"error: {e.name} is not installed; install the comparison extra: pip install 'interp-gpt[compare]'",
                  file=sys.stderr)
            return 2
        raise
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
