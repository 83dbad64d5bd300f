"""`interp-gpt train-transcoder` (and `python -m interp_gpt.sae.train_transcoder_command`): train
per-layer transcoders (PLT, with a skip) or a cross-layer transcoder (CLT) on a corpus, save them and
metrics.json.

    interp-gpt train-transcoder --kind skip --out transcoders/tiny-gpt2 --d-sae 1024 --k 32
    interp-gpt train-transcoder --kind clt --out transcoders/tiny-gpt2-clt --d-sae 1024 --k 16
    interp-gpt train-transcoder --architecture batchtopk --k 24.5 --out transcoders/tiny-gpt2-btk

`--architecture batchtopk` trains BatchTopK (`--k` per token on average over a batch, may be a float) and
saves JumpReLU transcoders whose threshold is the running one (see `batchtopk_metadata`).

One pass of the activation store harvests every layer's MLP input (`--input-hook`) and MLP output
(`blocks.L.hook_mlp_out`) together; one trainer steps every layer on the same rows. Everything the run
needs (the options, the hooks, the corpus, the save and the final evaluation) is checked before step 1;
the set is saved before its final evaluation; a step that meets NaN / inf saves the last good state
in OUT/last_good and stops.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...checks import check_float, check_text_files
from .. import common
from ..transcoders.clt import CLTConfig, CrossLayerTranscoder, save_clt
from ..transcoders.config import TranscoderConfig, batchtopk_metadata
from ..transcoders.evaluation import evaluate_transcoders
from ..transcoders.folders import refusal, replace_problem
from ..transcoders.processing import model_processing
from ..transcoders.transcoder import Transcoder, save_transcoders
from .data import activation_batches, split_corpus, token_windows
from .sae_command import check_sae_args, train_save_evaluate
from .transcoder_trainer import TranscoderTrainer, TranscoderTrainingConfig

__all__ = ["add_arguments", "run", "run_command", "main"]

INPUT_HOOKS = ("ln2.hook_normalized", "hook_resid_mid")
OUTPUT_HOOK = "hook_mlp_out"
_PROG = "python -m interp_gpt.sae.train_transcoder_command"
ARCHITECTURES = ("topk", "relu", "jumprelu", "batchtopk")


def _number(text: str) -> int | float:
    """--k's value: an int where it reads as one, else a float (batchtopk's); argparse names --k otherwise."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"expected a number (an int; a float for batchtopk), got {text!r}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The train-transcoder options: train-sae's, plus the set's kind, layers and input hook."""
    p.add_argument("--model", default="tiny-gpt2", help="model name, hub id, folder or weights file")
    p.add_argument("--kind", choices=("plt", "skip", "clt"), default="skip", help="per-layer, with a skip, or CLT")
    p.add_argument("--layers", default="all", help="comma-separated layers (default all; a CLT needs 0..N-1)")
    p.add_argument("--input-hook", default=INPUT_HOOKS[0], help=f"what each layer reads: {' or '.join(INPUT_HOOKS)}")
    common.add_corpus_arguments(p)
    # train-sae's feature options, but --k may be a float (batchtopk's average)
    p.add_argument("--architecture", choices=ARCHITECTURES, default=ARCHITECTURES[0], help="activation")
    p.add_argument("--d-sae", type=int, default=1024, help="features per layer")
    p.add_argument(
        "--k", type=_number, default=32,
        help="active features per token and layer (topk; batchtopk: on average over a batch, may be a float)",
    )  # fmt: skip
    p.add_argument("--l1-coefficient", type=float, default=1.0, help="(relu)")
    p.add_argument("--l0-coefficient", type=float, default=1.0, help="(jumprelu)")
    p.add_argument("--jumprelu-bandwidth", type=float, default=0.05, help="(jumprelu) the estimators' window")
    p.add_argument("--jumprelu-init-threshold", type=float, default=0.01, help="(jumprelu)")
    common.add_run_arguments(p)
    p.add_argument(
        "--format", choices=("saelens", "circuit-tracer"), default=None,
        help="files of a PLT set (default saelens); a CLT is always circuit-tracer's CLT folder",
    )  # fmt: skip
    common.add_out_arguments(p, "the transcoders and metrics.json")


def _check_args(args: argparse.Namespace) -> TranscoderTrainingConfig:
    """Every option checked before the model loads (train-sae's rules for the shared ones)."""
    shared = argparse.Namespace(**vars(args))
    shared.architecture = "standard" if args.architecture != "topk" else "topk"
    if args.architecture == "batchtopk":
        shared.k = 1  # (train-sae's --k check is for an int; batchtopk's is below)
    cfg = check_sae_args(shared)  # the options train-sae has, named as there
    if args.architecture == "batchtopk":
        check_float(args.k, "--k", 0.0)
        if args.k > args.d_sae:
            raise ValueError(
                f"--k={args.k} is out of range: expected a number > 0 and <= --d-sae={args.d_sae} (batchtopk's "
                "features per token on average)"
            )
    if args.input_hook not in INPUT_HOOKS:
        close = difflib.get_close_matches(str(args.input_hook), INPUT_HOOKS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"--input-hook={args.input_hook!r}: expected one of {', '.join(INPUT_HOOKS)}{hint}")
    if args.format is not None and args.kind == "clt":
        raise ValueError(f"--format={args.format!r}: a CLT is saved as circuit-tracer's CLT folder; leave --format out")
    kind = "clt" if args.kind == "clt" else "plt"
    problem = replace_problem(Path(args.out).expanduser(), kind)
    if problem is not None:  # the save's own rule for what it may replace, checked before the model loads
        raise ValueError(refusal(Path(args.out), kind, "--out", problem))
    extra = {name: getattr(args, name) for name in ("l0_coefficient", "jumprelu_bandwidth", "jumprelu_init_threshold")}
    fields = {**_config_fields(cfg), **extra}
    return common.config_from_options(TranscoderTrainingConfig, fields, extra)  # type: ignore[no-any-return]


def _config_fields(cfg: Any) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "history"}


def _layers(args: argparse.Namespace, n_layers: int, model_name: str) -> list[int]:
    """--layers as a sorted list of distinct layers of the model (a CLT's: 0..N-1 without a gap)."""
    text = str(args.layers).strip()
    if text == "all":
        layers = list(range(n_layers))
    else:
        try:
            layers = [int(p) for p in text.split(",") if p.strip()]
        except ValueError:
            raise ValueError(
                f"--layers={args.layers!r}: expected 'all' or comma-separated layers such as 0,1"
            ) from None
        if not layers:
            raise ValueError(f"--layers={args.layers!r}: expected 'all' or comma-separated layers such as 0,1")
        bad = [x for x in layers if not 0 <= x < n_layers]
        if bad:
            raise ValueError(
                f"--layers={args.layers!r}: layer {bad[0]} does not exist: {model_name}'s layers are 0..{n_layers - 1}"
            )
        if len(set(layers)) != len(layers):
            raise ValueError(f"--layers={args.layers!r}: a layer is given twice")
        layers = sorted(layers)
    if args.kind == "clt" and layers != list(range(len(layers))):
        missing = sorted(set(range(max(layers) + 1)) - set(layers))
        raise ValueError(
            f"--layers={args.layers!r}: a CLT covers layers 0..N-1 (its layer l writes every layer >= l); missing "
            f"{missing}"
        )
    return layers


def _build(
    args: argparse.Namespace, model: Any, layers: list[int]
) -> Transcoder | list[Transcoder] | CrossLayerTranscoder:
    d = model.cfg.d_model
    nonneg = args.format != "circuit-tracer" or args.architecture == "relu"  # circuit-tracer's keep negatives
    batch = args.architecture == "batchtopk"  # a JumpReLU transcoder trained as BatchTopK
    shape: dict[str, Any] = dict(
        d_in=d, d_sae=args.d_sae, d_out=d, architecture="jumprelu" if batch else args.architecture,
        k=args.k if args.architecture == "topk" else None, nonnegative_acts=nonneg,
    )  # fmt: skip
    meta = {"model_name": model.cfg.model_name, "context_size": args.context_size, "dataset_path": ", ".join(args.data)}
    if batch:
        meta.update(batchtopk_metadata(args.k))
    # The weights the set is trained on (processed, as from_pretrained loads them): what lets a later
    # user on a model processed otherwise convert it exactly (transcoder_processing).
    processing = {layer: model_processing(model, layer) for layer in layers}
    if args.kind == "clt":
        meta["model_processing"] = processing[layers[0]]
        return CrossLayerTranscoder(
            CLTConfig(
                n_layers=len(layers),
                **shape,
                metadata=common.SAEMetadata({**meta, "hook_name": args.input_hook, "hook_name_out": OUTPUT_HOOK}),
            )
        )
    return [
        Transcoder(
            TranscoderConfig(
                **shape,
                skip=args.kind == "skip",
                metadata=common.SAEMetadata(
                    {
                        **meta,
                        "model_processing": processing[layer],
                        "hook_name": f"blocks.{layer}.{args.input_hook}",
                        "hook_name_out": f"blocks.{layer}.{OUTPUT_HOOK}",
                    }
                ),
            )
        )
        for layer in layers
    ]


def _save(tcs: Any, out: Path, fmt: str | None) -> None:
    if isinstance(tcs, CrossLayerTranscoder):
        save_clt(tcs, out)
    else:
        save_transcoders(tcs, out, format=fmt or "saelens")


def _try_save(tcs: Any, out: Path, fmt: str | None) -> None:
    """The save, tried before step 1 into a temporary folder beside OUT (the format's rules, the folder's)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.try.", dir=out.parent))
    try:
        _save(tcs, tmp / "set", fmt)
    except ValueError as e:  # what the format cannot hold (circuit-tracer: layers 0..n-1, no ReLU'd TopK ...)
        raise ValueError(f"--format={fmt or 'saelens'}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train and save one transcoder set from parsed arguments; returns the metrics written to metrics.json."""
    cfg = _check_args(args)
    model = common.start_training_run(args)
    name = model.cfg.model_name or args.model
    layers = _layers(args, model.cfg.n_layers, name)
    from ...checks import check_int_in_range

    check_int_in_range(args.context_size, "--context-size", 2, model.cfg.n_ctx, f"contexts of {args.model}")
    tcs = _build(args, model, layers)
    trainer = TranscoderTrainer(tcs, cfg)
    common.check_hooks(model, trainer.hooks, "--input-hook")
    train_texts, val_texts = split_corpus(check_text_files(args.data, "--data"), args.val_frac)
    val_tokens = token_windows(model, val_texts, args.context_size, args.val_windows or None)
    evaluate_transcoders(model, tcs, val_tokens[:1])  # the final evaluation's path, tried before step 1
    out = Path(args.out)
    _try_save(tcs, out, args.format)
    n_steps = max(1, args.n_tokens // args.batch_size)
    batches = activation_batches(model, trainer.hooks, train_texts, args.batch_size, args.context_size, args.seed)
    command = f"{_PROG} " + " ".join(shlex.quote(a) for a in (argv or []))
    return train_save_evaluate(
        trainer, batches, n_steps, args, out, lambda path: _save(tcs, path, args.format),
        lambda: evaluate_transcoders(model, tcs, val_tokens), command,
        {"kind": args.kind, "architecture": args.architecture, "layers": layers},
        "train-transcoder: the trained transcoders are", "their",
    )  # fmt: skip


def run_command(args: argparse.Namespace) -> int:
    """`interp-gpt train-transcoder ...` (the command recorded is this module's equivalent)."""
    return common.run_subcommand(run, args, "train-transcoder")


def main(argv: list[str] | None = None) -> int:
    """`python -m interp_gpt.sae.train_transcoder_command ...`; returns the exit status (2: bad input)."""
    return common.command_main(_PROG, __doc__.split("\n")[0], add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
