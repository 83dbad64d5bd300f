"""Checkpoint layouts: Hugging Face GPT-2 configs and tensors <-> our `Config` and state dict
(= transformer-lens'), and `load_source`, which reads any supported source into them."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import einops
import torch
from torch import Tensor

from ..config import ACT_FNS, Config
from .sources import (
    HF_BUFFER,
    CheckpointError,
    FileReader,
    download_checkpoint,
    looks_like_path,
    read_folder,
    read_json_object,
    read_weights_file,
    shipped_models,
)

if TYPE_CHECKING:
    from ..model.gpt import GPT

__all__ = [
    "config_from_hf",
    "config_from_transformer_lens",
    "convert_hf_gpt2_state_dict",
    "convert_to_hf_gpt2_state_dict",
    "raise_if_bad",
    "load_source",
]


# ----------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------
_MISSING = object()


def _field(hf: Mapping[str, Any], key: str, where: str, default: Any = _MISSING, fallback: str | None = None) -> Any:
    value = hf.get(key) if key in hf or default is _MISSING else default
    if value is None and fallback is not None and hf.get(fallback) is not None:
        value = hf[fallback]  # older configs name the context length n_ctx
    if value is None and default is _MISSING:
        raise CheckpointError(f"{where}: missing GPT-2 field {key!r}")
    return value


def _positive_int(hf: Mapping[str, Any], key: str, where: str, **kw: Any) -> int:
    value = _field(hf, key, where, **kw)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{where}: {key}={value!r}, expected a positive integer")
    return value


def _number(hf: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = _field(hf, key, where, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CheckpointError(f"{where}: {key}={value!r}, expected a finite number >= 0")
    return float(value)


def config_from_hf(hf: Mapping[str, Any], name: str = "custom") -> Config:
    """A `Config` from a Hugging Face GPT-2 `config.json` (any size, not only the presets).

    Every field the loader uses is checked (positive integers, a finite eps >= 0, a known
    activation): a nonsense value is a `CheckpointError` naming the field, never read as another.
    """
    if not isinstance(hf, Mapping):
        raise CheckpointError(f"config.json of {name!r}: expected a JSON object, got {type(hf).__name__}")
    where = f"config.json of {name!r}" if name != "custom" else "config.json"
    model_type = hf.get("model_type")
    archs = hf.get("architectures") or []
    if model_type != "gpt2" and not any(str(a).startswith("GPT2") for a in archs):
        raise CheckpointError(
            f"config.json: model_type={model_type!r}, architectures={archs}: not a GPT-2 checkpoint "
            "(interp_gpt loads model_type 'gpt2' only)"
        )
    # Variants of GPT-2's attention we do not implement: refuse rather than compute wrongly.
    for key, plain in (("scale_attn_by_inverse_layer_idx", False), ("scale_attn_weights", True)):
        if bool(hf.get(key, plain)) != plain:
            raise CheckpointError(
                f"config.json: {key}={hf[key]!r} is not supported (GPT-2 uses {plain}); "
                "its attention scaling differs from GPT-2's"
            )
    d_model, n_heads = _positive_int(hf, "n_embd", where), _positive_int(hf, "n_head", where)
    if d_model % n_heads:
        raise CheckpointError(f"{where}: n_embd={d_model} is not divisible by n_head={n_heads}")
    act = hf.get("activation_function", "gelu_new")
    act = "gelu_new" if act == "gelu_pytorch_tanh" else act  # the same function
    if act not in ACT_FNS:
        raise CheckpointError(f"{where}: activation_function={act!r}, expected one of {ACT_FNS}")
    return Config(
        n_layers=_positive_int(hf, "n_layer", where),
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=4 * d_model if hf.get("n_inner") is None else _positive_int(hf, "n_inner", where),
        d_vocab=_positive_int(hf, "vocab_size", where),
        n_ctx=_positive_int(hf, "n_positions", where, fallback="n_ctx"),
        act_fn=act,
        layer_norm_eps=_number(hf, "layer_norm_epsilon", where, 1e-5),
        init_range=_number(hf, "initializer_range", where, 0.02),
        model_name=name,
    )


def _config_from_hf_tensors(sd: Mapping[str, Tensor], name: str) -> Config:
    """Infer a config from GPT-2 tensors alone (no config.json): GPT-2 always has d_head 64."""
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    if "wte.weight" not in sd:
        raise CheckpointError(f"{name}: no 'wte.weight' tensor: not a GPT-2 state dict (keys: {sorted(sd)[:8]} ...)")
    d_vocab, d_model = sd["wte.weight"].shape
    layers = {int(m.group(1)) for k in sd if (m := re.match(r"h\.(\d+)\.", k))}
    if d_model % 64:
        raise CheckpointError(
            f"{name}: d_model={d_model} is not a multiple of 64; pass config= (n_heads cannot be inferred)"
        )
    return Config(
        n_layers=len(layers),
        d_model=d_model,
        n_heads=d_model // 64,
        d_vocab=d_vocab,
        n_ctx=sd["wpe.weight"].shape[0],
        d_mlp=sd["h.0.mlp.c_fc.weight"].shape[1] if layers else 4 * d_model,
        model_name=name,
    )


def _config_from_tl_state_dict(sd: Mapping[str, Tensor], name: str) -> Config:
    if any(k.startswith("blocks.") for k in sd) and not any(".mlp." in k for k in sd):
        raise CheckpointError(
            f"{name}: a transformer-lens state dict without MLP weights (an attn_only model): its "
            "normalization_type and positional_embedding_type cannot be told from the tensors; pass config= "
            "(a Config, or the model's HookedTransformerConfig)"
        )
    needed = ["embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_Q", "blocks.0.mlp.W_in"]
    raise_if_bad(name, [k for k in needed if k not in sd], [], [])
    d_vocab, d_model = sd["embed.W_E"].shape
    n_heads, _, d_head = sd["blocks.0.attn.W_Q"].shape
    layers = {int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))}
    return Config(
        n_layers=len(layers),
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=sd["blocks.0.mlp.W_in"].shape[1],
        d_vocab=d_vocab,
        n_ctx=sd["pos_embed.W_pos"].shape[0],
        normalization_type="LN" if "blocks.0.ln1.w" in sd else "LNPre",
        model_name=name,
    )


# transformer-lens config fields our model has no equivalent for, and the value it needs.
_TL_FIXED = {
    "parallel_attn_mlp": False,
    "final_rms": False,
    "gated_mlp": False,
    "use_local_attn": False,
    "n_key_value_heads": None,
    "use_attn_scale": True,
    "scale_attn_by_inverse_layer_idx": False,
    "use_normalization_before_and_after": False,
    "output_logits_soft_cap": -1.0,
}
# Its fields ours shares by name (the toy-model fields, the opt-in hook points, the tokenizer's).
_TL_SHARED = (
    "attn_only",
    "positional_embedding_type",
    "use_attn_result",
    "use_split_qkv_input",
    "use_attn_in",
    "use_hook_mlp_in",
    "use_hook_tokens",
    "tokenizer_name",
    "default_prepend_bos",
)


def config_from_transformer_lens(tl_cfg: Any) -> Config:
    """Our `Config` for a transformer-lens `HookedTransformerConfig` (or a bridge's cfg) of a
    GPT-2-style model, including ARENA's toy models (attn_only, normalization_type None,
    shortformer). A field with no equivalent here (rotary, a gated MLP ...) is refused by name.

    Example:
        >>> tl_cfg = HookedTransformerConfig(d_model=768, d_head=64, n_heads=12, n_layers=2, n_ctx=2048,
        ...     d_vocab=50278, attn_only=True, normalization_type=None, positional_embedding_type="shortformer")
        >>> model = GPT(config_from_transformer_lens(tl_cfg)); model.load_state_dict(tl_state_dict, strict=True)
    """
    for attr, want in _TL_FIXED.items():
        got = getattr(tl_cfg, attr, want)
        if got != want:
            raise CheckpointError(f"transformer-lens config: cfg.{attr}={got!r}; interp_gpt supports only {want!r}")
    d_vocab_out = getattr(tl_cfg, "d_vocab_out", tl_cfg.d_vocab)
    if d_vocab_out not in (-1, tl_cfg.d_vocab):
        raise CheckpointError(f"transformer-lens config: d_vocab_out={d_vocab_out} != d_vocab={tl_cfg.d_vocab}")
    shared = {f: getattr(tl_cfg, f) for f in _TL_SHARED if hasattr(tl_cfg, f)}
    attn_only = bool(shared.get("attn_only", False))
    try:
        return Config(
            n_layers=tl_cfg.n_layers,
            d_model=tl_cfg.d_model,
            n_heads=tl_cfg.n_heads,
            d_head=tl_cfg.d_head,
            # An attention-only model has neither: TL leaves them None (d_mlp then only sizes nothing).
            d_mlp=-1 if attn_only and not tl_cfg.d_mlp else tl_cfg.d_mlp,
            act_fn="gelu_new" if attn_only and tl_cfg.act_fn is None else tl_cfg.act_fn,
            d_vocab=tl_cfg.d_vocab,
            n_ctx=tl_cfg.n_ctx,
            layer_norm_eps=tl_cfg.eps,
            normalization_type=tl_cfg.normalization_type,
            model_name=getattr(tl_cfg, "model_name", "custom"),
            **shared,
        )
    except ValueError as e:
        raise CheckpointError(f"transformer-lens config: {e}") from None


_config_from_tl_cfg = config_from_transformer_lens


# ----------------------------------------------------------------------------
# Hugging Face layout <-> ours
# ----------------------------------------------------------------------------
def convert_hf_gpt2_state_dict(
    hf_sd: Mapping[str, Tensor],
    cfg: Config,
    *,
    owned: bool = False,
    reader: FileReader | None = None,
) -> dict[str, Tensor]:
    """Rename and reshape a Hugging Face GPT-2 state dict into ours (= transformer-lens').

    GPT-2 stores c_attn, c_proj and c_fc as Conv1D, whose weight is [in, out]: the
    transpose of nn.Linear's. That is the layout our W matrices use, so they are
    only split per head, never transposed. lm_head is an nn.Linear ([d_vocab, d_model]),
    so W_U is its transpose. Every result is contiguous.

    `owned`: the tensors are the caller's to give away (freshly read from a file), so the
    result may be them; otherwise every result is a copy, and editing the loaded model never
    edits the source. W_U never shares memory with W_E: GPT-2 ties them, and a tied copy
    would make an edit of one an edit of both. With a `reader` of the files the tensors were
    read from, the two tensors that must be copied (c_attn, split into W_Q/W_K/W_V, and W_U)
    are copied out of maps of their own, so the file's pages are not also left resident.
    """
    _refuse_toy(cfg, "a Hugging Face GPT-2 checkpoint")
    sd = {k.removeprefix("transformer."): v for k, v in hf_sd.items() if not HF_BUFFER.search(k)}
    h, dh, d, dm, V = cfg.n_heads, cfg.d_head, cfg.d_model, cfg.d_mlp, cfg.d_vocab
    missing: list[str] = []
    misshaped: list[str] = []

    def take(key: str, shape: tuple[int, ...]) -> Tensor:
        # A missing or mis-shaped tensor is listed, and stands in as a "meta" tensor (no memory):
        # a config that lies about a size must not make us allocate what it claims.
        t = sd.pop(key, None)
        if t is None:
            missing.append(key)
            return torch.empty(shape, device="meta")
        if tuple(t.shape) != shape:
            misshaped.append(f"{key}: {tuple(t.shape)}, expected {shape}")
            return torch.empty(shape, device="meta")
        return t.detach() if owned else t.detach().clone()

    out: dict[str, Tensor] = {
        "embed.W_E": take("wte.weight", (V, d)),
        "pos_embed.W_pos": take("wpe.weight", (cfg.n_ctx, d)),
    }
    for L in range(cfg.n_layers):
        p, q = f"h.{L}.", f"blocks.{L}."
        out[q + "ln1.w"], out[q + "ln1.b"] = take(p + "ln_1.weight", (d,)), take(p + "ln_1.bias", (d,))
        # [d_model, q|k|v]; split per head, so copied (contiguous), from a map of its own if it can
        W_qkv = take(p + "attn.c_attn.weight", (d, 3 * h * dh))
        if owned and reader is not None and (mapped := reader.get(p + "attn.c_attn.weight")) is not None:
            W_qkv = mapped if mapped.shape == W_qkv.shape else W_qkv
        b_qkv = take(p + "attn.c_attn.bias", (3 * h * dh,))
        for X, W, b in zip("QKV", W_qkv.split(h * dh, dim=1), b_qkv.split(h * dh), strict=True):
            W = einops.rearrange(W, "d_model (n_heads d_head) -> n_heads d_model d_head", n_heads=h)
            out[q + f"attn.W_{X}"] = W.clone(memory_format=torch.contiguous_format)
            out[q + f"attn.b_{X}"] = einops.rearrange(b, "(n_heads d_head) -> n_heads d_head", n_heads=h).clone()
        del W_qkv
        W_O = take(p + "attn.c_proj.weight", (h * dh, d))
        out[q + "attn.W_O"] = einops.rearrange(W_O, "(n_heads d_head) d_model -> n_heads d_head d_model", n_heads=h)
        out[q + "attn.b_O"] = take(p + "attn.c_proj.bias", (d,))
        out[q + "ln2.w"], out[q + "ln2.b"] = take(p + "ln_2.weight", (d,)), take(p + "ln_2.bias", (d,))
        out[q + "mlp.W_in"], out[q + "mlp.b_in"] = (
            take(p + "mlp.c_fc.weight", (d, dm)),
            take(p + "mlp.c_fc.bias", (dm,)),
        )
        out[q + "mlp.W_out"], out[q + "mlp.b_out"] = (
            take(p + "mlp.c_proj.weight", (dm, d)),
            take(p + "mlp.c_proj.bias", (d,)),
        )
    out["ln_final.w"], out["ln_final.b"] = take("ln_f.weight", (d,)), take("ln_f.bias", (d,))
    lm_head = sd.pop("lm_head.weight", None)  # GPT-2 ties it to wte; checkpoints often omit it
    if lm_head is not None and tuple(lm_head.shape) != (V, d):
        misshaped.append(f"lm_head.weight: {tuple(lm_head.shape)}, expected {(V, d)}")
    raise_if_bad(cfg.model_name, missing, sorted(sd), misshaped)  # before W_U and b_U take memory
    W_E = out["embed.W_E"]
    source = "lm_head.weight" if lm_head is not None else "wte.weight"
    W_U = reader.transposed(source) if (owned and reader is not None) else None
    if W_U is None or tuple(W_U.shape) != (d, V):
        W_U = (W_E if lm_head is None else lm_head.detach()).T.clone(memory_format=torch.contiguous_format)
    out["unembed.W_U"] = W_U
    out["unembed.b_U"] = torch.zeros(V, dtype=W_E.dtype)
    return out


def convert_to_hf_gpt2_state_dict(model: GPT) -> dict[str, Tensor]:
    """Our (unprocessed) weights in Hugging Face GPT-2's layout: the inverse of the above."""
    _refuse_toy(model.cfg, "Hugging Face's GPT-2 layout")
    if model.cfg.normalization_type != "LN":
        raise ValueError(
            "convert_to_hf_gpt2_state_dict: the model's LayerNorm weights were folded; load it with from_pretrained_no_processing"
        )
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    b_U = sd["unembed.b_U"]
    if not bool((b_U == b_U[0]).all()):
        raise ValueError(
            "convert_to_hf_gpt2_state_dict: unembed.b_U is not constant, and Hugging Face's GPT-2 "
            "lm_head has no bias: saving would change the logits"
        )
    out = {"transformer.wte.weight": sd["embed.W_E"], "transformer.wpe.weight": sd["pos_embed.W_pos"]}
    for L in range(model.cfg.n_layers):
        p, q = f"transformer.h.{L}.", f"blocks.{L}."
        out[p + "ln_1.weight"], out[p + "ln_1.bias"] = sd[q + "ln1.w"], sd[q + "ln1.b"]
        out[p + "attn.c_attn.weight"] = torch.cat(
            [
                einops.rearrange(sd[q + f"attn.W_{X}"], "n_heads d_model d_head -> d_model (n_heads d_head)")
                for X in "QKV"
            ],
            dim=1,
        )
        out[p + "attn.c_attn.bias"] = torch.cat([sd[q + f"attn.b_{X}"].flatten() for X in "QKV"])
        out[p + "attn.c_proj.weight"] = einops.rearrange(
            sd[q + "attn.W_O"], "n_heads d_head d_model -> (n_heads d_head) d_model"
        )
        out[p + "attn.c_proj.bias"] = sd[q + "attn.b_O"]
        out[p + "ln_2.weight"], out[p + "ln_2.bias"] = sd[q + "ln2.w"], sd[q + "ln2.b"]
        out[p + "mlp.c_fc.weight"], out[p + "mlp.c_fc.bias"] = sd[q + "mlp.W_in"], sd[q + "mlp.b_in"]
        out[p + "mlp.c_proj.weight"], out[p + "mlp.c_proj.bias"] = sd[q + "mlp.W_out"], sd[q + "mlp.b_out"]
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = sd["ln_final.w"], sd["ln_final.b"]
    out["lm_head.weight"] = sd["unembed.W_U"].T
    return {k: v.contiguous().clone() for k, v in out.items()}


def _refuse_toy(cfg: Config, what: str) -> None:
    """Hugging Face's GPT-2 has MLPs, LayerNorms and position embeddings in the residual stream."""
    toy = {"attn_only": True, "normalization_type": None, "positional_embedding_type": "shortformer"}
    bad = [f"{k}={getattr(cfg, k)!r}" for k, v in toy.items() if getattr(cfg, k) == v]
    if bad:
        raise CheckpointError(f"{what} cannot hold a model with {', '.join(bad)} (a transformer-lens toy model)")


def raise_if_bad(name: str, missing: list[str], unexpected: list[str], misshaped: list[str]) -> None:
    if not (missing or unexpected or misshaped):
        return
    lines = [f"checkpoint {name!r} does not fit the model:"]
    for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshaped)):
        if items:
            shown = items[:10] + ([f"... ({len(items)} in all)"] if len(items) > 10 else [])
            lines.append(f"  {label} tensors: " + ", ".join(shown))
    raise CheckpointError("\n".join(lines))


# ----------------------------------------------------------------------------
# Any source -> (config, our state dict)
# ----------------------------------------------------------------------------
def load_source(source: Any, config: Config | None = None) -> tuple[Config, dict[str, Tensor], Path | None]:
    """Read any supported source into (config, our state dict, folder with tokenizer files or None).

    The state dict's tensors are the caller's to edit in place: weights read from a file
    (private memory maps, see read_weights_file) or copies, never the memory of a model
    object or state dict passed in.
    """
    folder: Path | None = None
    files: list[Path] = []
    hf_config: Mapping[str, Any] | None = None
    name = "custom"
    if config is not None and not isinstance(config, Config):
        if not hasattr(config, "positional_embedding_type"):
            raise TypeError(f"config: expected a Config or a HookedTransformerConfig, got {type(config).__name__}")
        config = config_from_transformer_lens(config)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source).expanduser()
        name = str(source)
        if path.is_dir():
            folder = path
            weights, hf_config, files = read_folder(path)
        elif path.is_file():
            weights, files = read_weights_file(path)
            cfg_path = path.parent / "config.json"
            hf_config = read_json_object(cfg_path) if cfg_path.exists() and path.suffix != ".json" else None
            folder = path.parent
        elif isinstance(source, str) and source in shipped_models():
            folder = shipped_models()[source]
            weights, hf_config, files = read_folder(folder)
        elif isinstance(source, str) and not looks_like_path(source):
            folder = download_checkpoint(source)
            weights, hf_config, files = read_folder(folder)
        else:
            raise FileNotFoundError(f"source: no file or folder at {str(source)!r}")
    elif hasattr(source, "cfg") and hasattr(source, "tl_parameters"):  # transformer-lens 4.x TransformerBridge
        # Its own state dict is in HF's layout; tl_parameters() is the TL-layout view. After
        # processing it keeps LN weights of 1 and biases of 0, which compute the same as LNPre.
        cfg = _config_from_tl_cfg(source.cfg)
        params = {k: v.detach() for k, v in source.tl_parameters().items()}
        if cfg.attn_only:  # 4.3's tl_parameters() lists zero MLP weights that its attention-only model never uses
            params = {k: v for k, v in params.items() if ".mlp." not in k}
        return cfg, _tl_state_dict(params, cfg), None
    elif hasattr(source, "config") and hasattr(source, "state_dict") and hasattr(source.config, "to_dict"):
        hf_config = source.config.to_dict()  # a transformers model
        name = getattr(source.config, "_name_or_path", None) or "transformers-model"
        weights = source.state_dict()
    elif hasattr(source, "cfg") and hasattr(source, "state_dict"):  # a transformer-lens HookedTransformer
        cfg = _config_from_tl_cfg(source.cfg)
        return cfg, _tl_state_dict(source.state_dict(), cfg), None
    elif isinstance(source, Mapping):
        weights = dict(source)
    else:
        raise TypeError(
            "source: expected a hub id, a path, a transformers GPT-2 model, a transformer-lens model "
            f"or a state dict; got {type(source).__name__}"
        )

    if "embed.W_E" in weights:  # already in transformer-lens' layout
        cfg = dataclasses.replace(config) if config else _config_from_tl_state_dict(weights, name)
        return cfg, _tl_state_dict(weights, cfg), folder
    if config is not None:
        cfg = dataclasses.replace(config)  # processing edits cfg; never the caller's
    elif hf_config is not None:
        cfg = config_from_hf(hf_config, name)
    else:
        cfg = _config_from_hf_tensors(weights, name)
    cfg.model_name = name if cfg.model_name == "custom" else cfg.model_name
    # Tensors read from a file are ours alone (files is empty for every other source).
    return cfg, convert_hf_gpt2_state_dict(weights, cfg, owned=bool(files), reader=FileReader(files)), folder


def _tl_state_dict(sd: Mapping[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """Check a transformer-lens layout state dict against cfg; drop its non-weight buffers."""
    sd = {k: v for k, v in sd.items() if not re.search(r"\.attn\.(IGNORE|mask)$", k)}
    expected = _expected_shapes(cfg)
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    misshaped = [
        f"{k}: {tuple(sd[k].shape)}, expected {s}" for k, s in expected.items() if k in sd and tuple(sd[k].shape) != s
    ]
    raise_if_bad(cfg.model_name, missing, unexpected, misshaped)
    return {k: v.detach().clone() for k, v in sd.items()}


def _expected_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape for `cfg`, as model.py declares them (tests/test_loading.py checks they agree)."""
    h, d, dh, dm = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp
    ln = cfg.normalization_type == "LN"  # LNPre (after fold_ln) and None have no parameters
    mlp = not cfg.attn_only
    shapes: dict[str, tuple[int, ...]] = {"embed.W_E": (cfg.d_vocab, d), "pos_embed.W_pos": (cfg.n_ctx, d)}
    for L in range(cfg.n_layers):
        q = f"blocks.{L}."
        shapes.update({q + f"{n}.{p}": (d,) for n in ("ln1", "ln2") for p in ("w", "b") if ln and (mlp or n == "ln1")})
        shapes.update({q + f"attn.W_{X}": (h, d, dh) for X in "QKV"} | {q + f"attn.b_{X}": (h, dh) for X in "QKV"})
        shapes.update({q + "attn.W_O": (h, dh, d), q + "attn.b_O": (d,)})
        if mlp:
            shapes.update(
                {q + "mlp.W_in": (d, dm), q + "mlp.b_in": (dm,), q + "mlp.W_out": (dm, d), q + "mlp.b_out": (d,)}
            )
    shapes.update({f"ln_final.{p}": (d,) for p in ("w", "b") if ln})
    return shapes | {"unembed.W_U": (d, cfg.d_vocab), "unembed.b_U": (cfg.d_vocab,)}
