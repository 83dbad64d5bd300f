"""The `interp-gpt` command.

    interp-gpt generate  [MODEL] PROMPT [--max-new-tokens N] [--temperature T] [--top-k K]
                                        [--top-p P] [--greedy] [--seed S]
    interp-gpt attention [MODEL] PROMPT [--layer L] [--head H] [--out PAGE.html]
    interp-gpt lens      [MODEL] PROMPT [--top N] [--tuned DIR]
    interp-gpt heads     [MODEL] [--top N]
    interp-gpt compare   [MODEL] [--prompt TEXT] [--unprocessed] [--per-layer] [--json]
    interp-gpt harvest   --hook NAME --data PATH --out DIR --n-tokens N [--model MODEL] [...]
    interp-gpt features  MODEL SAE --feature N --data PATH [--html PAGE.html]
    interp-gpt train-sae --data PATH --out DIR [--model MODEL] [--hook NAME] [--k K] [--n-tokens N] [...]
    interp-gpt train-transcoder --data PATH --out DIR [--kind plt|skip|clt] [--layers 0,1] [--k K] [...]
    interp-gpt sae-bench --out DIR [--architecture NAME ...] [--seeds N] [--no-real] [--set ARCH.FIELD=V] [...]
    interp-gpt attribute MODEL PROMPT --transcoders PATH --out PAGE.html [--json GRAPH.json] [...]
    interp-gpt train-lens [MODEL] --data PATH --out DIR [--steps N] [--batch-size N] [...]

MODEL is `tiny-gpt2` (the default: the small model shipped inside the package, so every
command runs offline), a hub id (gpt2, gpt2-medium, ...), a local folder or weights file,
or `random-gpt2-small`: a GPT-2-small-shaped checkpoint built on this machine from a fixed
seed. With one positional argument, `generate`, `attention` and `lens` read it as PROMPT,
unless it names a model (a known name or an existing path): then PROMPT is missing, and the
error says so. `--data` reads one way in every command: a text file or a folder of .txt files,
several of them if you like. `interp-gpt --version` prints the version.

Errors (an unknown model, an empty prompt, a layer out of range ...) are one line on
stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any, NoReturn

from .common import HelpFormatter, UsageError, quiet_third_party_progress
from .common import check_at_least as _check_at_least
from .common import check_index_option as _check_index
from .common import show_token as _show_token
from .common import table as _table

__all__ = ["DEFAULT_MODEL", "RANDOM_MODEL", "DEFAULT_PROMPT", "random_gpt2_small", "build_parser", "main"]

DEFAULT_MODEL = "tiny-gpt2"
RANDOM_MODEL = "random-gpt2-small"
DEFAULT_PROMPT = "When Mary and John went to the store, John gave a drink to"
_MODEL_HELP = (
    f"{DEFAULT_MODEL} (default, shipped, offline), {RANDOM_MODEL} (random weights, built offline), "
    "a hub id such as gpt2, a local folder or a weights file"
)


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one line (no usage block): "error: PROG: what; see PROG --help"."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message}; see '{self.prog} --help'\n")


def _home() -> Path:
    return Path(os.environ.get("INTERP_GPT_HOME", Path.home() / ".cache" / "interp_gpt"))


def random_gpt2_small(seed: int = 0, folder: str | os.PathLike | None = None) -> Path:
    """A GPT-2-small-shaped Hugging Face checkpoint with seeded random weights (built once).

    Weights are N(0, 0.02) as GPT-2 initialises them; LayerNorm weights and every bias
    but the (absent) unembedding bias get seeded noise too, so each weight-processing step (fold_ln, centring, value-bias
    folding) has real work to do when it is compared.
    """
    import torch

    from ..config import preset
    from ..loading import save_hf_checkpoint
    from ..model.gpt import GPT

    folder = Path(folder) if folder else _home() / f"random-gpt2-small-seed{seed}"
    if (folder / "model.safetensors").exists() and (folder / "config.json").exists():
        return folder
    with torch.device("meta"):
        model = GPT(dataclasses.replace(preset("gpt2"), tokenizer_name=None))  # weights only: no tokenizer to load
    model = model.to_empty(device="cpu")
    model.init_weights(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Not unembed.b_U: GPT-2's lm_head has no bias, so a checkpoint cannot hold one.
            if not name.split(".")[-1].startswith("W_") and name != "unembed.b_U":
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    # Write beside the final folder and rename, so an interrupted build is never picked up.
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    try:
        save_hf_checkpoint(model, tmp)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed build leaves nothing behind
    return folder


# ----------------------------------------------------------------------------
# shared helpers: the model, the prompt, checks, tables
# ----------------------------------------------------------------------------
def _resolve_model(name: str) -> Any:
    """What `from_pretrained` takes for a MODEL argument: `random-gpt2-small` is built here."""
    return random_gpt2_small() if name == RANDOM_MODEL else name


def _load(name: str) -> Any:
    """The processed model MODEL names (loader errors name the known models)."""
    from ..loading import from_pretrained

    return from_pretrained(_resolve_model(name))


def _model_and_prompt(args: argparse.Namespace) -> None:
    """`[MODEL] PROMPT`: with one positional argument it is the prompt (MODEL is the default).

    Example: `interp-gpt lens 'Hello'` -> model tiny-gpt2, prompt 'Hello'.
    """
    usage = f"usage: interp-gpt {args.command} [MODEL] PROMPT"
    if args.prompt is None:
        if args.model is None:
            raise UsageError(f"{args.command}: PROMPT is missing; {usage}")
        if _names_a_model(args.model):
            raise UsageError(
                f"{args.command}: PROMPT is missing: {args.model!r} names a model; {usage}, e.g. "
                f"interp-gpt {args.command} {args.model} 'The cat sat on the mat'"
            )
        args.model, args.prompt = DEFAULT_MODEL, args.model
    elif args.model is None:
        args.model = DEFAULT_MODEL


def _names_a_model(text: str) -> bool:
    """Whether a lone positional argument reads as MODEL rather than PROMPT: a shipped model, the
    random GPT-2 small, a hub preset or its transformer-lens alias, or an existing path."""
    from ..checkpoints.sources import HUB_ALIASES, HUB_PRESETS, shipped_models

    if text in {*shipped_models(), RANDOM_MODEL, *HUB_PRESETS} or text.lower() in HUB_ALIASES:
        return True
    try:
        return text.strip() != "" and Path(text).expanduser().exists()
    except (OSError, ValueError):  # a long prompt is no file name (ENAMETOOLONG), nor one with a NUL
        return False


def _prompt_tokens(model: Any, name: str, prompt: str, room: int = 0) -> Any:
    """PROMPT as token ids [1, pos] (BOS first, as the model expects), checked against the
    context, with `room` positions left over for generated tokens.

    Example: `_prompt_tokens(model, "tiny-gpt2", "Hello")` -> tensor([[2047, ...]]).
    """
    if model.tokenizer is None:
        raise UsageError(
            f"MODEL {name!r} has no tokenizer, so it cannot read PROMPT; "
            f"use a model with tokenizer files, e.g. {DEFAULT_MODEL}"
        )
    if prompt == "":
        raise UsageError("PROMPT is empty; give some text, e.g. 'Once upon a time'")
    bos = model.cfg.default_prepend_bos
    tokens, _ = model.tokenizer.to_tokens(prompt, prepend_bos=bos)
    n, ctx = tokens.shape[1], model.cfg.n_ctx
    counted = f"{n} tokens{' (BOS included)' if bos else ''}"
    if n > ctx:
        raise UsageError(f"PROMPT is {counted}, longer than the context of {name!r} ({ctx} tokens); shorten it")
    if n + room > ctx:
        raise UsageError(
            f"PROMPT is {counted} and --max-new-tokens is {room}: {n + room} tokens is longer than "
            f"the context of {name!r} ({ctx} tokens); use --max-new-tokens {ctx - n} or less"
        )
    return tokens.to(model.W_E.device)


# ----------------------------------------------------------------------------
# the subcommands
# ----------------------------------------------------------------------------
def _cmd_generate(args: argparse.Namespace) -> int:
    _model_and_prompt(args)
    _check_at_least(args.max_new_tokens, 0, "--max-new-tokens")
    _check_at_least(args.top_k, 1, "--top-k")
    if args.temperature is not None and not args.temperature > 0:
        raise UsageError(f"--temperature must be > 0, got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.seed is not None and not 0 <= args.seed < 2**64:
        raise UsageError(f"--seed must be in 0..2**64-1, got {args.seed}")
    sampling = [
        o
        for o, v in (("--temperature", args.temperature), ("--top-k", args.top_k), ("--top-p", args.top_p))
        if v is not None
    ]
    if args.greedy and sampling:
        raise UsageError(
            f"--greedy always takes the most likely token; it cannot be combined with {', '.join(sampling)}"
        )
    model = _load(args.model)
    tokens = _prompt_tokens(model, args.model, args.prompt, room=args.max_new_tokens)
    out = model.generate(
        tokens,
        max_new_tokens=args.max_new_tokens,
        do_sample=not args.greedy,
        temperature=1.0 if args.temperature is None else args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    first = 1 if model.cfg.default_prepend_bos else 0  # the BOS we put in front is not the user's text
    print(model.to_string(out[0, first:]))
    return 0


def _cmd_attention(args: argparse.Namespace) -> int:
    from ..plots import attention_viewer, save_html

    _model_and_prompt(args)
    model = _load(args.model)
    layer = _check_index(args.layer, model.cfg.n_layers, "--layer", f"{args.model!r} has layers")
    head = _check_index(args.head, model.cfg.n_heads, "--head", f"{args.model!r} has heads")
    tokens = _prompt_tokens(model, args.model, args.prompt)
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"), return_type=None)
    fig = attention_viewer(cache, model.to_str_tokens(tokens[0]), layer=layer, head=head)
    print(save_html(fig, args.out))
    return 0


def _cmd_lens(args: argparse.Namespace) -> int:
    from ..inspect import cache_logit_lens
    from ..lenses.command import load_for_lens, tuned_lens_logits

    _model_and_prompt(args)
    _check_at_least(args.top, 1, "--top")
    model = load_for_lens(_resolve_model(args.model), args.tuned) if args.tuned else _load(args.model)
    tokens = _prompt_tokens(model, args.model, args.prompt)
    _, cache = model.run_with_cache(
        tokens, names_filter=lambda n: n.endswith(("hook_resid_pre", "hook_resid_post")), return_type=None
    )
    logits, labels = tuned_lens_logits(model, cache, args.tuned) if args.tuned else cache_logit_lens(cache)
    probs, ids = logits.softmax(-1).topk(min(args.top, model.cfg.d_vocab), dim=-1)  # [layer, pos, top]
    n_layers, n_pos, top = ids.shape
    rows = []
    for pos, token in enumerate(model.to_str_tokens(tokens[0])):
        guesses = [model.tokenizer.decode_each(ids[L, pos].tolist()) for L in range(n_layers)]  # [layer][top]
        for k in range(top):
            cells = [f"{_show_token(guesses[L][k])} {probs[L, pos, k]:.3f}" for L in range(n_layers)]
            rows.append([str(pos) if k == 0 else "", _show_token(token) if k == 0 else "", *cells])
    print(
        f"{'tuned' if args.tuned else 'logit'} lens of {args.model} on {n_pos} tokens: the top {top} "
        "next-token prediction(s) (probability) if the model stopped at each layer; final_post is the model's output\n"
    )
    print(_table(["pos", "token", *labels], rows, right=frozenset({0})))
    return 0


def _cmd_heads(args: argparse.Namespace) -> int:
    from ..inspect import head_scores

    _check_at_least(args.top, 1, "--top")
    model = _load(args.model)
    seq_len, batch = min(50, (model.cfg.n_ctx - 1) // 2), 8  # head_scores' defaults, stated
    scores = head_scores(model, seq_len=seq_len, batch_size=batch)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    rows = [
        [str(L), str(h), *(f"{s[L, h]:.3f}" for s in scores.values())] for L in range(n_layers) for h in range(n_heads)
    ]
    print(
        f"head scores of {args.model} on {batch} sequences of {seq_len} random tokens, each repeated "
        "(mean attention, 0..1)\n"
    )
    print(_table(["layer", "head", *scores], rows, right=frozenset(range(2 + len(scores)))))
    top = min(args.top, n_layers * n_heads)
    print()
    for name, s in scores.items():
        values, flat = s.flatten().topk(top)
        best = ", ".join(
            f"L{i // n_heads}H{i % n_heads} {v:.3f}" for v, i in zip(values.tolist(), flat.tolist(), strict=True)
        )
        print(f"top {top} {name} heads: {best}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    import torch

    from ..compare import compare, to_transformer_lens, to_transformers
    from ..loading import from_pretrained, from_pretrained_no_processing

    against = args.against.split(",")
    unknown = sorted(set(against) - {"tl", "hf"})
    if unknown:
        raise UsageError(f"--against takes tl and/or hf, got {','.join(unknown)}")
    source = _resolve_model(args.model)
    processed = not args.unprocessed
    ours = (from_pretrained if processed else from_pretrained_no_processing)(source)
    if ours.tokenizer is not None:
        tokens = ours.to_tokens(args.prompt)
        shown = f"prompt {args.prompt!r} ({tokens.shape[1]} tokens)"
    else:
        tokens = torch.randint(
            0, ours.cfg.d_vocab, (1, min(24, ours.cfg.n_ctx)), generator=torch.Generator().manual_seed(0)
        )
        shown = f"{tokens.shape[1]} random tokens (seed 0; no tokenizer for this model)"
    print(
        f"model: {args.model} ({ours.cfg.n_layers} layers, d_model {ours.cfg.d_model}, "
        f"{'processed' if processed else 'unprocessed'} weights); input: {shown}\n"
    )
    reports = []
    with quiet_third_party_progress():  # transformers' "Loading weights" bars stay out of the table
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


# ----------------------------------------------------------------------------
# the parser
# ----------------------------------------------------------------------------
def _subcommand(sub: Any, name: str, help: str, description: str, examples: list[str], prompt: bool = False) -> Any:
    """One subcommand's parser, its examples in the epilog (shown by --help); with `prompt`,
    it takes `[MODEL] PROMPT` (see `_add_model_prompt`)."""
    p = sub.add_parser(
        name,
        help=help,
        description=textwrap.fill(description, 88),
        usage=f"interp-gpt {name} [MODEL] PROMPT [options]" if prompt else None,
        epilog="examples:\n" + "\n".join(f"  interp-gpt {name} {e}".rstrip() for e in examples),
        formatter_class=HelpFormatter,
    )
    if prompt:
        _add_model_prompt(p)
    return p


def _add_model_prompt(p: argparse.ArgumentParser) -> None:
    """`[MODEL] PROMPT`: argparse fills `model` first, so `_model_and_prompt` sorts them out."""
    p.add_argument("model", nargs="?", metavar="MODEL", help=f"optional; {_MODEL_HELP}")
    p.add_argument("prompt", nargs="?", metavar="PROMPT", help="the text to run (quote it)")


def _add_generate(sub: Any) -> None:
    p = _subcommand(
        sub,
        "generate",
        "continue a prompt with the model and print the text",
        "Continue PROMPT token by token (sampling by default) and print the prompt with its continuation. "
        "Generation stops early at the end-of-text token.",
        [
            "'Once upon a time'",
            "tiny-gpt2 'ROMEO:' --max-new-tokens 80 --temperature 0.8 --top-k 40 --seed 1",
            "gpt2 'The Eiffel Tower is in' --greedy",
        ],
        prompt=True,
    )
    p.add_argument("--max-new-tokens", type=int, default=40, metavar="N", help="tokens to add (default: 40)")
    p.add_argument("--temperature", type=float, metavar="T", help="divide the logits by T before sampling (default: 1)")
    p.add_argument("--top-k", type=int, metavar="K", help="sample among the K most likely tokens only (default: all)")
    p.add_argument(
        "--top-p",
        type=float,
        metavar="P",
        help="sample among the likeliest tokens holding probability P (default: 1, all)",
    )
    p.add_argument("--greedy", action="store_true", help="always take the most likely token (no sampling)")
    p.add_argument(
        "--seed", type=int, metavar="S", help="seed the sampling: the same command, the same text (default: none)"
    )
    p.set_defaults(func=_cmd_generate)


def _add_attention(sub: Any) -> None:
    p = _subcommand(
        sub,
        "attention",
        "write an HTML page showing every head's attention on a prompt",
        "Run PROMPT and write one self-contained HTML page (plotly.js inside, works offline) with the attention "
        "pattern of every head, a layer menu and a head menu. Prints the path written.",
        ["'The cat sat on the mat. The cat'", "tiny-gpt2 'ROMEO: But soft' --layer 1 --head 2 --out romeo.html"],
        prompt=True,
    )
    p.add_argument("--layer", type=int, default=0, metavar="L", help="layer shown first (default: 0)")
    p.add_argument("--head", type=int, default=0, metavar="H", help="head shown first (default: 0)")
    p.add_argument(
        "--out", default="attention.html", metavar="PAGE.html", help="where to write (default: attention.html)"
    )
    p.set_defaults(func=_cmd_attention)


def _add_lens(sub: Any) -> None:
    p = _subcommand(
        sub,
        "lens",
        "print the logit lens: each layer's top next-token guess at each position",
        "The logit lens: the residual stream entering each layer (and after the last, final_post) goes through "
        "the final LayerNorm and the unembedding (with --tuned, after each layer's translator). One row per prompt "
        "position, one column per layer; each cell is the top predicted next token (as a Python string literal, "
        "long ones cut with …) and its probability.",
        ["'The cat sat on the mat. The cat sat on the'", "tiny-gpt2 'KING RICHARD' --top 3"],
        prompt=True,
    )
    p.add_argument(
        "--top", type=int, default=1, metavar="N", help="show the N most likely tokens per cell (default: 1)"
    )
    p.add_argument(
        "--tuned", metavar="DIR", help="a tuned lens folder (train-lens' --out) (default: none, the logit lens)"
    )
    p.set_defaults(func=_cmd_lens)


def _add_heads(sub: Any) -> None:
    p = _subcommand(
        sub,
        "heads",
        "score every attention head as previous-token, duplicate-token and induction head",
        "Run the model on repeated random tokens and print, for every (layer, head), its mean attention to the "
        "previous token, to earlier copies of the current token, and to the token after an earlier copy "
        "(induction); then the top N heads for each score.",
        ["", "tiny-gpt2 --top 5", "gpt2"],
    )
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, metavar="MODEL", help=_MODEL_HELP)
    p.add_argument("--top", type=int, default=3, metavar="N", help="list the N best heads for each score (default: 3)")
    p.set_defaults(func=_cmd_heads)


def _add_compare(sub: Any) -> None:
    p = _subcommand(
        sub,
        "compare",
        "compare a model's logits and every activation against transformer-lens and Hugging Face",
        "Load MODEL into interp_gpt, transformer-lens and Hugging Face transformers and print, per hook, "
        "the largest difference.",
        ["", "gpt2 --prompt 'Hello world'", "./my-gpt2-folder --unprocessed --per-layer"],
    )
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, metavar="MODEL", help=_MODEL_HELP)
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="text to run (default: an IOI-style sentence)")
    p.add_argument("--unprocessed", action="store_true", help="compare weights as stored (no fold_ln / centring)")
    p.add_argument("--per-layer", action="store_true", help="one row per hook instead of per hook family")
    p.add_argument("--against", default="tl,hf", help="references: tl, hf or both (default: tl,hf)")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.set_defaults(func=_cmd_compare)


def _add_delegated(sub: Any) -> None:
    """The subcommands whose options and run live beside the code they drive: each module's
    `add_arguments` and its run function (attribute's, train-lens' and mib's also take the model
    loader and bring their own help, description and examples)."""
    from ..attribution import command as attribute
    from ..circuits.mib import command as mib
    from ..lenses import command as train_lens
    from ..sae.benchmark import command as sae_bench
    from ..sae.saes import features
    from ..sae.training import sae_command, transcoder_command
    from ..store import command as harvest

    table: list[tuple[str, str, str, list[str], Any, Any]] = [
        (
            "harvest",
            "write a model's activations at chosen hooks over a text corpus to safetensors shards",
            "Stream the text through the model and write the activations at each --hook to shuffled safetensors "
            "shards plus manifest.json (resumable: run it again on the same --out; under torchrun each rank "
            "writes its own shards). See interp_gpt.store.",
            ["--hook blocks.1.hook_resid_pre --data data/corpus --out acts --n-tokens 1000000"],
            harvest.add_arguments,
            harvest.run,
        ),
        (
            "features",
            "show one SAE feature: its top-activating contexts, activation histogram and the tokens it promotes",
            "Run the model over the text of --data (a folder: the validation tail of each file; the package ships "
            "no corpus, a clone has data/corpus), encode the activations at the SAE's hook and print what one "
            "feature does. SAE is a folder in SAELens' format or tiny-gpt2-sae.",
            [
                "tiny-gpt2 tiny-gpt2-sae --feature 3 --data data/corpus",
                "tiny-gpt2 tiny-gpt2-sae --feature 3 --data my_text.txt --html feature3.html",
            ],
            features.add_arguments,
            features.run,
        ),
        (
            "train-sae",
            "train a sparse autoencoder on a hook's activations over a text corpus",
            "Split --data into training and validation text, train an SAE (TopK or standard) on the activations "
            "at --hook, and save it in SAELens' format with metrics.json (validation L0, explained variance, CE "
            "loss recovered). Same as python -m interp_gpt.sae.training.",
            ["--data data/corpus --out saes/resid1 --k 32 --n-tokens 1310720"],
            sae_command.add_arguments,
            sae_command.run_command,
        ),
        (
            "train-transcoder",
            "train transcoders (per-layer, with a skip, or cross-layer) that predict each MLP's output from its input",
            "Split --data into training and validation text, harvest every layer's MLP input (--input-hook) and "
            "output (hook_mlp_out) in one pass, train the set, and save it (SAELens' or circuit-tracer's files) "
            "with metrics.json (per-layer explained variance, L0, dead fraction, CE loss recovered with every MLP "
            "replaced). Same as python -m interp_gpt.sae.train_transcoder_command.",
            [
                "--kind skip --data data/corpus --out transcoders/tiny-gpt2 --k 32",
                "--kind clt --data data/corpus --out transcoders/tiny-gpt2-clt --k 16",
            ],
            transcoder_command.add_arguments,
            transcoder_command.run_command,
        ),
        (
            "sae-bench",
            sae_bench.HELP,
            sae_bench.DESCRIPTION,
            sae_bench.EXAMPLES,
            sae_bench.add_arguments,
            sae_bench.run_command,
        ),  # fmt: skip
    ]
    loaders = [("attribute", attribute), ("train-lens", train_lens)]  # their run takes the model loader too
    table += [
        (n, m.HELP, m.DESCRIPTION, m.EXAMPLES, m.add_arguments, lambda a, m=m: m.run(a, _load)) for n, m in loaders
    ]
    table += [(*entry[:5], lambda a, run=entry[5]: run(a, _load)) for entry in mib.SUBCOMMANDS]
    for name, help, description, examples, add_arguments, run in table:
        p = _subcommand(sub, name, help, description, examples)
        add_arguments(p)
        p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    """The `interp-gpt` parser and its subcommands (each with --help and examples)."""
    parser = _Parser(
        prog="interp-gpt",
        description="A readable, hookable GPT-2 for interpretability.",
        epilog=f"MODEL defaults to {DEFAULT_MODEL}, the small model shipped with the package.\n\n"
        "examples:\n  interp-gpt generate 'Once upon a time'\n  interp-gpt heads\n  interp-gpt SUBCOMMAND --help",
        formatter_class=HelpFormatter,
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"interp-gpt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for add in (
        _add_generate,
        _add_attention,
        _add_lens,
        _add_heads,
        _add_compare,
        _add_delegated,
    ):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `interp-gpt` with `argv` (default: sys.argv[1:]); returns the exit status.

    Example:
        >>> main(["generate", "Once upon a time", "--greedy", "--max-new-tokens", "5"])
        Once upon a time, ...
        0
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or an argparse error already printed (2)
        return 0 if e.code is None else int(e.code)
    try:
        return int(args.func(args))
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in ("transformer_lens", "transformers"):
            print(
                f"error: {e.name} is not installed; install the comparison extra: pip install 'interp-gpt[compare]'",
                file=sys.stderr,
            )
            return 2
        raise
    except (OSError, ValueError, TypeError, KeyError) as e:  # checks.BAD_INPUT (KeyError: a name not there)
        from ..checks import error_line  # here, not at the top: --help stays quick (no torch import)

        print(f"error: {error_line(e)}", file=sys.stderr)  # one line, whatever the message
        return 2


if __name__ == "__main__":
    sys.exit(main())
