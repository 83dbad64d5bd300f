"""Training sparse autoencoders: `SAETrainer`, the evaluation metrics, and the command line.

    python -m interp_gpt.sae.training --model tiny-gpt2 --hook blocks.1.hook_resid_pre \\
        --architecture topk --d-sae 1024 --k 32 --n-tokens 4000000 --out saes/resid1

The `train-sae` command (this module holds its options, `interp-gpt train-sae` and
`python -m interp_gpt.sae.training` run it): split the corpus, train, save the SAE and metrics.json.
Several --hook, --architecture or --d-sae values train one SAE per combination from one forward
(`multi.py`), each in OUT/<hook>-<architecture>-<d_sae>/, with OUT/metrics.json holding them all.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from ...checks import check_float, check_int_in_range, check_text_files
from ...files import write_atomic
from ...utils import hook_shape
from ..common import (
    add_corpus_arguments,
    add_out_arguments,
    add_run_arguments,
    check_hooks,
    command_main,
    config_from_options,
    run_subcommand,
    start_training_run,
)
from ..saes.architectures import REGISTRY
from ..saes.config import SAEConfig, SAEMetadata
from ..saes.core import SAE
from ..saes.evaluation import evaluate_sae
from .data import activation_batches, split_corpus, token_windows
from .multi import MultiSAETrainer, save_trained_saes
from .sae_trainer import NonFiniteTrainingError, SAETrainer, SAETrainingConfig

__all__ = ["add_arguments", "run", "run_command", "main"]


HOOK, ARCHITECTURE, D_SAE = "blocks.1.hook_resid_pre", "topk", 1024  # the defaults


def trainable_architectures() -> tuple[str, ...]:
    """The architectures the trainer trains (interp_gpt.sae.saes.architectures), the default first."""
    names = [name for name, arch in REGISTRY.items() if arch.trainable]
    return (ARCHITECTURE, *[n for n in names if n != ARCHITECTURE])


# The architectures' own SAEConfig fields the command sets (option -> field), where the architecture owns it.
ARCH_OPTIONS = {"k": "k", "matryoshka_widths": "matryoshka_widths", "max_iterations": "max_iterations"}
_SEVERAL = (
    "several (A B, or the option again): one SAE per --hook x --architecture x --d-sae, all trained from one "
    "forward, each in OUT/<hook>-<architecture>-<d_sae>"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The train-sae options (this module's command and `interp-gpt train-sae`)."""
    p.add_argument("--model", default="tiny-gpt2", help="model name, hub id, folder or weights file")
    p.add_argument("--hook", action="extend", nargs="+", help=f"the hook to train on; {_SEVERAL} (default: {HOOK})")
    add_corpus_arguments(p)
    # add_feature_arguments' options, --architecture and --d-sae taking several values
    p.add_argument("--architecture", action="extend", nargs="+", choices=trainable_architectures(),
                   help=f"sae-lens' architecture name; several: see --hook (default: {ARCHITECTURE})")  # fmt: skip
    p.add_argument(
        "--d-sae", action="extend", nargs="+", type=int, help=f"features; several: see --hook (default: {D_SAE})"
    )
    p.add_argument("--k", type=int, default=32, help="active features per token (the topk family)")
    p.add_argument("--l1-coefficient", type=float, default=1.0, help="(standard, gated)")
    p.add_argument("--l0-coefficient", type=float, default=1.0, help="(jumprelu)")
    p.add_argument("--aux-coefficient", type=float, default=1 / 32, help="AuxK loss weight (the topk family)")
    p.add_argument(
        "--matryoshka-widths", type=int, nargs="+", help="nested widths (matryoshka_batchtopk; default: none)"
    )
    p.add_argument(
        "--max-iterations",
        type=int,
        help="features chosen per token (matching_pursuit; default: until the residual is small)",
    )
    p.add_argument("--clip-grad-norm", type=float, help="clip the gradient norm to this (sae-lens: 1.0; default off)")
    add_run_arguments(p)
    add_out_arguments(
        p,
        "cfg.json, sae_weights.safetensors, metrics.json; several SAEs: those in OUT/<hook>-<architecture>-<d_sae> "
        "(its own last_good on NaN) and OUT/metrics.json with them all",
    )


def check_sae_args(args: argparse.Namespace) -> SAETrainingConfig:
    """Every option the run needs, checked before the model loads; returns the training config."""
    for option, low in (("d_sae", 1), ("k", 1), ("batch_size", 1), ("context_size", 2), ("n_tokens", 1)):
        check_int_in_range(getattr(args, option), "--" + option.replace("_", "-"), low, None)
    for option in ("val_windows", "threads"):
        check_int_in_range(getattr(args, option), "--" + option.replace("_", "-"), 0, None)
    check_float(args.val_frac, "--val-frac", 0.0, 0.5)
    if "k" in REGISTRY[args.architecture].fields and args.k > args.d_sae:
        raise ValueError(
            f"--k={args.k} is out of range: a {args.architecture} SAE keeps 1..--d-sae={args.d_sae} features"
        )
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(
            f"--out={args.out!r} is a file; expected a folder (it gets cfg.json, the weights, metrics.json)"
        )
    options = {
        "lr": args.lr,
        "lr_warm_up_steps": args.lr_warm_up_steps,
        "lr_decay_steps": args.lr_decay_steps,
        "l1_coefficient": args.l1_coefficient,
        "log_every": args.log_every,
        "seed": args.seed,
    }
    for option in ("l0_coefficient", "aux_coefficient", "clip_grad_norm"):  # (train-transcoder has its own)
        if hasattr(args, option):
            options[option] = getattr(args, option)
    return config_from_options(SAETrainingConfig, options, options)  # type: ignore[no-any-return]


def _hook_width(model: Any, hook: str, tokens: Tensor) -> tuple[int, str]:
    """(d_in, reshape_activations) of an SAE on `hook`: one vector per token, a per-head hook (q, k, v,
    z: `[batch, pos, n_heads, d_head]`) read whole as sae-lens does (reshape_activations="hook_z")."""
    model.hook_points(hook, arg="--hook")  # a clear error for a name the model lacks
    shape = hook_shape(model.cfg, hook)
    if shape is not None and len(shape) == 1:
        return shape[0], "none"
    if shape is not None and hook.endswith(("hook_q", "hook_k", "hook_v", "hook_z")):
        return shape[0] * shape[1], "hook_z"
    _, cache = model.run_with_cache(tokens[:1, :2], names_filter=[hook])  # the shape it has, for the message
    act = cache[hook]
    raise ValueError(
        f"--hook={hook!r} is {list(act.shape)} ({act.dtype}), not one vector of activations per token; "
        "train on a hook such as hook_resid_pre, hook_attn_out, mlp.hook_post or attn.hook_z"
    )


def _several(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(hook, architecture, d_sae) of each SAE asked for (--hook x --architecture x --d-sae), each once."""
    lists = []
    for option, default in (("hook", HOOK), ("architecture", ARCHITECTURE), ("d_sae", D_SAE)):
        value = getattr(args, option)
        values = [default] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
        twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if twice is not None:
            raise ValueError(
                f"--{option.replace('_', '-')}: {twice!r} is given twice; each SAE gets its own folder "
                "OUT/<hook>-<architecture>-<d_sae>"
            )
        lists.append(values)
    return [(str(h), str(a), int(d)) for h, a, d in itertools.product(*lists)]


def _one_sae(model: Any, args: argparse.Namespace, hook: str, architecture: str, d_sae: int, val_tokens: Tensor) -> SAE:
    """The SAE to train on `hook`, its metadata from the run."""
    d_in, reshape = _hook_width(model, hook, val_tokens)
    metadata = SAEMetadata(
        hook_name=hook,
        model_name=model.cfg.model_name,
        context_size=args.context_size,
        prepend_bos=True,
        dataset_path=", ".join(args.data),
    )
    return SAE(
        SAEConfig(
            d_in=d_in,
            d_sae=d_sae,
            architecture=architecture,
            reshape_activations=reshape,
            **architecture_fields(args, architecture),
            metadata=metadata,
        )
    )


def architecture_fields(args: argparse.Namespace, architecture: str) -> dict[str, Any]:
    """The SAEConfig fields of `architecture` the options set (--k for the topk family, ...); an option given
    for an architecture without that field is left out (several architectures train from one command)."""
    owned = REGISTRY[architecture].fields
    fields = {field: getattr(args, option) for option, field in ARCH_OPTIONS.items() if field in owned}
    return {field: value for field, value in fields.items() if value is not None}


def run(args: argparse.Namespace, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train and save one SAE from parsed arguments; returns the metrics written to metrics.json.

    Everything the run needs (the options, the hook, the corpus, the SAE's fit to the model and its
    evaluation) is checked before the first step; the SAE is saved before its final evaluation. A step
    that meets NaN / inf stops the run and saves the SAE's last good state in OUT/last_good.
    Several --hook, --architecture or --d-sae values: `multi.save_trained_saes` trains them all from one
    forward and saves each in OUT/<hook>-<architecture>-<d_sae>; returns OUT/metrics.json's contents."""
    runs = _several(args)
    for _, architecture, d_sae in runs:  # each SAE's options, checked as a run of its own would check them
        cfg = check_sae_args(argparse.Namespace(**{**vars(args), "architecture": architecture, "d_sae": d_sae}))
    hooks = list(dict.fromkeys(hook for hook, _, _ in runs))
    model = start_training_run(args)
    check_hooks(model, hooks, "--hook")
    check_int_in_range(args.context_size, "--context-size", 2, model.cfg.n_ctx, f"contexts of {args.model}")
    train_texts, val_texts = split_corpus(check_text_files(args.data, "--data"), args.val_frac)
    val_tokens = token_windows(model, val_texts, args.context_size, args.val_windows or None)
    saes = [_one_sae(model, args, hook, architecture, d_sae, val_tokens) for hook, architecture, d_sae in runs]
    for sae in saes:
        evaluate_sae(model, sae, val_tokens[:1])  # the final evaluation's path, tried before the first step
    n_steps = max(1, args.n_tokens // args.batch_size)
    batches = activation_batches(
        model, hooks[0] if len(hooks) == 1 else hooks, train_texts, args.batch_size, args.context_size, args.seed
    )
    out = Path(args.out)
    command = "python -m interp_gpt.sae.training " + " ".join(shlex.quote(a) for a in (argv or []))
    if len(saes) > 1:
        fields = {"validation_text": _validation_text(args), "command": command}
        return save_trained_saes(
            MultiSAETrainer(saes, cfg), batches, n_steps, out, lambda sae: evaluate_sae(model, sae, val_tokens), fields,
            progress=not args.no_progress,
        )  # fmt: skip
    sae = saes[0]
    trainer = SAETrainer(sae, cfg)
    return train_save_evaluate(
        trainer, batches, n_steps, args, out, sae.save_model, lambda: evaluate_sae(model, sae, val_tokens),
        command, {}, "train-sae: the trained SAE is", "its",
    )  # fmt: skip


def _validation_text(args: argparse.Namespace) -> str:
    return f"the last {args.val_frac:.0%} (cut at a newline) of each text file in {', '.join(args.data)}"


def train_save_evaluate(
    trainer: Any,
    batches: Any,
    n_steps: int,
    args: argparse.Namespace,
    out: Path,
    save: Callable[[Path], Any],
    evaluate: Callable[[], dict[str, Any]],
    command: str,
    extra: dict[str, Any],
    saved: str,
    its: str,
) -> dict[str, Any]:
    """The end of a training command (train-sae, train-transcoder), in the order that loses nothing:
    train (on a NaN stop, save the last good state to OUT/last_good and name it); save what was
    trained; write metrics.json without validation; evaluate (an error says where the trained module
    is); write metrics.json with it. `saved` names what was trained ("train-sae: the trained SAE is"),
    `its` its possessive ("its"/"their"); `extra` goes into metrics.json after the validation fields."""
    start = time.perf_counter()
    try:
        log = trainer.train(batches, n_steps, progress=not args.no_progress)
    except NonFiniteTrainingError as e:
        if not e.last_good_step:  # nothing trained worth keeping
            raise
        save(out / "last_good")
        raise NonFiniteTrainingError(f"{e}; saved in {out / 'last_good'}", e.step, e.last_good_step) from None
    seconds = time.perf_counter() - start
    save(out)  # before the evaluation, which can fail
    metrics: dict[str, Any] = {
        "validation": None,  # filled in below
        "validation_text": _validation_text(args),
        **extra,
        "train": {k: log[-1][k] for k in ("l0", "mse", "explained_variance", "dead_fraction")},
        "steps": trainer.n_steps,
        "train_tokens": trainer.n_tokens,
        "train_seconds": round(seconds, 1),
        "command": command,
    }
    write_atomic(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    where = f"{saved} saved in {out} (metrics.json without validation)"
    try:
        final = evaluate()
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{where}, but {its} evaluation failed: {e}") from e
    except Exception:  # a failure of another kind (out of memory ...): its traceback follows this line
        print(where, file=sys.stderr)
        raise
    metrics["validation"] = final
    write_atomic(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    print(json.dumps({k: v for k, v in final.items() if not isinstance(v, list)}, indent=2))
    return metrics


def run_command(args: argparse.Namespace) -> int:
    """`interp-gpt train-sae ...` (the same options; the command recorded is this module's equivalent)."""
    return run_subcommand(run, args, "train-sae")


def main(argv: list[str] | None = None) -> int:
    """`python -m interp_gpt.sae.training ...`; returns the exit status (2: bad input)."""
    return command_main("python -m interp_gpt.sae.training", __doc__.split("\n")[0], add_arguments, run, argv)
