"""Compare our model against transformer-lens and Hugging Face, hook by hook.

`compare(model, reference, input)` runs both models on the same tokens and, for every
hook name both sides expose, reports the largest absolute and relative difference.
References:
  * transformer-lens 3.x `HookedTransformer`;
  * transformer-lens 4.x `TransformerBridge` in compatibility mode (legacy hook names);
  * a `transformers` GPT-2 model (hooks read from its modules: embeddings, residual
    stream, attention and MLP outputs, MLP pre/post activations).

transformer-lens and transformers are imported lazily (`pip install interp-gpt[compare]`).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .model.gpt import GPT

__all__ = [
    "HookDiff",
    "ComparisonReport",
    "diff_tensors",
    "compare",
    "to_transformers",
    "transformer_lens_version",
    "transformer_lens_major",
    "to_transformer_lens",
    "compare_with_transformer_lens",
    "compare_with_huggingface",
    "ATOL",
    "GPT",
    "LOGITS_ATOL",
    "RTOL",
]

ATOL, RTOL, LOGITS_ATOL = 1e-5, 1e-4, 1e-4


@dataclass
class HookDiff:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""


@dataclass
class ComparisonReport:
    """Per-hook differences between our model and a reference, with an overall verdict.

    `passed` is True when every shared hook agrees within `atol + rtol * |reference|`
    and the logits (log-probs if `logprobs` is set) within `logits_atol`.
    """

    reference: str
    rows: list[HookDiff]
    logits_max_abs: float
    logprobs_max_abs: float
    logprobs: bool  # judge by log-probs (processed weights shift logits by a constant)
    atol: float = ATOL
    rtol: float = RTOL
    logits_atol: float = LOGITS_ATOL
    only_ours: list[str] = field(default_factory=list)
    only_reference: list[str] = field(default_factory=list)

    @property
    def logits_ok(self) -> bool:
        """Whether the logits (or log-probs, with `logprobs`) agree within `logits_atol`."""
        value = self.logprobs_max_abs if self.logprobs else self.logits_max_abs
        return value <= self.logits_atol

    @property
    def passed(self) -> bool:
        """Whether the logits and every compared hook agree within their tolerances."""
        return self.logits_ok and all(r.ok for r in self.rows) and bool(self.rows or self.logits_ok)

    @property
    def failures(self) -> list[HookDiff]:
        """The hooks whose difference is over their tolerance."""
        return [r for r in self.rows if not r.ok]

    def families(self) -> dict[str, float]:
        """The largest absolute difference per hook family (the name with its layer removed)."""
        out: dict[str, float] = {}
        for r in self.rows:
            fam = re.sub(r"^blocks\.\d+\.", "blocks.*.", r.name)
            out[fam] = max(out.get(fam, 0.0), r.max_abs)
        return out

    def table(self, per_layer: bool = True) -> str:
        """The report as a text table: one row per hook, or per hook family with `per_layer=False`."""

        def family(f: str) -> list[HookDiff]:
            return [r for r in self.rows if re.sub(r"^blocks\.\d+\.", "blocks.*.", r.name) == f]

        rows = (
            self.rows
            if per_layer
            else [  # a family's hooks have one shape in every layer: the first one's is shown
                HookDiff(
                    f,
                    family(f)[0].shape,
                    v,
                    max(r.max_rel for r in family(f)),
                    all(r.ok for r in family(f)),
                )
                for f, v in self.families().items()
            ]
        )
        width = max([len(r.name) for r in rows] + [10])
        lines = [
            f"interp_gpt vs {self.reference}  (tolerance: atol {self.atol:g} + rtol {self.rtol:g} * |ref|)",
            f"{'hook':<{width}}  {'shape':<20} {'max |diff|':>11} {'max rel':>10}  ok",
        ]
        for r in rows:
            shape = "x".join(map(str, r.shape)) if r.shape else ""
            lines.append(
                f"{r.name:<{width}}  {shape:<20} {r.max_abs:>11.3e} {r.max_rel:>10.3e}  "
                f"{'yes' if r.ok else 'NO'}{'  ' + r.note if r.note else ''}"
            )
        which = "log-probs" if self.logprobs else "logits"
        lines.append(
            f"logits max |diff| {self.logits_max_abs:.3e}; log-probs max |diff| {self.logprobs_max_abs:.3e} "
            f"(judged on {which}, tolerance {self.logits_atol:g}): {'ok' if self.logits_ok else 'NO'}"
        )
        if self.only_ours or self.only_reference:
            lines.append(f"hooks only we expose: {len(self.only_ours)}; only the reference: {len(self.only_reference)}")
        lines.append(
            f"{len(self.rows)} shared hooks, {len(self.failures)} outside tolerance -> "
            f"{'PASS' if self.passed else 'FAIL'}"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table(per_layer=True)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (what `interp-gpt compare --json` prints)."""
        return {
            "reference": self.reference,
            "passed": self.passed,
            "logits_max_abs": self.logits_max_abs,
            "logprobs_max_abs": self.logprobs_max_abs,
            "families": self.families(),
            "hooks": {r.name: {"max_abs": r.max_abs, "max_rel": r.max_rel, "ok": r.ok} for r in self.rows},
        }


def diff_tensors(ours: Tensor, ref: Tensor, atol: float = ATOL, rtol: float = RTOL) -> tuple[float, float, bool, str]:
    """(max abs diff, max relative diff, within tolerance, note). Equal infinities count as equal."""
    if tuple(ours.shape) != tuple(ref.shape):
        return (
            float("inf"),
            float("inf"),
            False,
            f"shapes differ: ours {tuple(ours.shape)}, reference {tuple(ref.shape)}",
        )
    a, b = ours.detach().double().cpu(), ref.detach().double().cpu()
    same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    if bool(((~torch.isfinite(a)) ^ (~torch.isfinite(b))).any()) or bool(torch.isnan(a).any() or torch.isnan(b).any()):
        return float("inf"), float("inf"), False, "non-finite values differ"
    err = torch.where(same_inf, 0.0, (a - b).abs())
    bound = atol + rtol * torch.where(same_inf, 0.0, b.abs())
    rel = err / torch.where(same_inf, 1.0, b.abs()).clamp_min(atol)
    return (
        float(err.max()) if err.numel() else 0.0,
        float(rel.max()) if rel.numel() else 0.0,
        bool((err <= bound).all()),
        "",
    )


# ----------------------------------------------------------------------------
# Running the references
# ----------------------------------------------------------------------------
def _is_transformers_model(obj: Any) -> bool:
    # transformer-lens 4's bridge also carries a .config; only HF models lack run_with_cache.
    return (
        hasattr(obj, "config")
        and getattr(obj.config, "model_type", None) is not None
        and hasattr(obj, "transformer")
        and not hasattr(obj, "run_with_cache")
    )


def _reference_name(ref: Any) -> str:
    if _is_transformers_model(ref):
        import transformers

        return f"Hugging Face transformers {transformers.__version__} ({type(ref).__name__})"
    return f"transformer-lens {transformer_lens_version()} ({type(ref).__name__})"


def _run_transformers(ref: Any, tokens: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Logits and the activations we can name, read with forward hooks on HF's modules."""
    acts: dict[str, Tensor] = {}
    handles = []
    t = ref.transformer

    def out_hook(name: str, index: int | None = None):  # noqa: ANN202
        def fn(module, inputs, output):  # noqa: ANN001, ANN202
            acts[name] = (output[0] if isinstance(output, tuple) else output).detach()

        return fn

    def in_hook(name: str):  # noqa: ANN202
        def fn(module, inputs):  # noqa: ANN001, ANN202
            acts[name] = inputs[0].detach()

        return fn

    try:
        handles.append(t.wte.register_forward_hook(out_hook("hook_embed")))
        handles.append(t.wpe.register_forward_hook(out_hook("hook_pos_embed")))
        for L, block in enumerate(t.h):
            p = f"blocks.{L}."
            handles.append(block.ln_1.register_forward_pre_hook(in_hook(p + "hook_resid_pre")))
            handles.append(block.attn.register_forward_hook(out_hook(p + "hook_attn_out")))
            handles.append(block.ln_2.register_forward_pre_hook(in_hook(p + "hook_resid_mid")))
            handles.append(block.mlp.c_fc.register_forward_hook(out_hook(p + "mlp.hook_pre")))
            handles.append(block.mlp.c_proj.register_forward_pre_hook(in_hook(p + "mlp.hook_post")))
            handles.append(block.mlp.register_forward_hook(out_hook(p + "hook_mlp_out")))
            handles.append(block.register_forward_hook(out_hook(p + "hook_resid_post")))
        with torch.no_grad():
            logits = ref(tokens).logits
    finally:
        for h in handles:
            h.remove()
    # HF adds wpe as [1, pos, d]; ours is per batch row.
    acts["hook_pos_embed"] = acts["hook_pos_embed"].expand(tokens.shape[0], -1, -1)
    return logits, acts


def _run_transformer_lens(ref: Any, tokens: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    with torch.no_grad():
        logits, cache = ref.run_with_cache(tokens)
    acts = {k: cache[k] for k in cache.keys()}
    return logits, acts


def compare(
    model: GPT,
    reference: Any,
    input: Any = None,
    *,
    atol: float = ATOL,
    rtol: float = RTOL,
    logits_atol: float = LOGITS_ATOL,
    logprobs: bool | None = None,
) -> ComparisonReport:
    """Run `model` and `reference` on the same tokens and compare every shared hook.

    `reference`: a transformer-lens HookedTransformer / TransformerBridge (compatibility
    mode), or a `transformers` GPT-2 model. `input`: a string, list of strings or tokens
    (default: a fixed random sequence). `logprobs`: judge logits by log-probs (default:
    when our weights are processed, since center_unembed shifts every logit of a row).

    Example (needs transformer-lens, the `compare` extra; `tl_model` a HookedTransformer of the same weights):
        >>> report = compare(model, tl_model, "The cat sat on the mat")
        >>> print(report); report.passed
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model: expected an interp_gpt GPT, got {type(model).__name__}")
    tokens = _tokens_for(model, input)
    if _is_transformers_model(reference):
        ref_logits, ref_acts = _run_transformers(reference, tokens)
        if model.cfg.normalization_type != "LN":
            # Processed weights change the residual stream by design: only log-probs compare.
            ref_acts = {}
    elif hasattr(reference, "run_with_cache"):
        ref_logits, ref_acts = _run_transformer_lens(reference, tokens)
    else:
        raise TypeError(
            "reference: expected a transformer-lens model (HookedTransformer or TransformerBridge) "
            f"or a transformers GPT-2 model, got {type(reference).__name__}"
        )
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    shared = [n for n in cache.keys() if n in ref_acts]
    rows = []
    for name in shared:
        max_abs, max_rel, ok, note = diff_tensors(cache[name], ref_acts[name], atol, rtol)
        rows.append(HookDiff(name, tuple(cache[name].shape), max_abs, max_rel, ok, note))
    ref_logits = ref_logits.to(logits.device)
    if logprobs is None:
        logprobs = model.cfg.normalization_type != "LN"
    return ComparisonReport(
        reference=_reference_name(reference),
        rows=rows,
        logits_max_abs=float((logits.double() - ref_logits.double()).abs().max()),
        logprobs_max_abs=float((logits.double().log_softmax(-1) - ref_logits.double().log_softmax(-1)).abs().max()),
        logprobs=logprobs,
        atol=atol,
        rtol=rtol,
        logits_atol=logits_atol,
        only_ours=[n for n in cache.keys() if n not in ref_acts],
        only_reference=[n for n in ref_acts if n not in cache.cache_dict],
    )


def _tokens_for(model: GPT, input: Any) -> Tensor:
    if input is None:
        gen = torch.Generator().manual_seed(0)
        n = min(model.cfg.n_ctx, 24)
        return torch.randint(0, model.cfg.d_vocab, (2, n), generator=gen).to(model.W_E.device)
    if isinstance(input, (str, list)):
        return model.to_tokens(input)
    return model._check_tokens(input)


# ----------------------------------------------------------------------------
# Building the references from the same checkpoint, offline
# ----------------------------------------------------------------------------
def to_transformers(source: Any) -> Any:
    """A `transformers.GPT2LMHeadModel` holding the same (unprocessed) weights as `source`.

    A local folder is read by transformers itself (an independent reading of the
    checkpoint); any other source goes through our loader and back to HF's layout.
    """
    import transformers

    from .loading import resolve_shipped

    source = resolve_shipped(source)
    if _is_transformers_model(source):
        return copy.deepcopy(source).eval()  # a copy: transformer-lens 4 rewrites the model it wraps
    if isinstance(source, (str, Path)) and Path(source).is_dir() and (Path(source) / "config.json").exists():
        return transformers.GPT2LMHeadModel.from_pretrained(str(source)).eval()
    from .loading import convert_to_hf_gpt2_state_dict, from_pretrained_no_processing

    ours = from_pretrained_no_processing(source, tokenizer=None)
    cfg = ours.cfg
    hf_cfg = transformers.GPT2Config(  # type: ignore[call-arg]  # n_ctx: older releases read it
        n_layer=cfg.n_layers,
        n_embd=cfg.d_model,
        n_head=cfg.n_heads,
        n_inner=cfg.d_mlp,
        vocab_size=cfg.d_vocab,
        n_positions=cfg.n_ctx,
        n_ctx=cfg.n_ctx,
        activation_function=cfg.act_fn,
        layer_norm_epsilon=cfg.layer_norm_eps,
        tie_word_embeddings=False,
    )
    hf = transformers.GPT2LMHeadModel(hf_cfg)
    hf.load_state_dict(convert_to_hf_gpt2_state_dict(ours), strict=False)
    return hf.eval()


def transformer_lens_version() -> str:
    from importlib.metadata import version

    return version("transformer-lens")


def transformer_lens_major() -> int:
    return int(transformer_lens_version().split(".")[0])


def to_transformer_lens(source: Any, processed: bool = True) -> Any:
    """A transformer-lens model with `source`'s weights, built offline.

    transformer-lens 3.x: a `HookedTransformer` from an explicit config and
    `convert_gpt2_weights`; 4.x: a `TransformerBridge` in compatibility mode.
    `processed` applies fold_ln, center_writing_weights, center_unembed, fold_value_biases.
    """
    from .loading import resolve_shipped

    source = resolve_shipped(source)
    hf = to_transformers(source)
    if transformer_lens_major() < 4:
        return _hooked_transformer(hf, processed)
    return _bridge(hf, processed, _own_tokenizer(source))


def _own_tokenizer(source: Any) -> Any:
    """The tokenizer saved beside a checkpoint by `Tokenizer.save` (the shipped models have
    one), so a reference built from it tokenizes text as our model does; else None."""
    from .tokenizer.bpe import saved_tokenizer

    if not isinstance(source, (str, os.PathLike)):
        return None
    folder = Path(source).expanduser()
    return saved_tokenizer(folder.parent if folder.is_file() else folder)


def _hooked_transformer(hf: Any, processed: bool) -> Any:
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf.config
    tl_cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_heads=c.n_head,
        d_head=c.n_embd // c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd,
        d_vocab=c.vocab_size,
        n_ctx=c.n_positions,
        act_fn=c.activation_function,
        eps=c.layer_norm_epsilon,
        normalization_type="LN",
        default_prepend_bos=True,
        original_architecture="GPT2LMHeadModel",
    )
    tl = HookedTransformer(tl_cfg)
    tl.load_and_process_state_dict(
        convert_gpt2_weights(hf, tl_cfg),
        fold_ln=processed,
        center_writing_weights=processed,
        center_unembed=processed,
        fold_value_biases=processed,
    )
    return tl.eval()


def _bridge(hf: Any, processed: bool, tokenizer: Any = None) -> Any:
    """transformer-lens 4.x: a TransformerBridge around `hf`, in compatibility mode.

    The bridge insists on a tokenizer and would fetch one from the hub by name, so we
    hand it ours (wrapped for transformers): `tokenizer` (an interp_gpt Tokenizer) when
    given, else GPT-2's. It rewrites `hf` in place, so `hf` must be a model nobody else holds.
    """
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(
        "interp_gpt-reference", hf_model=hf, tokenizer=_hf_tokenizer(hf.config.vocab_size, tokenizer), device="cpu"
    ).eval()
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=not processed)
    return bridge


def _hf_tokenizer(d_vocab: int, ours: Any = None) -> Any:
    """A transformers tokenizer for the bridge: `ours` (the model's own) when it fits the
    vocabulary, else GPT-2's BPE for a GPT-2 vocabulary when we have its files, else a
    placeholder word-level vocabulary of the right size (the comparison feeds token ids)."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    from .tokenizer.bpe import gpt2_tokenizer

    try:
        if ours is not None and ours.vocab_size == d_vocab:
            backend = ours.backend
        elif d_vocab == 50257:
            backend = gpt2_tokenizer(allow_hub=False).backend
        else:
            raise OSError("no tokenizer of this vocabulary")
    except OSError:
        vocab = {f"t{i}": i for i in range(d_vocab - 1)} | {"<|endoftext|>": d_vocab - 1}
        backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<|endoftext|>"))
        backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        add_bos_token=True,
    )
    tok.init_kwargs["name_or_path"] = "interp_gpt-reference"  # the bridge reads it
    return tok


def compare_with_transformer_lens(
    source: Any, input: Any = None, processed: bool = True, **kwargs: Any
) -> ComparisonReport:
    """Load `source` into both interp_gpt and transformer-lens (offline for local checkpoints)
    and compare every hook.

    Example (needs transformer-lens, the `compare` extra; "./my-gpt2" a checkpoint folder):
        >>> print(compare_with_transformer_lens("./my-gpt2", "Hello world"))
    """
    from .loading import from_pretrained, from_pretrained_no_processing

    ours = (from_pretrained if processed else from_pretrained_no_processing)(source)
    return compare(ours, to_transformer_lens(source, processed), input, **kwargs)


def compare_with_huggingface(source: Any, input: Any = None, **kwargs: Any) -> ComparisonReport:
    """Load `source` unprocessed into interp_gpt and transformers and compare logits and hooks."""
    from .loading import from_pretrained_no_processing

    return compare(from_pretrained_no_processing(source), to_transformers(source), input, **kwargs)
